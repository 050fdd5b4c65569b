#!/usr/bin/env bash
# Build the pinned containerd and ctr (tools/containerd/go.mod) as static
# binaries, for the node runtime test (test/kubernetes, docs/kubernetes.md).
#
#   tools/containerd/build.sh [OUTDIR]    default OUTDIR: <repo>/bin
#
# Why not Debian's: bookworm's containerd 1.6.20 reads a shim's answer to
# `start` as a bare socket address, and the pinned gVisor's
# containerd-shim-runsc-v1 answers with the JSON bootstrap of containerd 2's
# shim library. The release pinned here is the one that library comes from
# (tools/runsc/go.sum), so daemon and shim speak the same protocol.
#
# Like tools/runsc/build.sh: -mod=readonly (go.sum pins everything), static
# (CGO_ENABLED=0, -trimpath; the snapshotters that need cgo are left out),
# "<sha256>  NAME" in OUTDIR/NAME.sha256, and nothing rebuilt while each
# binary matches its recorded digest and its build info names the pin.
set -euo pipefail

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
repo_dir=$(cd -- "$script_dir/../.." && pwd -P)
# shellcheck source=../../scripts/progress.sh
. "$repo_dir/scripts/progress.sh"
# shellcheck source=../gobuild.sh
. "$repo_dir/tools/gobuild.sh"

out_dir=${1:-$repo_dir/bin}
mkdir -p -- "$out_dir"
out_dir=$(cd -- "$out_dir" && pwd -P)

gobuild_env
tags="no_btrfs no_devmapper no_zfs"

cd -- "$script_dir"
module=github.com/containerd/containerd/v2
version=$(go list -m -f '{{.Version}}' "$module")
shim_version=$(cd -- "$script_dir/../runsc" && go list -m -f '{{.Version}}' "$module")
if [[ $shim_version != "$version" ]]; then
	echo "tools/containerd pins $module $version, but the runsc shim links $shim_version (tools/runsc/go.mod): pin the same" >&2
	exit 1
fi

pinned() {
	go version -m "$1" 2>/dev/null | awk -v m="$module" -v v="$version" '($1 == "mod" || $1 == "dep") && $2 == m && $3 == v { ok = 1 } END { exit !ok }'
}

up_to_date() { gobuild_recorded "$out_dir/$1" && pinned "$out_dir/$1"; }

if up_to_date containerd && up_to_date ctr; then
	echo "containerd $version is up to date in $out_dir" >&2
	exit 0
fi

echo "building containerd and ctr $version -> $out_dir" >&2
progress_init containerd 3
progress_run "downloading the modules containerd needs" -- go mod download

packages=$(go list -tags "$tags" -deps "$module/cmd/containerd" "$module/cmd/ctr" | sort -u | wc -l)
build() {
	local name
	for name in containerd ctr; do
		go build -v -trimpath -tags "$tags" -o "$out_dir/.$name.tmp" "$module/cmd/$name"
	done 2>&1 | progress_count "$packages" "packages compiled"
}
progress_run "compiling containerd and ctr ($packages packages; several minutes on a cold cache)" -- build

progress_step "checking the binaries (static, pinned)"
for name in containerd ctr; do
	tmp=$out_dir/.$name.tmp
	pinned "$tmp" || {
		echo "built $name's build info does not name $module $version" >&2
		exit 1
	}
	gobuild_static "$tmp" "$name"
	gobuild_install "$tmp" "$out_dir/$name" >/dev/null
done
progress_done "containerd and ctr $version in $out_dir"
