package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/profiles"
)

// BenchmarkLaunchRepoSize (make bench-launch): the pi-session profile's
// launch on a linked worktree of a repository of about 100,000 objects
// against the same launch on a repository of one commit. Both worktrees
// hold the same tree (1,000 files in 100 directories), so their indexes,
// which the compile reads and the start script copies, are the same size;
// only the history differs: 7,700 commits (one pack, as fast-import and a
// clone leave it) against one. The agent is the profile's own start script
// (it seeds the private Git dir and the agent's Git store) with `exec pi`
// replaced by `echo ready`; each launch finds the store empty, as a first
// launch does, so the seeding of its refs is timed every round. Rounds
// alternate the order; each is timed from Launch to the first byte. The
// repositories are generated (git fast-import of a generated stream),
// outside the timer.
func BenchmarkLaunchRepoSize(b *testing.B) {
	script := startScript(b, "echo ready")
	// The script's tools beyond sh, cp and rm, as the image has them.
	tools := map[string]string{"/bin/mkdir": "/bin/busybox", "/bin/mv": "/bin/busybox"}
	var big, small *testbundle.Scene
	var objects int
	big = testbundle.New(b, testbundle.Options{Argv: []string{"/bin/sh", "-c", script}, RootfsFiles: tools,
		Prepare: func(t testing.TB, host string) { objects = benchRepo(t, host, repoCommits) }})
	small = testbundle.New(b, testbundle.Options{Argv: []string{"/bin/sh", "-c", script}, RootfsFiles: tools,
		Prepare: func(t testing.TB, host string) { benchRepo(t, host, 1) }})
	if objects < 90000 {
		b.Fatalf("the large repository has %d objects", objects)
	}
	launch := func(s *testbundle.Scene) time.Duration {
		store := filepath.Join(s.Host, "srv/paseo/state/pi-git/agent-7f3c")
		emptyDir(b, store)
		var out firstByte
		var errb bytes.Buffer
		start := time.Now()
		res, err := Launch(context.Background(), Options{
			BundleDir: s.Bundle, StateRoot: s.State, RunscPath: s.Runsc, ID: newID(),
			Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errb,
		})
		if err != nil {
			b.Fatalf("launch: %v\nstderr: %s", err, errb.String())
		}
		d, got := out.since(start)
		if res.ExitCode != 0 || got != "ready\n" || d == 0 || strings.Contains(errb.String(), "could not be seeded") {
			b.Fatalf("exit %d, output %q (want \"ready\\n\"), stderr: %s", res.ExitCode, got, errb.String())
		}
		// The store was seeded: its refs are the repository's.
		if _, err := os.Stat(filepath.Join(store, "refs/heads/feature")); err != nil {
			b.Fatalf("the store was not seeded: %v", err)
		}
		return d
	}
	launch(big) // untimed: the runsc digest cache and the page cache
	launch(small)
	var bigs, smalls, ratios []float64
	i := 0
	for b.Loop() {
		var db, ds time.Duration
		if i%2 == 0 {
			db, ds = launch(big), launch(small)
		} else {
			ds, db = launch(small), launch(big)
		}
		bigs, smalls = append(bigs, float64(db.Nanoseconds())), append(smalls, float64(ds.Nanoseconds()))
		ratios = append(ratios, float64(db)/float64(ds))
		i++
	}
	mb, ms := median(bigs), median(smalls)
	b.ReportMetric(mb, "large-first-byte-ns")
	b.ReportMetric(ms, "small-first-byte-ns")
	b.ReportMetric(mb/ms, "ratio")
	b.ReportMetric(median(ratios), "round-ratio")
	b.ReportMetric(float64(objects), "objects")
}

const (
	repoCommits          = 7700 // 13 objects each: about 100,000
	repoDirs, repoFilesN = 100, 10
)

// benchRepo replaces the reference tree's hand-made repository under host
// with a real one of commits commits on main (the last sets every file to
// the same content, so every size ends on one tree) and the workspace
// with a linked worktree of it on branch feature, owned by the deployment
// user as Paseo's are. It returns the repository's object count.
func benchRepo(t testing.TB, host string, commits int) int {
	t.Helper()
	repo, ws := filepath.Join(host, "srv/paseo/repos/proj"), filepath.Join(host, "srv/paseo/workspace/proj-feature")
	store := filepath.Join(host, "srv/paseo/state/pi-git/agent-7f3c")
	for _, p := range []string{repo, ws} {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(store, 0o755); err != nil {
		t.Fatal(err)
	}
	git := func(stdin string, args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C"}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("", "init", "-q", "-b", "main", repo)
	git(repoStream(commits), "-C", repo, "fast-import", "--quiet")
	git("", "-C", repo, "worktree", "add", "-q", "-b", "feature", ws, "main")
	counts := map[string]int{}
	for _, line := range strings.Split(git("", "-C", repo, "count-objects", "-v"), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok {
			counts[k], _ = strconv.Atoi(v)
		}
	}
	for _, p := range []string{filepath.Join(host, "srv/paseo/repos"), ws, store} {
		if err := filepath.Walk(p, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, 1000, 1000)
		}); err != nil {
			t.Fatal(err)
		}
	}
	return counts["count"] + counts["in-pack"]
}

// repoStream is a fast-import stream of commits commits on main: each but
// the last rewrites the ten files of one directory, the last writes every
// file's final content. Deterministic: same commits, same ids.
func repoStream(commits int) string {
	var s strings.Builder
	for i := 0; i < commits; i++ {
		fmt.Fprintf(&s, "commit refs/heads/main\ncommitter b <b@example.test> %d +0000\ndata 7\nc%05d\n", 1700000000+i, i)
		last := i == commits-1
		for d := 0; d < repoDirs; d++ {
			if !last && d != i%repoDirs {
				continue
			}
			for f := 0; f < repoFilesN; f++ {
				content := fmt.Sprintf("dir %d file %d\n", d, f)
				if !last {
					content = fmt.Sprintf("dir %d file %d at commit %d\n", d, f, i)
				}
				fmt.Fprintf(&s, "M 100644 inline d%02d/f%d.txt\ndata %d\n%s", d, f, len(content), content)
			}
		}
		s.WriteString("\n")
	}
	return s.String()
}

// startScript is the pi-session profile's start script, exactly as
// reviewed, with its final `exec pi "$@"` replaced by agent.
func startScript(b *testing.B, agent string) string {
	b.Helper()
	prof, err := profiles.FS.ReadFile("pi-session.cue")
	if err != nil {
		b.Fatal(err)
	}
	lits := regexp.MustCompile(`\{lit: ("(?:[^"\\]|\\.)*")\}`).FindAllStringSubmatch(string(prof), -1)
	if len(lits) < 3 {
		b.Fatal("pi-session.cue: no start script in argv")
	}
	var script string
	if err := json.Unmarshal([]byte(lits[2][1]), &script); err != nil {
		b.Fatalf("pi-session.cue: start script: %v", err)
	}
	const tail = `exec pi "$@"`
	if !strings.HasSuffix(script, tail) {
		b.Fatalf("pi-session.cue: the start script no longer ends in %s", tail)
	}
	return strings.TrimSuffix(script, tail) + agent
}

func emptyDir(b *testing.B, dir string) {
	b.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			b.Fatal(err)
		}
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
