# Sourced by compare-llamacpp.sh and error-llamacpp.sh, with here set to
# scripts/: installs the pinned llama.cpp build (install.sh) and sets moex
# to $MOEX, or to a moex built from this checkout into a temporary folder.
"$here/llamacpp/install.sh"
moex=${MOEX:-}
if [ -z "$moex" ]; then
	moex=$(mktemp -d)/moex
	(cd "$here/.." && go build -o "$moex" ./cmd/moex)
fi
