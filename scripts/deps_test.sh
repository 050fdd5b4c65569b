#!/usr/bin/env bash
# scripts/deps_test.sh: the decisions of scripts/deps.sh, on a machine that
# has every package (run scripts/deps.sh first). Needs root: it runs the
# script as root (nothing to do) and as nobody with needs treated as missing
# (PASEO_DEPS_MISSING), which must print the exact install line and fail, or
# succeed with --warn. No package is installed or removed.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "deps_test: run as root (it runs deps.sh as root and as nobody)" >&2; exit 1; }
fails=0
out=$(mktemp)
# nobody runs a copy (the script and the go.mod it reads): the checkout may
# be where nobody cannot enter (under /root).
copy=$(mktemp -d)
trap 'rm -f "$out"; rm -rf "$copy"' EXIT
mkdir "$copy/scripts"
cp scripts/deps.sh "$copy/scripts/"
cp go.mod "$copy/"
chmod -R a+rX "$copy"

# expect WANT_RC WANT_LINE_OR_EMPTY CMD...: run CMD, check its exit code and
# that stderr has WANT_LINE as a whole line.
expect() {
	local want_rc=$1 want_line=$2 rc=0
	shift 2
	"$@" 2>"$out" || rc=$?
	if [[ $rc != "$want_rc" ]]; then
		echo "FAIL: $* exited $rc, want $want_rc" >&2
		sed 's/^/  | /' "$out" >&2
		fails=$((fails + 1))
		return
	fi
	if [[ -n $want_line ]] && ! grep -qxF -- "$want_line" "$out"; then
		echo "FAIL: $* did not print: $want_line" >&2
		sed 's/^/  | /' "$out" >&2
		fails=$((fails + 1))
		return
	fi
	echo "ok: $*" >&2
}
nobody() {
	(cd "$copy" && setpriv --reuid=65534 --regid=65534 --clear-groups env -i PATH="$PATH" HOME=/tmp "$@")
}
install_line() {
	echo "  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $*"
}

expect 0 "deps: every package is installed" scripts/deps.sh
expect 0 "deps: every package is installed" nobody scripts/deps.sh
expect 1 "$(install_line erofs-utils qemu-user-static)" nobody PASEO_DEPS_MISSING="qemu-aarch64-static mkfs.erofs" scripts/deps.sh
# file(1) is how a static busybox is told apart: without it, both go in.
expect 1 "$(install_line file busybox-static)" nobody PASEO_DEPS_MISSING=file scripts/deps.sh
# Two needs of one package name it once.
expect 1 "$(install_line util-linux ca-certificates)" nobody PASEO_DEPS_MISSING="ca-certs findmnt unshare" scripts/deps.sh
expect 0 "$(install_line debootstrap)" nobody PASEO_DEPS_MISSING=debootstrap scripts/deps.sh --warn
# No Go on PATH fails even with --warn: nothing builds without it.
expect 1 "deps: Go $(awk '$1 == "go" { print $2; exit }' go.mod) or newer is not on PATH (go.mod's go line); install it, e.g. under /usr/local/go, and add its bin to PATH" nobody env PATH=/usr/bin:/bin scripts/deps.sh --warn
expect 2 "usage: scripts/deps.sh [--warn]" scripts/deps.sh --bogus

((fails == 0)) || { echo "deps_test: $fails failure(s)" >&2; exit 1; }
echo "deps_test: pass" >&2
