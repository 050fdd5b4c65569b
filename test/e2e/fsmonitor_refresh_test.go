package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The first git status after a start that follows a session which rewrote
// files with the same bytes (runtime/launcher/fsmonitor/untracked,
// refresh.go): the host rewrites tracked files with their own bytes before
// the launch (new mtimes; host git's index, the seed, keeps the old), and
// changes one other file's content; the vouch cannot vouch for any of
// them, the image's git in the jail refreshes the rewritten ones and the
// launcher takes them. The sandbox's git holds them fsmonitor-valid, its
// first status hashes only the changed file and the one the host edits
// after the launch (trace2's refresh/sum_scan inside the sandbox) and is a
// full scan's. The package's own tests have the controls (an entry
// wrongly marked valid is missed; an entry taken in the token's second
// misses a same-second edit).
func TestPiToolsGitFirstStatusRefreshed(t *testing.T) {
	im := image(t)
	host := filepath.Join(t.TempDir(), "host")
	r := genToolsRepo(t, host, 200)
	files := strings.Fields(toolsGit(t, r.ws, "-c", "safe.directory=*", "ls-files"))
	if len(files) < 100 {
		t.Fatalf("want 100 tracked files, got %d", len(files))
	}
	// Spread over the tree, as a session's edits are.
	var rewritten []string
	for i := 7; i < len(files) && len(rewritten) < 20; i += 9 {
		rewritten = append(rewritten, files[i])
	}
	changed := files[8]
	editedLater := rewritten[3]
	for _, f := range rewritten {
		p := filepath.Join(r.ws, f)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flip(t, filepath.Join(r.ws, changed))
	// Out of the second the files were stamped in, as a later session's
	// launch is: an entry stamped in the token's second is not taken.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1200 * time.Millisecond)))

	sbx := startToolsSandbox(t, im, host, r, "sandbox", true)
	// After the launch, before the sandbox's git runs: the watcher's.
	flip(t, filepath.Join(r.ws, editedLater))

	var invalid []string
	for _, l := range strings.Split(strings.TrimSpace(sbx.output(t, "git ls-files -f")), "\n") {
		if tag, name, _ := strings.Cut(l, " "); tag != strings.ToLower(tag) {
			invalid = append(invalid, name)
		}
	}
	want := []string{changed, editedLater}
	slices.Sort(want)
	if !slices.Equal(invalid, want) {
		t.Errorf("the sandbox's git holds %q not fsmonitor-valid, want %q", invalid, want)
	}
	first := sbx.output(t, "GIT_TRACE2_EVENT=/tmp/refresh.trace git status --porcelain")
	trace := sbx.output(t, "cat /tmp/refresh.trace")
	full := sbx.output(t, "git -c core.fsmonitor=false -c core.untrackedCache=false --no-optional-locks status --porcelain")
	if first != full {
		t.Errorf("the first status:\n%s\na full scan:\n%s", first, full)
	}
	for _, w := range []string{" M " + changed, " M " + editedLater} {
		if !slices.Contains(strings.Split(first, "\n"), w) {
			t.Errorf("the first status lacks %q:\n%s", w, first)
		}
	}
	scan := -1
	sc := bufio.NewScanner(strings.NewReader(trace))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct{ Event, Category, Key, Value string }
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "data" && ev.Category == "index" && ev.Key == "refresh/sum_scan" {
			n, _ := strconv.Atoi(ev.Value)
			scan = max(scan, 0) + n
		}
	}
	// Hashed: the changed file and the one edited after the launch, not
	// the rewritten ones.
	if scan != len(want) {
		t.Errorf("the first status hashed %d entries, want %d", scan, len(want))
	}
	res := sbx.finish()
	if st := res.FSMonitor; st == nil || st.Untracked != "built" || st.Refreshed != len(rewritten) || st.RefreshSkipped != 0 || st.RefreshReason != "" ||
		st.NotVouched != len(rewritten)+1 {
		t.Errorf("the launch's monitor: %+v, want the cache built, %d entries refreshed and %d not vouched", st, len(rewritten), len(rewritten)+1)
	}
}

// flip changes a file's first byte, its size the same (stamped now).
func flip(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
