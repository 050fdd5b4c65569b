package launcher

import (
	"testing"
	"time"

	"paseo.dev/paseo-policy/policy/grant"
)

// The launcher takes its limits from the typed grants as they are; grants
// of other kinds are not limits, whatever their numbers.
func TestLauncherLimitsAreTyped(t *testing.T) {
	got := launcherLimits(grant.List{
		grant.Rlimit{Type: "RLIMIT_NOFILE", Max: 7},
		grant.WallLimit{Wall: 90 * time.Second},
		grant.OutputLimit{Bytes: 4096},
		grant.CgroupMax{Resource: "pids", Max: 9},
	})
	if got.wall != 90*time.Second || got.output != 4096 {
		t.Errorf("limits = %+v, want 90s and 4096 bytes", got)
	}
	if none := launcherLimits(nil); none.wall != 0 || none.output != 0 {
		t.Errorf("no limit grants: %+v", none)
	}
}
