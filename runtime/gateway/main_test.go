package gateway

import (
	"os"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestMain quiets runtime-tools' warnings (through logrus) as the
// paseo-policy binary does (cli.QuietLibraryLogs): every start verifies
// its bundle.
func TestMain(m *testing.M) {
	logrus.SetLevel(logrus.ErrorLevel)
	os.Exit(m.Run())
}
