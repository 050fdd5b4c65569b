//go:build tools

// Package tools pins the gVisor module that provides runsc. The blank import
// makes go.sum record the checksums of everything runsc needs, so build.sh
// builds the same runsc from the same sources every time.
package tools

import _ "gvisor.dev/gvisor/runsc"
