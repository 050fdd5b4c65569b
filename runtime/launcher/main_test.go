package launcher

import (
	"os"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestMain quiets runtime-tools' warnings (through logrus) as the
// paseo-policy binary does (cli.QuietLibraryLogs): every launch validates
// its bundle, and the test binary is also the crash test's launcher, whose
// output the test reads.
func TestMain(m *testing.M) {
	logrus.SetLevel(logrus.ErrorLevel)
	os.Exit(m.Run())
}
