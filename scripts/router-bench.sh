#!/bin/bash
# router-bench.sh POLICY [moex bench serve flags...]
#
# Four `moex serve --preset tiny` workers on ports 31001-31004, `moex route`
# with POLICY on 31000 (ROUTER_ARGS: more route flags), one `moex bench
# serve` run through it, then the router's decision counts; everything is
# stopped at the end. MOEX is the binary (default ./moex, from `make`).
# The issue-16 figures came from, e.g.:
#   scripts/router-bench.sh cache_aware --groups 16 --prompts-per-group 8 --system-len 1024 --question-len 64 --output-len 32
#   scripts/router-bench.sh round_robin  --groups 16 --prompts-per-group 8 --system-len 1024 --question-len 64 --output-len 32
set -u
M=${MOEX:-./moex}
P=${1:?usage: router-bench.sh POLICY [bench serve flags...]}
shift
pids=()
trap 'kill ${pids[@]} 2>/dev/null; wait 2>/dev/null' EXIT
for i in 1 2 3 4; do
	"$M" serve --preset tiny --port 3100$i >/dev/null 2>&1 &
	pids+=($!)
done
log=$(mktemp)
"$M" route --worker http://127.0.0.1:31001 --worker http://127.0.0.1:31002 --worker http://127.0.0.1:31003 \
	--worker http://127.0.0.1:31004 --policy "$P" --port 31000 ${ROUTER_ARGS:-} >"$log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "on http" "$log" && break; sleep 0.2; done
grep -q "on http" "$log" || { cat "$log"; exit 1; }
"$M" bench serve --url http://127.0.0.1:31000 "$@"
curl -s localhost:31000/metrics | grep -E "^moex_router_decisions_total"
rm -f "$log"
