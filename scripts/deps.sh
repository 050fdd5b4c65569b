#!/usr/bin/env bash
# scripts/deps.sh [--warn]: the host packages `make test` and `make demo` need.
#
# Checks each need (a command on PATH, a static /bin/busybox, the CA bundle);
# when some are missing, as root it installs their Debian packages through
# this machine's apt configuration (apt-get update, then a noninteractive
# install) and checks again; without root it prints the one apt-get line that
# would install them and fails. With --warn (make demo, whose compile-and-
# explain part needs none of these) a non-root run prints the same line and
# succeeds.
#
# Go is not a Debian package here (go.mod wants a newer one than the
# distribution ships): it must already be on PATH, root or not.
#
# PASEO_DEPS_MISSING="name ..." treats those needs (the names in the first
# column below) as missing, so the decisions can be tested on a machine that
# has everything (scripts/deps_test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# debootstrap and chroot live in sbin, which a non-root PATH often lacks.
PATH=$PATH:/usr/sbin:/sbin

warn_only=
case ${1:-} in
--warn) warn_only=1 ;;
"") ;;
*)
	echo "usage: scripts/deps.sh [--warn]" >&2
	exit 2
	;;
esac

# need package why: the check name (a command, unless have() knows it), the
# Debian package that provides it, and who uses it.
needs=(
	"file file the runsc build checks static linking; the launcher tests check busybox"
	"busybox busybox-static a static /bin/busybox is the launcher tests' rootfs"
	"git git the Git worktree tests (compiler, e2e) build real repositories"
	"debootstrap debootstrap make image: the Debian rootfs"
	"mkfs.erofs erofs-utils make image and TestLaunchErofs: EROFS files"
	"npm npm make image: Node and Pi; the MCP stand-in tests: npm ci of test/mcpstandin"
	"node nodejs make image: checks Node's integrity and runs Pi to seed its cache; runs the MCP stand-in (test/mcpstandin)"
	"qemu-aarch64-static qemu-user-static make cross: the arm64 tests under qemu-user"
	"unshare util-linux make image: a private mount namespace; the tests' namespaces"
	"findmnt util-linux make image: unmounts what a failed build left"
	"ca-certs ca-certificates the Go module, apt and npm downloads over TLS"
	"cni-plugins containernetworking-plugins make kubernetes: the node runtime test's pod networking (CNI bridge and host-local)"
)

simulated_missing() {
	local n
	for n in ${PASEO_DEPS_MISSING:-}; do
		[[ $n == "$1" ]] && return 0
	done
	return 1
}

# have NAME [real]: is the need met? With "real", ignore PASEO_DEPS_MISSING
# (the check after an install).
have() {
	[[ ${2:-} == real ]] || ! simulated_missing "$1" || return 1
	case $1 in
	busybox)
		# Static: the launcher tests run it in a rootfs with no libc.
		# Without file(1) it cannot be told, so it counts as missing.
		[[ -x /bin/busybox ]] && have file "${2:-}" &&
			file -L -b /bin/busybox | grep -qE 'statically linked|static-pie linked'
		;;
	ca-certs) [[ -s /etc/ssl/certs/ca-certificates.crt ]] ;;
	cni-plugins) [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] ;;
	*) command -v "$1" >/dev/null 2>&1 ;;
	esac
}

# missing_packages [real]: the packages of every unmet need, each once, in
# the table's order.
missing_packages() {
	local line name pkg seen=" "
	for line in "${needs[@]}"; do
		read -r name pkg _ <<<"$line"
		have "$name" "${1:-}" && continue
		[[ $seen == *" $pkg "* ]] && continue
		seen+="$pkg "
		printf '%s\n' "$pkg"
	done
}

explain_missing() {
	local line name pkg why
	for line in "${needs[@]}"; do
		read -r name pkg why <<<"$line"
		have "$name" "${1:-}" || echo "deps: missing $name ($pkg): $why" >&2
	done
}

check_go() {
	local want got
	want=$(awk '$1 == "go" { print $2; exit }' go.mod)
	if ! got=$(go env GOVERSION 2>/dev/null); then
		echo "deps: Go $want or newer is not on PATH (go.mod's go line); install it, e.g. under /usr/local/go, and add its bin to PATH" >&2
		return 1
	fi
	got=${got#go}
	if [[ $(printf '%s\n%s\n' "$want" "$got" | sort -V | head -n1) != "$want" ]]; then
		echo "deps: go.mod needs Go $want or newer; PATH has $got" >&2
		return 1
	fi
}

go_ok=1
check_go || go_ok=

mapfile -t pkgs < <(missing_packages)
if ((${#pkgs[@]} == 0)); then
	[[ -n $go_ok ]] || exit 1
	echo "deps: every package is installed" >&2
	exit 0
fi

explain_missing
if [[ $(id -u) != 0 ]]; then
	echo "deps: as root, install them with:" >&2
	echo "  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${pkgs[*]}" >&2
	if [[ -n $warn_only ]]; then
		echo "deps: continuing without them (the parts that need root and these packages will say so)" >&2
		[[ -n $go_ok ]] || exit 1
		exit 0
	fi
	exit 1
fi

echo "deps: installing ${pkgs[*]} (apt, this machine's sources)" >&2
start=$SECONDS
apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >&2
mapfile -t still < <(missing_packages real)
if ((${#still[@]} > 0)); then
	explain_missing real
	echo "deps: still missing after the install: ${still[*]}" >&2
	exit 1
fi
echo "deps: installed in $((SECONDS - start))s" >&2
[[ -n $go_ok ]] || exit 1
