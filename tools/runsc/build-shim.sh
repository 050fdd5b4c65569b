#!/usr/bin/env bash
# Build containerd-shim-runsc-v1, gVisor's containerd shim, from the same
# pinned gVisor module as runsc (tools/runsc/go.mod), as a static binary.
#
#   tools/runsc/build-shim.sh [OUTPUT]   default OUTPUT: <repo>/bin/containerd-shim-runsc-v1
#
# The shim is what a Kubernetes node's containerd starts for a pod of the
# gvisor RuntimeClass (docs/kubernetes.md); it runs the runsc its options
# name, so one gVisor version serves the launcher and the node. tools.go
# imports gvisor.dev/gvisor/shim, so go.sum covers everything it links.
#
# Like build.sh: -mod=readonly (go.sum must already pin everything), static
# (CGO_ENABLED=0, -trimpath), "<sha256>  NAME" in OUTPUT.sha256, the digest on
# stdout, and nothing rebuilt when OUTPUT matches its recorded digest and its
# build info (go version -m) names the pinned gVisor module. The shim's own -v
# prints containerd's library version, not gVisor's, so the build info is the
# one record of which gVisor it is.
set -euo pipefail

script_dir=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
repo_dir=$(cd -- "$script_dir/../.." && pwd -P)
# shellcheck source=../../scripts/progress.sh
. "$repo_dir/scripts/progress.sh"
# shellcheck source=../gobuild.sh
. "$repo_dir/tools/gobuild.sh"

gobuild_output "${1:-$repo_dir/bin/containerd-shim-runsc-v1}"
gobuild_env

cd -- "$script_dir"

version=$(go list -m -f '{{.Version}}' gvisor.dev/gvisor)
if [[ $(go env GOARCH) != "$(go env GOHOSTARCH)" ]]; then
	echo "the shim is built for this host's architecture only (the node runtime test runs it)" >&2
	exit 1
fi

# pinned FILE: the binary's build info names gvisor.dev/gvisor at $version.
pinned() {
	go version -m "$1" 2>/dev/null | awk -v v="$version" '$2 == "gvisor.dev/gvisor" && $3 == v { ok = 1 } END { exit !ok }'
}

if gobuild_recorded "$out" && pinned "$out"; then
	echo "containerd-shim-runsc-v1 $version is up to date at $out" >&2
	awk 'NR==1 {print $1}' "$digest_file"
	exit 0
fi

echo "building containerd-shim-runsc-v1 $version -> $out" >&2
progress_init shim 3

tmp=$(mktemp -- "$out_dir/.$out_name.XXXXXX")
trap 'rm -f -- "$tmp"' EXIT

progress_run "downloading the modules the shim needs" -- go mod download

packages=$(go list -deps gvisor.dev/gvisor/shim | wc -l)
build_shim() {
	{ go build -v -trimpath -o "$tmp" gvisor.dev/gvisor/shim 2>&1 >&3 | progress_count "$packages" "packages compiled"; } 3>&1
}
progress_run "compiling the shim ($packages packages)" -- build_shim

progress_step "checking the binary (runs, static)"
if ! pinned "$tmp"; then
	echo "built shim's build info does not name gvisor.dev/gvisor $version" >&2
	exit 1
fi
if ! "$tmp" -v >/dev/null 2>&1; then
	echo "built shim does not run -v" >&2
	exit 1
fi
gobuild_static "$tmp" shim
digest=$(gobuild_install "$tmp" "$out")
trap - EXIT

progress_done "containerd-shim-runsc-v1 $version at $out"
echo "$digest"
