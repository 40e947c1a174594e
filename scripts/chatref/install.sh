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
here=$(dirname "$0")
exec "$here/../npm-pinned.sh" "$here" --ignore-scripts @huggingface/ollama-utils/src/chat-template-automap.ts
