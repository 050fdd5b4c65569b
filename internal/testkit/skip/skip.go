// Package skip is the project's one way for a test to skip. A test that
// needs what an unprivileged `go test ./...` cannot have (root, to make
// namespaces, mount, run runsc) skips through here with one message, so
// such a run is green for reasons that are not failures. `make test`
// exports NoSkipEnv=1, and there the same call fails: CI runs as root, so
// a skip there would hide a test that did not run. internal/archtest holds
// every other test file to calling this package instead of t.Skip.
package skip

import (
	"fmt"
	"os"
)

// TB is what a skip needs of a test: testing.TB has it. A program that
// runs test support outside `go test` (the demo) has no Skip, so test
// support that serves both checks for it.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatalf(format string, args ...any)
}

// NoSkipEnv, set to 1, turns every skip into a failure with the same
// message.
const NoSkipEnv = "PASEO_NO_SKIP"

// geteuid is os.Geteuid; its test sets it, since CI runs only as root.
var geteuid = os.Geteuid

// UnlessRoot skips tb unless it runs with euid 0; why says what the test
// does that needs root.
func UnlessRoot(tb TB, why string) {
	tb.Helper()
	if euid := geteuid(); euid != 0 {
		skip(tb, fmt.Sprintf("needs root (euid 0, running as %d): %s", euid, why))
	}
}

func skip(tb TB, reason string) {
	tb.Helper()
	if os.Getenv(NoSkipEnv) == "1" {
		tb.Fatalf("%s; %s=1 (make test) allows no skip: run as root", reason, NoSkipEnv)
		return
	}
	tb.Skip(reason + "; make test runs it as root")
}
