package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The first git status after a start, from the index the launcher vouched
// for (runtime/launcher/fsmonitor/vouch): the host changed files before
// the launch and one more after it; the sandbox's git, with the profile's
// settings and the monitor, holds as fsmonitor-valid exactly the entries
// nothing touched (so it lstats only the others: the vouch was used) and
// its first status is a full scan's. The launch result counts what was
// vouched for. TestVouchedIndexStatusIsAFullScans (the package's own, with
// its control) covers every kind of change against host git.
func TestPiToolsGitFirstStatusVouched(t *testing.T) {
	im := image(t)
	host := filepath.Join(t.TempDir(), "host")
	r := genToolsRepo(t, host, 60)
	files := strings.Fields(toolsGit(t, r.ws, "-c", "safe.directory=*", "ls-files", "--", "src"))
	all := strings.Fields(toolsGit(t, r.ws, "-c", "safe.directory=*", "ls-files"))
	if len(files) < 4 {
		t.Fatalf("want 4 tracked files under src, got %q", files)
	}
	grown, gone, exec, later := files[0], files[1], files[2], files[3]
	// Before the launch, as the user's editor and tools would.
	f, err := os.OpenFile(filepath.Join(r.ws, grown), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("// grown on the host\n")
	f.Close()
	if err := os.Remove(filepath.Join(r.ws, gone)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(r.ws, exec), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(r.ws, filepath.Dir(grown), "host-new.txt"), "new\n")

	sbx := startToolsSandbox(t, im, host, r, "sandbox", true)
	// After the launch, before the sandbox's git runs: the watcher's.
	f, err = os.OpenFile(filepath.Join(r.ws, later), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("// after the start\n")
	f.Close()

	var valid, invalid []string
	for _, l := range strings.Split(strings.TrimSpace(sbx.output(t, "git ls-files -f")), "\n") {
		tag, name, _ := strings.Cut(l, " ")
		if tag == strings.ToLower(tag) {
			valid = append(valid, name)
		} else {
			invalid = append(invalid, name)
		}
	}
	slices.Sort(invalid)
	want := []string{grown, gone, exec, later}
	slices.Sort(want)
	if !slices.Equal(invalid, want) || len(valid) != len(all)-len(want) {
		t.Errorf("the sandbox's git holds %d entries fsmonitor-valid and not %q; want all %d but %q", len(valid), invalid, len(all), want)
	}
	// The private copy is the sandbox user's to write, as the seed's was.
	if got := sbx.output(t, `stat -c %a "$PASEO_GIT_DIR/index"`); got != "644\n" {
		t.Errorf("the private index's mode: %q, want 644", got)
	}
	first := sbx.output(t, "git status --porcelain")
	full := sbx.output(t, "git -c core.fsmonitor=false --no-optional-locks status --porcelain")
	if first != full {
		t.Errorf("the first status from the vouched index:\n%s\na full scan:\n%s", first, full)
	}
	for _, w := range []string{" M " + grown, " D " + gone, " M " + exec, " M " + later, "?? " + filepath.Dir(grown) + "/host-new.txt"} {
		if !slices.Contains(strings.Split(first, "\n"), w) {
			t.Errorf("the first status lacks %q:\n%s", w, first)
		}
	}
	res := sbx.finish()
	if st := res.FSMonitor; st == nil || st.Vouched != len(all)-3 || st.NotVouched != 3 || st.VouchReason != "" {
		t.Errorf("the launch's vouch: %+v, want %d vouched and 3 not", st, len(all)-3)
	}
}
