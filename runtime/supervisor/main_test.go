package supervisor

import (
	"os"
	"testing"

	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

// TestMain lets the supervisor re-execute this test binary as a sandbox
// holder, as the CLI binary is re-executed in production.
func TestMain(m *testing.M) {
	holder.MaybeRun()
	os.Exit(m.Run())
}
