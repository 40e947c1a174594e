#!/usr/bin/env bash
# Multi-process parity of expert parallelism over MPI: `moex exec moe` under
# mpirun with --ep N --comm mpi must write the same bytes as one rank, and
# `moex run --comm mpi` (one process per rank) must pass its parity check.
# Installs Debian's Open MPI when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

if ! command -v mpirun >/dev/null || ! pkg-config --exists ompi-c 2>/dev/null; then
  echo "mpi-parity: installing openmpi-bin libopenmpi-dev"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq openmpi-bin libopenmpi-dev pkg-config >/dev/null
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$GO vet -tags mpi ./ep/mpi/... ./cmd/...
$GO build -tags mpi -o "$tmp/moex" ./cmd/moex
mpirun=(mpirun --oversubscribe --allow-run-as-root)

checked=0
for case in deepseek_v3_f32 qwen2_moe_bf16 mixtral_bf16_sharded deepseek_v2_bf16_glg; do
  dir=testdata/moe/$case
  layer=$(cat "$dir/layer")
  "$tmp/moex" exec moe --model "$dir" --layer "$layer" --input "$dir/x.npy" \
    --out "$tmp/y1.npy" --ids-out "$tmp/i1.npy" --weights-out "$tmp/w1.npy"
  for np in 4 3; do
    for placement in contiguous round-robin balanced; do
      timeout 300 "${mpirun[@]}" -np "$np" "$tmp/moex" exec moe --model "$dir" --layer "$layer" --input "$dir/x.npy" \
        --out "$tmp/y.npy" --ids-out "$tmp/i.npy" --weights-out "$tmp/w.npy" \
        --ep "$np" --comm mpi --placement "$placement" --timeout 2m
      for f in y i w; do
        cmp -s "$tmp/${f}1.npy" "$tmp/$f.npy" || { echo "mpi-parity: $case -np $np $placement: $f.npy differs from one rank"; exit 1; }
      done
      checked=$((checked + 1))
    done
  done
done

# The decode run with one process per rank: parity with one rank on rank 0.
for mode in alltoall gather; do
  timeout 300 "${mpirun[@]}" -np 3 "$tmp/moex" run --comm mpi --model testdata/moe/deepseek_v2_f32 --layer 1 \
    --steps 3 --moe-mode "$mode" --timeout 2m >"$tmp/run.txt" 2>&1 || { echo "mpi-parity: run --comm mpi ($mode) failed"; cat "$tmp/run.txt"; exit 1; }
  grep -q "transport mpi" "$tmp/run.txt" && grep -q "parity against one rank.*: ok" "$tmp/run.txt" ||
    { echo "mpi-parity: run --comm mpi ($mode): no parity line"; cat "$tmp/run.txt"; exit 1; }
  checked=$((checked + 1))
done

# --ranks that disagrees with mpirun's process count is a named error.
if timeout 120 "${mpirun[@]}" -np 2 "$tmp/moex" run --comm mpi --ranks 3 --steps 1 --model testdata/moe/deepseek_v2_f32 \
    --layer 1 2>"$tmp/err" >/dev/null; then
  echo "mpi-parity: run --ranks 3 under 2 processes succeeded"; exit 1
fi
grep -q "run: --ranks 3, but 2 ranks were started" "$tmp/err" || { echo "mpi-parity: unexpected error: $(cat "$tmp/err")"; exit 1; }

# A rank count that does not match --ep is an error on every rank, not a hang.
if timeout 120 "${mpirun[@]}" -np 3 "$tmp/moex" exec moe --model testdata/moe/mixtral_f32 --layer 1 \
    --input testdata/moe/mixtral_f32/x.npy --out "$tmp/y.npy" --ep 4 --comm mpi 2>"$tmp/err"; then
  echo "mpi-parity: --ep 4 under 3 ranks succeeded"; exit 1
fi
grep -q "mpirun started 3 ranks" "$tmp/err" || { echo "mpi-parity: unexpected error: $(cat "$tmp/err")"; exit 1; }

echo "mpi-parity: $checked passed, 0 failed"
