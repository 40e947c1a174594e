#!/bin/sh
# Installs the pinned npm package whose chat templates chat/'s reference
# tests render (package-lock.json: @huggingface/ollama-utils, Mixtral's and
# 100-odd GGUF models' templates) into scripts/chatref/node_modules with
# `npm ci`. Idempotent: does nothing when node_modules already matches the
# lock. Installs Debian's nodejs and npm with apt-get only when npm is
# missing. Quiet on success; prints the log on failure.
#
#     scripts/chatref/install.sh
#     MOEX_REQUIRE_CHATREF=1 go test ./chat/     # fail, not skip, without it
#     python3 scripts/chatref/render.py          # regenerate testdata/chat/*.jsonl
set -eu

dir=$(cd "$(dirname "$0")" && pwd)
stamp="$dir/node_modules/.moex-chatref-lock.sha256"
log=$(mktemp "${TMPDIR:-/tmp}/chatref-install.XXXXXX")
trap 'rm -f "$log"' EXIT

quiet() {
	if ! "$@" >"$log" 2>&1; then
		cat "$log" >&2
		echo "install.sh: failed: $*" >&2
		exit 1
	fi
}

want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
	[ -f "$dir/node_modules/@huggingface/ollama-utils/src/chat-template-automap.ts" ]; then
	exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
	if [ "$(id -u)" -eq 0 ]; then
		sudo=""
	elif command -v sudo >/dev/null 2>&1; then
		sudo="sudo"
	else
		echo "install.sh: npm is missing and apt-get needs root" >&2
		exit 1
	fi
	quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get update
	quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm
fi

cd "$dir"
quiet npm ci --ignore-scripts --no-audit --no-fund
echo "$want" >"$stamp"
