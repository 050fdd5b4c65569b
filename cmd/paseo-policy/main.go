// Command paseo-policy compiles trusted Paseo launch facts into auditable
// gVisor sandbox bundles. See README.md.
package main

import (
	"os"

	"paseo.dev/paseo-policy/cli"
)

func main() { os.Exit(cli.Run()) }
