// Command paseo-policy compiles trusted Paseo launch facts into auditable
// gVisor sandbox bundles. See README.md.
package main

import (
	"os"

	"paseo.dev/paseo-policy/cli"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

func main() {
	cli.QuietLibraryLogs()
	// The supervisor re-executes this binary as each sandbox's holder.
	holder.MaybeRun()
	os.Exit(cli.Run())
}
