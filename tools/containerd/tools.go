//go:build tools

// Package tools pins the containerd the node runtime test runs: the
// release whose shim library the pinned gVisor's containerd-shim-runsc-v1
// links (tools/runsc/go.mod), so the daemon reads that shim's bootstrap.
// The blank imports make go.sum cover everything containerd and ctr link.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
