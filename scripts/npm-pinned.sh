#!/bin/sh
# Installs the npm packages pinned by DIR/package-lock.json into
# DIR/node_modules with `npm ci` (which checks the lock's hashes), unless a
# stamp of the lock and the given files under node_modules show they are
# already there. Installs Debian's nodejs and npm with apt-get only when
# npm is missing. Quiet on success; prints npm's log on failure.
#
#     scripts/npm-pinned.sh DIR [--ignore-scripts] [--omit=optional] [--no-ci] FILE...
set -eu

dir=$(cd "$1" && pwd)
shift
flags=""
cmd=ci
while :; do
	case "${1:-}" in
	--ignore-scripts | --omit=optional) flags="$flags $1" ;;
	# npm ci refuses a lock that lacks optional packages the registry
	# does not serve (other platforms' builds); npm install takes the
	# lock's versions and hashes for the rest.
	--no-ci) cmd="install --no-save" ;;
	*) break ;;
	esac
	shift
done
stamp="$dir/node_modules/.moex-lock.sha256"
log=$(mktemp "${TMPDIR:-/tmp}/npm-pinned.XXXXXX")
trap 'rm -f "$log"' EXIT

quiet() {
	if ! "$@" >"$log" 2>&1; then
		cat "$log" >&2
		echo "npm-pinned.sh: failed: $*" >&2
		exit 1
	fi
}

want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
present=1
for f in "$@"; do
	[ -f "$dir/node_modules/$f" ] || present=0
done
if [ "$present" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
	exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
	if [ "$(id -u)" -eq 0 ]; then
		sudo=""
	elif command -v sudo >/dev/null 2>&1; then
		sudo="sudo"
	else
		echo "npm-pinned.sh: npm is missing and apt-get needs root" >&2
		exit 1
	fi
	quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get update
	quiet $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm
fi

cd "$dir"
quiet npm $cmd $flags --no-audit --no-fund
echo "$want" >"$stamp"
