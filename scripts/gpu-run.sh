#!/usr/bin/env bash
# Runs on a GPU host (no Go needed) from the folder `make gpu-bundle` makes:
# the CUDA kernels' tests against the CPU paths, moex run with the experts
# on the GPU against the CPU path, and the device's copy
# bandwidth and dense bf16 GEMM rate through PyTorch when it is there.
# Writes results.txt beside itself.
set -uo pipefail
cd "$(dirname "$0")"
{
  echo "# moex GPU results, $(date -u)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  echo "## kernel tests"
  ./cuda.test -test.v 2>&1
  echo "## moex run --backend cuda (in-process ranks sharing GPU 0)"
  ./moex run --backend cuda --ranks 1 --steps 4 2>&1
  ./moex run --backend cuda --ranks 4 --steps 8 2>&1
  ./moex run --backend cuda --ranks 4 --steps 8 --moe-mode gather 2>&1
  echo "## moex bench moe --backend cuda (eager launches and CUDA-graph replays, host copies included)"
  ./moex bench moe --backend cuda --preset deepseek-v2-lite --tokens 1,16,64,256 2>&1
  echo "## device baselines (PyTorch)"
  python3 - <<'PY' 2>&1 || echo "no PyTorch: baselines skipped"
import torch, time
d = torch.device("cuda")
x = torch.empty(1 << 30, dtype=torch.uint8, device=d); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): y.copy_(x)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"copy bandwidth (read+write): {2 * x.numel() / dt / 1e9:.0f} GB/s")
a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=d); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(10): a @ b
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
print(f"dense bf16 GEMM 8192^3: {2 * 8192**3 / dt / 1e12:.0f} TFLOP/s")
PY
} > results.txt
cat results.txt
