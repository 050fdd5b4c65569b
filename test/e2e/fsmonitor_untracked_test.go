package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The first git status after a start, from the vouched index with the
// untracked cache the image's git built in the jail
// (runtime/launcher/fsmonitor/untracked): the host made untracked files,
// directories and ignored files before the launch and changed some after
// it; the sandbox's git opens only the directories those later changes
// named (trace2's read_directory "opendir" inside the sandbox: the cache
// was used, not dropped) and its first status is a full scan's. The
// package's own tests (with their controls: no cache opens every
// directory, a cache the monitor does not invalidate misses changes)
// cover the kinds of names against host git.
func TestPiToolsGitFirstStatusUntrackedCache(t *testing.T) {
	im := image(t)
	host := filepath.Join(t.TempDir(), "host")
	r := genToolsRepo(t, host, 200)
	files := strings.Fields(toolsGit(t, r.ws, "-c", "safe.directory=*", "ls-files", "--", "src"))
	if len(files) < 2 {
		t.Fatalf("want 2 tracked files under src, got %q", files)
	}
	d0, d1 := filepath.Dir(files[0]), filepath.Dir(files[len(files)-1])
	// Before the launch: untracked and ignored names.
	write(t, filepath.Join(r.ws, d0, "host-new.txt"), "new\n")
	write(t, filepath.Join(r.ws, "scratch/a/b/deep.txt"), "new\n")
	write(t, filepath.Join(r.ws, d1, "gone-later.txt"), "new\n")
	if err := os.MkdirAll(filepath.Join(r.ws, "empty/dir"), 0o755); err != nil {
		t.Fatal(err)
	}

	sbx := startToolsSandbox(t, im, host, r, "sandbox", true)
	// After the launch, before the sandbox's git runs: the watcher's.
	write(t, filepath.Join(r.ws, d1, "after-start.txt"), "later\n")
	if err := os.Remove(filepath.Join(r.ws, d1, "gone-later.txt")); err != nil {
		t.Fatal(err)
	}

	first := sbx.output(t, "GIT_TRACE2_EVENT=/tmp/untracked.trace GIT_TRACE2_EVENT_NESTING=10 git status --porcelain")
	trace := sbx.output(t, "cat /tmp/untracked.trace")
	full := sbx.output(t, "git -c core.fsmonitor=false -c core.untrackedCache=false --no-optional-locks status --porcelain")
	if first != full {
		t.Errorf("the first status from the cached index:\n%s\na full scan:\n%s", first, full)
	}
	lines := strings.Split(first, "\n")
	for _, w := range []string{"?? " + d0 + "/host-new.txt", "?? scratch/", "?? " + d1 + "/after-start.txt"} {
		if !contains(lines, w) {
			t.Errorf("the first status lacks %q:\n%s", w, first)
		}
	}
	if strings.Contains(first, "gone-later") {
		t.Errorf("the first status shows a file the host removed after the start:\n%s", first)
	}
	opendir, visited := -1, -1
	sc := bufio.NewScanner(strings.NewReader(trace))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev struct{ Event, Category, Key, Value string }
		if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event == "data" && ev.Category == "read_directory" {
			n, _ := strconv.Atoi(ev.Value)
			switch ev.Key {
			case "opendir":
				opendir = n
			case "directories-visited":
				visited = n
			}
		}
	}
	// The changes after the start name d1 and its parents: those are read
	// again, nothing else.
	t.Logf("the first status opened %d directories of %d visited", opendir, visited)
	if depth := strings.Count(d1, "/") + 2; opendir < 0 || opendir > depth || visited < 20 {
		t.Errorf("the first status opened %d of %d directories visited: want at most %d (the cache used)", opendir, visited, depth)
	}
	res := sbx.finish()
	if st := res.FSMonitor; st == nil || st.Untracked != "built" {
		t.Errorf("the launch's untracked cache: %+v, want built", st)
	} else {
		t.Logf("the untracked cache was built in %d ms, the start waited %d ms for it (indicative)", st.UntrackedMillis, st.UntrackedWaitMillis)
	}
}

func contains(lines []string, w string) bool {
	for _, l := range lines {
		if l == w {
			return true
		}
	}
	return false
}
