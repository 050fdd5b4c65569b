package e2e

import (
	"os"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/testcontainer"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

// TestMain lets the supervisor under test re-execute this test binary as
// a sandbox holder, as the CLI binary is re-executed in production, and
// TestPiOfficialContainer re-execute it as the official container.
func TestMain(m *testing.M) {
	testcontainer.MaybeEnter()
	holder.MaybeRun()
	os.Exit(m.Run())
}
