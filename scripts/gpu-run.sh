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
  # NCCL usually comes with PyTorch's wheels: put its folder on the search path.
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null || true)
  [ -n "$nccl_dir" ] && export LD_LIBRARY_PATH="$nccl_dir:${LD_LIBRARY_PATH:-}"
  # The runtime's kernels, the MoE pipeline, DP attention's device steps.
  for t in cuda moegpu dpattngpu; do
    echo "## $t tests"
    if ! ./$t.test -test.v 2>&1; then
      # Launches do not wait for the GPU: rerun with every launch waiting, to
      # tell a kernel's own failure from an ordering one.
      echo "## $t tests again, CUDA_LAUNCH_BLOCKING=1"
      CUDA_LAUNCH_BLOCKING=1 ./$t.test -test.v 2>&1
    fi
  done
  echo "## moex run --backend cuda (in-process ranks sharing GPU 0)"
  ./moex run --backend cuda --ranks 1 --steps 4 2>&1
  ./moex run --backend cuda --ranks 4 --steps 8 2>&1
  ./moex run --backend cuda --ranks 4 --steps 8 --moe-mode gather 2>&1
  ./moex run --backend cuda --ranks 4 --steps 8 --moe-mode gather --fused-layer=false 2>&1
  echo "## moex run --comm nccl (one process per GPU, torchrun's variables)"
  gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
  for world in 1 "$gpus"; do
    [ "$world" -ge 1 ] || continue
    for mode in alltoall gather; do
      echo "### world size $world, MoE mode $mode (gather: the collectives on the device buffers, inside the graphs)"
      pids=()
      for ((r = 0; r < world; r++)); do
        MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 WORLD_SIZE=$world RANK=$r LOCAL_RANK=$r \
          timeout 600 ./moex run --comm nccl --steps 8 --moe-mode $mode --timeout 5m > "rank$r.txt" 2>&1 &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p"; echo "exit status $?"; done
      cat rank0.txt; for ((r = 1; r < world; r++)); do tail -3 "rank$r.txt"; done
    done
    [ "$world" -gt 1 ] || [ "$gpus" -gt 1 ] || break
  done
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
