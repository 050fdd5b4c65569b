// Package schema holds the CUE contracts for facts, registry and profiles,
// embedded in the binary, and the one place that turns CUE or JSON input
// into checked Go values.
package schema

import "embed"

//go:embed *.cue
var files embed.FS
