# shellcheck shell=bash
# What the pinned Go builds share (sourced by tools/runsc/build.sh,
# tools/runsc/build-shim.sh and tools/containerd/build.sh): where a binary
# goes, the build environment, the digest beside it, and the checks that it
# is the static binary the tests and the launcher accept.

# gobuild_env: build only from the calling module, never from a workspace
# or the vendor tree of whatever directory the caller is in; -mod=readonly:
# go.mod and go.sum must already pin everything (a missing checksum is an
# error, not a silent download of something new); static, no cgo.
gobuild_env() {
	export GOWORK=off
	export GOFLAGS="-mod=readonly -buildvcs=false"
	export CGO_ENABLED=0
}

# gobuild_output PATH: sets out (PATH made absolute, its directory
# created), out_dir, out_name and digest_file (PATH.sha256).
gobuild_output() {
	out_dir=$(dirname -- "$1")
	mkdir -p -- "$out_dir"
	out_dir=$(cd -- "$out_dir" && pwd -P)
	out_name=$(basename -- "$1")
	out=$out_dir/$out_name
	digest_file=$out.sha256
}

# gobuild_recorded BIN: BIN exists, is executable and is the binary its
# BIN.sha256 records.
gobuild_recorded() {
	[[ -f $1 && -x $1 && -f $1.sha256 ]] || return 1
	local recorded actual
	recorded=$(awk 'NR==1 {print $1}' "$1.sha256")
	actual=$(sha256sum -- "$1" | awk '{print $1}')
	[[ -n $recorded && $recorded == "$actual" ]]
}

# gobuild_static BIN NAME: fails unless file(1) says BIN is statically
# linked (where the file tool is missing there is nothing to ask).
gobuild_static() {
	command -v file >/dev/null 2>&1 || return 0
	case $(file -b -- "$1") in
	*"statically linked"* | *"static-pie linked"*) ;;
	*)
		echo "built $2 is not statically linked: $(file -b -- "$1")" >&2
		return 1
		;;
	esac
}

# gobuild_install TMP BIN: TMP becomes BIN (mode 0755), "<sha256>  NAME"
# goes to BIN.sha256, each by a rename; prints the digest.
gobuild_install() {
	local digest
	chmod 0755 "$1"
	digest=$(sha256sum -- "$1" | awk '{print $1}')
	mv -f -- "$1" "$2"
	printf '%s  %s\n' "$digest" "$(basename -- "$2")" >"$2.sha256.tmp"
	mv -f -- "$2.sha256.tmp" "$2.sha256"
	echo "$digest"
}
