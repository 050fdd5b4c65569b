package skip

import (
	"fmt"
	"strings"
	"testing"
)

// recorder records a skip or a failure instead of ending the goroutine,
// so every outcome can be checked in one test.
type recorder struct{ skipped, failed string }

func (r *recorder) Helper()                        {}
func (r *recorder) Skip(args ...any)               { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatalf(format string, a ...any) { r.failed = fmt.Sprintf(format, a...) }

// As root nothing happens; otherwise the test skips saying why, or fails
// with the same words where make test asked for no skips.
func TestUnlessRoot(t *testing.T) {
	for _, tc := range []struct {
		euid         int
		noSkip       string
		skips, fails bool
	}{
		{0, "", false, false},
		{0, "1", false, false},
		{1000, "", true, false},
		{1000, "0", true, false},
		{1000, "1", false, true},
	} {
		t.Run(fmt.Sprintf("euid=%d,%s=%q", tc.euid, NoSkipEnv, tc.noSkip), func(t *testing.T) {
			t.Setenv(NoSkipEnv, tc.noSkip)
			was := geteuid
			geteuid = func() int { return tc.euid }
			t.Cleanup(func() { geteuid = was })
			r := &recorder{}
			UnlessRoot(r, "it mounts")
			if (r.skipped != "") != tc.skips || (r.failed != "") != tc.fails {
				t.Fatalf("skipped %q, failed %q; want skip %v, failure %v", r.skipped, r.failed, tc.skips, tc.fails)
			}
			for _, msg := range []string{r.skipped, r.failed} {
				if msg != "" && !(strings.Contains(msg, "needs root (euid 0, running as 1000)") && strings.Contains(msg, "it mounts")) {
					t.Errorf("message %q does not say what is missing and why", msg)
				}
			}
		})
	}
}

// Every test and benchmark can skip through here.
var _ TB = testing.TB(nil)
