#!/usr/bin/env bash
# Installs nvcc from Debian's nvidia-cuda-toolkit (the non-free component)
# when it is missing. Needs root and the Debian package mirror.
set -euo pipefail
if command -v nvcc >/dev/null; then
  exit 0
fi
echo "install-cuda: installing nvidia-cuda-toolkit (Debian non-free)"
. /etc/os-release
cat > /etc/apt/sources.list.d/moex-nonfree.sources <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: ${VERSION_CODENAME} ${VERSION_CODENAME}-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends nvidia-cuda-toolkit >/dev/null
nvcc --version | tail -1
