package supervisor

import (
	"os"
	"testing"
)

// TestMain lets the supervisor re-execute this test binary as a sandbox
// holder, as the CLI binary is re-executed in production.
func TestMain(m *testing.M) {
	MaybeRunHolder()
	os.Exit(m.Run())
}
