package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// `make demo` as root (test/cmd/paseo-demo) runs its turn and says so in its
// report: the sandbox ran in gVisor under the pinned runsc and image,
// every forbidden attempt was contained, the grants it shows were used,
// and it left nothing behind.
func TestPiDemo(t *testing.T) {
	skip.UnlessRoot(t, "the demo makes namespaces and runs runsc")
	runsc := testbundle.Repo(t, "bin/runsc")
	if _, err := os.Stat(runsc); err != nil {
		t.Fatalf("pinned runsc missing at %s: run `make runsc` (%v)", runsc, err)
	}
	im := image(t)
	demo := testbundle.BuildStatic(t, "./test/cmd/paseo-demo")
	dir := t.TempDir()
	out, work := filepath.Join(dir, "demo.json"), filepath.Join(dir, "work")
	// The daemon user's host git reaches the demo's repository, as it
	// does beneath the checkout's .demo.
	searchable(t, work)
	cmd := exec.Command(demo, "--repo", testbundle.Repo(t, ""), "--runsc", runsc,
		"--image", testbundle.Repo(t, ".image"), "--work", work, "--out", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("paseo-demo: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		OK      bool
		Sandbox string
		Runsc   struct{ Digest string }
		Image   struct{ Version, Digest string }
		GVisor  struct{ Confirmed bool } `json:"gvisor"`
		Used    []struct{ Grant string } `json:"grantsUsed"`
		Blocked []struct {
			Attempt   string
			Contained bool
		} `json:"attemptsBlocked"`
		Packets map[string]uint64
		Left    []string                `json:"leftBehind"`
		Steps   []struct{ Step string } `json:"timings"`
		Git     *struct {
			Updated []struct{ Ref, Old, New string }
			Log     []string
		} `json:"gitImport"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	recorded, _ := os.ReadFile(runsc + ".sha256")
	if !rep.OK || !rep.GVisor.Confirmed || !strings.HasPrefix(rep.Sandbox, "pp-") || len(rep.Left) != 0 {
		t.Errorf("report: ok %v, gVisor %v, sandbox %q, left %v", rep.OK, rep.GVisor.Confirmed, rep.Sandbox, rep.Left)
	}
	if want := "sha256:" + strings.Fields(string(recorded) + " ")[0]; rep.Runsc.Digest != want || rep.Image.Digest != im.Digest || rep.Image.Version != im.Version {
		t.Errorf("digests: runsc %s (want %s), image %s %s (want %s %s)", rep.Runsc.Digest, want, rep.Image.Version, rep.Image.Digest, im.Version, im.Digest)
	}
	if len(rep.Blocked) != 6 || len(rep.Used) != 3 || rep.Packets["drop-egress"] == 0 || len(rep.Steps) == 0 {
		t.Errorf("report: %d attempts, %d grants used, drop-egress %d, %d steps", len(rep.Blocked), len(rep.Used), rep.Packets["drop-egress"], len(rep.Steps))
	}
	if g := rep.Git; g == nil || len(g.Updated) != 1 || g.Updated[0].Ref != "refs/heads/feature" || len(g.Log) != 2 || !strings.HasSuffix(g.Log[0], "DEMO.md, committed inside gVisor") {
		t.Errorf("the agent's commit did not reach refs/heads/feature through the import: %+v", g)
	}
	for _, a := range rep.Blocked {
		if !a.Contained {
			t.Errorf("not contained: %s", a.Attempt)
		}
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("the demo left its work dir: %v", err)
	}
}
