#!/bin/sh
# Installs llama.cpp's prebuilt CPU libraries (node-llama-cpp and its
# linux-x64 binaries, pinned by package-lock.json; the GPU builds, optional
# dependencies, are left out) into scripts/llamacpp/node_modules. Idempotent.
#
#     scripts/llamacpp/install.sh
#     node scripts/llamacpp/bench.mjs bench F.gguf 512 128 2 1
set -eu
here=$(dirname "$0")
exec "$here/../npm-pinned.sh" "$here" --ignore-scripts --omit=optional --no-ci node-llama-cpp/package.json @node-llama-cpp/linux-x64/package.json
