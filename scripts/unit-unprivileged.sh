#!/usr/bin/env bash
# scripts/unit-unprivileged.sh: the unit tests once as an unprivileged user
# (nobody), as a developer without root runs `go test ./...`. Every test that
# needs root must skip there through internal/testkit/skip, never fail; this
# run is how `make test` (root, as CI) sees a root-only test that forgot to.
# Go builds the test binaries as root (its caches stay root's); each binary
# runs as nobody (`go test -exec`) in a copy of the tracked files, since the
# checkout may be where nobody cannot enter (under /root). No -race: the
# race run is `make unit`; this one is about privileges.
# Every package, not a fast subset: root-only tests live in slow packages
# too (policy/compiler, internal/testkit/gitplant, the launcher), and a
# subset chosen by speed would leave out exactly where one could hide; a
# new package is covered without a change here. Cost (2026-12-03, a shared
# 2-core machine at load 11-14, indicative): 8.5 min wall, 4.7 CPU-minutes,
# the non-race build of every test binary included.
set -euo pipefail
# go test -exec runs this script (as root) with the test binary, which
# sits in go's 0700 build dir: a copy nobody can run goes beside the tree.
if [[ ${1:-} == --as-nobody ]]; then
	shift
	bin=$(mktemp -p "$PASEO_UNPRIV_DIR/.bin")
	cp "$1" "$bin"
	chmod 755 "$bin"
	shift
	exec setpriv --reuid=65534 --regid=65534 --clear-groups \
		env HOME="$PASEO_UNPRIV_DIR/.home" TMPDIR="$PASEO_UNPRIV_DIR/.tmp" "$bin" "$@"
fi
cd "$(dirname "$0")/.."
[[ $(id -u) == 0 ]] || { echo "unit-unprivileged: run as root (it runs the tests as nobody)" >&2; exit 1; }
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$copy"
mkdir -p "$copy/.home" "$copy/.tmp"
chmod -R a+rX "$copy"
chown 65534:65534 "$copy/.home" "$copy/.tmp"
mkdir -p "$copy/.bin"
chmod 755 "$copy/.bin"
self=$(realpath "$0")
cd "$copy"
env -u PASEO_NO_SKIP PASEO_UNPRIV_DIR="$copy" go test -count=1 -exec "$self --as-nobody" ./...
