#!/bin/sh
# The logits' error of llama.cpp and of moex's int8-dot mode on the same
# GGUF files, each against moex's exact mode (fp32 products of the
# dequantized weights, f32 KV cache: within 1e-4 of the float64 references
# on every golden case, so it stands in for them on files too large for a
# float64 pass): a P-token prompt of random ids, every position's logits,
# the relative error ‖X − exact‖₂ / ‖exact‖₂ and the positions whose argmax
# agrees. llama.cpp runs at the comparison's settings (f16 KV cache, flash
# attention), moex's int8-dot mode with an f16 KV cache (as
# compare-llamacpp.sh runs them) and with a bf16 one.
#
#     scripts/error-llamacpp.sh [-p 32] [-t 2] F.gguf...
set -eu
P=32 T=2
while getopts p:t: o; do
	case $o in
	p) P=$OPTARG ;; t) T=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-p 32] [-t 2] F.gguf..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
. "$here/llamacpp/prepare.sh" # llama.cpp installed, moex set
for f in "$@"; do
	d=$(mktemp -d)
	node "$here/llamacpp/bench.mjs" logits "$f" "$P" "$T" 1 "$d" >/dev/null
	"$moex" exec logits --model "$f" --input-ids "$d/ids.npy" --out "$d/exact.npy"
	"$moex" exec logits --model "$f" --input-ids "$d/ids.npy" --out "$d/int8dot-kv-f16.npy" --numerics int8dot --kv f16
	"$moex" exec logits --model "$f" --input-ids "$d/ids.npy" --out "$d/int8dot-kv-bf16.npy" --numerics int8dot --kv bf16
	echo "$f"
	node "$here/llamacpp/bench.mjs" relerr "$d/exact.npy" "$d/llama.npy" "$d/int8dot-kv-f16.npy" "$d/int8dot-kv-bf16.npy"
	rm -rf "$d"
done
