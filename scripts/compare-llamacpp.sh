#!/bin/sh
# moex against llama.cpp on the same GGUF files, the same threads, rounds
# interleaved (llama.cpp, then moex, per round): pp (P prompt tokens from an
# empty cache) and tg (N single-token steps right after it), the median of
# the rounds and the ratio moex/llama.cpp. llama.cpp is the prebuilt CPU
# build inside the npm package node-llama-cpp (pinned in scripts/llamacpp),
# at its defaults (f16 KV cache, flash attention, batch 512); moex runs
# `moex bench model` with MOEX_FLAGS (default: the exact numerics; an f16 KV
# cache as llama.cpp's, unless the flags name one with --kv).
#
#     scripts/compare-llamacpp.sh [-p 512] [-n 128] [-t 2] [-r 3] [-b 1] F.gguf...
#
# -b B decodes B sequences together, each after a prompt of its own: pp is
# their prompts', tg their steps' of one token each, the rates those of all
# B (llama-batched-bench's S_PP and S_TG; moex's `bench model --batch`).
#
# Files to compare: `moex gguf write --preset qwen3-30b-a3b --layers 8
# --type q4_k_m --out q3.gguf` (and gpt-oss-20b with mxfp4, q8_0 ...).
set -eu
P=512 N=128 T=2 R=3 B=1
while getopts p:n:t:r:b: o; do
	case $o in
	p) P=$OPTARG ;; n) N=$OPTARG ;; t) T=$OPTARG ;; r) R=$OPTARG ;; b) B=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-p 512] [-n 128] [-t 2] [-r 3] [-b 1] F.gguf..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
. "$here/llamacpp/prepare.sh" # llama.cpp installed, moex set
out=$(mktemp)
for f in "$@"; do
	r=1
	while [ "$r" -le "$R" ]; do
		node "$here/llamacpp/bench.mjs" bench "$f" "$P" "$N" "$T" "$r" "$B" | sed "s|^|$f\t|" >>"$out"
		# shellcheck disable=SC2086
		"$moex" bench model --model "$f" -p "$P" -n "$N" --threads "$T" --rounds 1 --seed "$r" --batch "$B" --format json --kv f16 ${MOEX_FLAGS:-} |
			sed "s|^|$f\t|" >>"$out"
		echo "compare: $f round $r of $R" >&2
		r=$((r + 1))
	done
done
node - "$out" <<'EOF'
const fs = require("fs");
const rows = fs.readFileSync(process.argv[2], "utf8").trim().split("\n").map((l) => {
  const i = l.indexOf("\t");
  return {file: l.slice(0, i), ...JSON.parse(l.slice(i + 1))};
});
const med = (v) => { v = [...v].sort((a, b) => a - b); return v.length % 2 ? v[v.length >> 1] : (v[v.length / 2 - 1] + v[v.length / 2]) / 2; };
const files = [...new Set(rows.map((r) => r.file))];
console.log("file\tllama.cpp pp\tmoex pp\tpp ratio\tllama.cpp tg\tmoex tg\ttg ratio\tmoex tg of membw\tllama.cpp build\tmoex mode");
for (const f of files) {
  const l = rows.filter((r) => r.file === f && r.engine === "llama.cpp");
  const m = rows.filter((r) => r.file === f && !r.engine);
  const lpp = med(l.map((r) => r.pp_tokens_s)), ltg = med(l.map((r) => r.tg_tokens_s));
  const mpp = med(m.filter((r) => r.case.startsWith("pp")).map((r) => r.tokens_per_s));
  const mtgr = m.filter((r) => r.case.startsWith("tg"));
  const mtg = med(mtgr.map((r) => r.tokens_per_s)), frac = med(mtgr.map((r) => r.bw_fraction));
  console.log([f.split("/").pop(), lpp.toFixed(1), mpp.toFixed(1), (mpp / lpp).toFixed(2), ltg.toFixed(1), mtg.toFixed(1),
    (mtg / ltg).toFixed(2), frac ? (100 * frac).toFixed(0) + "%" : "–", l[0].variant, `${mtgr[0].numerics}, kv ${mtgr[0].kv}`].join("\t"));
}
// Each round's tg ratio (llama.cpp's round r against moex's): this VM's
// bandwidth drifts, and the median hides how far.
for (const f of files) {
  const l = rows.filter((r) => r.file === f && r.engine === "llama.cpp").map((r) => r.tg_tokens_s);
  const m = rows.filter((r) => r.file === f && !r.engine && r.case.startsWith("tg")).map((r) => r.tokens_per_s);
  console.log(`${f.split("/").pop()}: tg by round, llama.cpp → moex: ${l.map((x, i) => `${x.toFixed(1)} → ${m[i].toFixed(1)} (${(m[i] / x).toFixed(2)})`).join(", ")}`);
}
const l0 = rows.filter((r) => r.engine === "llama.cpp");
console.log(`median of ${l0.length / files.length} interleaved rounds a file; pp${l0[0].pp_tokens} tg${l0[0].tg_tokens}, ${l0[0].threads} threads, ${l0[0].batch} sequence(s) at a time`);
EOF
rm -f "$out"
