//go:build tools

// Package tools pins the gVisor module that provides runsc and its
// containerd shim. The blank imports make go.sum record the checksums of
// everything runsc and containerd-shim-runsc-v1 need, so build.sh and
// build-shim.sh build the same binaries from the same sources every time.
package tools

import (
	_ "gvisor.dev/gvisor/runsc"
	_ "gvisor.dev/gvisor/shim"
)
