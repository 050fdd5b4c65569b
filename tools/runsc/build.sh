#!/usr/bin/env bash
# Build the pinned runsc (gVisor) as a static binary.
#
#   tools/runsc/build.sh [OUTPUT]        default OUTPUT: <repo>/bin/runsc
#
# The gVisor version is pinned in tools/runsc/go.mod and its checksums in
# tools/runsc/go.sum (tools.go imports gvisor.dev/gvisor/runsc so go.sum
# covers everything runsc links). The build is CGO_ENABLED=0 and -trimpath,
# so the result is a static ELF that does not depend on the build directory.
#
# After a build, "<sha256>  runsc" is written to <outdir>/runsc.sha256 and the
# digest is printed on stdout (build chatter goes to stderr). The launcher
# preflight compares the binary against that file.
#
# Idempotent: when OUTPUT exists, its sha256 matches runsc.sha256, and
# `OUTPUT --version` runs and reports the pinned version, nothing is rebuilt
# and the recorded digest is printed again.
#
# GOARCH set to another architecture (GOARCH=arm64) cross-builds: the binary
# cannot run here, so instead of `--version` the ELF header must name that
# architecture (file), and the up-to-date check trusts the digest alone.
#
# A build says what it is doing on stderr (scripts/progress.sh): the module
# download, then the compile with a count of packages, then the checks, each
# with its step number and the seconds since the start.
set -euo pipefail

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
repo_dir=$(cd -- "$script_dir/../.." && pwd -P)
# shellcheck source=../../scripts/progress.sh
. "$repo_dir/scripts/progress.sh"
# shellcheck source=../gobuild.sh
. "$repo_dir/tools/gobuild.sh"

gobuild_output "${1:-$repo_dir/bin/runsc}"
gobuild_env

cd -- "$script_dir"

version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
goarch=$(go env GOARCH)
cross=
if [[ $goarch != "$(go env GOHOSTARCH)" ]]; then
	cross=$goarch
	command -v file >/dev/null 2>&1 || {
		echo "a cross build of runsc for $goarch needs the file tool to check the result" >&2
		exit 1
	}
fi
# What file(1) says of an ELF for each architecture this project supports.
case $goarch in
amd64) elf_arch="x86-64" ;;
arm64) elf_arch="ARM aarch64" ;;
*)
	echo "runsc is built for amd64 and arm64 only, not $goarch" >&2
	exit 1
	;;
esac
want_version_line="runsc version $version"

# up_to_date succeeds when the existing binary is the one the digest file
# records and it runs and reports the pinned version.
up_to_date() {
	gobuild_recorded "$out" || return 1
	[[ -z $cross ]] || return 0
	local first
	first=$("$out" --version 2>/dev/null | sed -n 1p) || return 1
	[[ $first == "$want_version_line" ]] || return 1
	return 0
}

if up_to_date; then
	echo "runsc $version is up to date at $out" >&2
	awk 'NR==1 {print $1}' "$digest_file"
	exit 0
fi

echo "building runsc $version for linux/$goarch -> $out" >&2
progress_init runsc 3

tmp=$(mktemp -- "$out_dir/.$out_name.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT

# The modules runsc needs, from the Go proxy this machine is configured for
# (a no-op when the module cache has them).
progress_run "downloading the modules runsc needs ($(go list -m all | wc -l) in its module graph)" -- go mod download

# go build -v names each package it compiles: counted against the packages
# runsc links, so the count says how far along the compile is.
packages=$(go list -deps gvisor.dev/gvisor/runsc | wc -l)
build_runsc() {
	{ go build -v -trimpath \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$version" \
		-o "$tmp" gvisor.dev/gvisor/runsc 2>&1 >&3 | progress_count "$packages" "packages compiled"; } 3>&1
}
progress_run "compiling runsc ($packages packages; a few minutes on a cold cache)" -- build_runsc

progress_step "checking the binary (runs, static, $goarch)"
# Refuse anything that is not what the launcher will accept.
if [[ -z $cross ]] && ! "$tmp" --version >/dev/null 2>&1; then
	echo "built runsc does not run --version" >&2
	exit 1
fi
gobuild_static "$tmp" runsc
if command -v file >/dev/null 2>&1; then
	desc=$(file -b -- "$tmp")
	case $desc in
	*"$elf_arch"*) ;;
	*)
		echo "built runsc is not a $goarch ELF: $desc" >&2
		exit 1
		;;
	esac
fi

digest=$(gobuild_install "$tmp" "$out")
trap - EXIT

progress_done "runsc $version at $out"
echo "$digest"
