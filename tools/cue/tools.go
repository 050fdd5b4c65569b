//go:build tools

// Package tools pins the cue CLI that scripts/bench.sh times against
// `paseo-policy compile`. It is the same cuelang.org/go version the main
// module links, so the comparison is evaluator against evaluator. Build it
// with:
//
//	cd tools/cue && go build -o ../../bin/cue cuelang.org/go/cmd/cue
//
// The blank import makes go.sum record the checksums of everything the
// command links.
package tools

import _ "cuelang.org/go/cmd/cue"
