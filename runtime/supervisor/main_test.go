package supervisor

import (
	"os"
	"testing"

	"github.com/sirupsen/logrus"

	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

// TestMain lets the supervisor re-execute this test binary as a sandbox
// holder, as the CLI binary is re-executed in production, with
// runtime-tools' warnings quieted as that binary quiets them
// (cli.QuietLibraryLogs).
func TestMain(m *testing.M) {
	logrus.SetLevel(logrus.ErrorLevel)
	holder.MaybeRun()
	os.Exit(m.Run())
}
