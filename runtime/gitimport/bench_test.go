package gitimport

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The import's cost against plain git between two local repositories
// (make bench): an agent's session of 1,000 commits, each changing nine
// files (11,000 new objects: nine blobs, a tree and a commit each),
// packed as fast-import packs them. BenchmarkImport runs the whole import
// (store read, quarantine, index-pack, fetch with fsck, update-ref);
// BenchmarkFetch is git fetch of the same commits from a repository that
// has them. Each iteration gets a fresh copy of the shared repository,
// made outside the timer.

const benchCommits, benchFiles = 1000, 9

type benchLab struct {
	root, pristine, store, src string
	base, tip                  string
}

var benchOnce struct {
	lab *benchLab
	err error
}

func newBenchLab(b *testing.B) *benchLab {
	b.Helper()
	if benchOnce.lab != nil || benchOnce.err != nil {
		if benchOnce.err != nil {
			b.Fatal(benchOnce.err)
		}
		return benchOnce.lab
	}
	root, err := os.MkdirTemp("", "paseo-gitimport-bench-")
	if err != nil {
		b.Fatal(err)
	}
	l := &benchLab{root: root, pristine: filepath.Join(root, "shared.git"), store: filepath.Join(root, "state/git/agent-1"), src: filepath.Join(root, "src.git")}
	run := func(stdin string, args ...string) string {
		cmd := exec.Command("git", args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C",
			"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@example.test", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@example.test"}
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			benchOnce.err = fmt.Errorf("git %v: %v %s", args, err, out)
			b.Fatal(benchOnce.err)
		}
		return strings.TrimSpace(string(out))
	}
	run("", "init", "-q", "--bare", "-b", "main", l.pristine)
	tree := run("", "--git-dir="+l.pristine, "mktree")
	l.base = run("", "--git-dir="+l.pristine, "commit-tree", "-m", "base", tree)
	run("", "--git-dir="+l.pristine, "update-ref", "refs/heads/feature", l.base)
	var stream strings.Builder
	for i := 0; i < benchCommits; i++ {
		fmt.Fprintf(&stream, "commit refs/heads/feature\ncommitter a <a@example.test> %d +0000\ndata 6\nc%05d\n", 1700000000+i, i)
		if i == 0 {
			fmt.Fprintf(&stream, "from %s\n", l.base)
		}
		for f := 0; f < benchFiles; f++ {
			content := fmt.Sprintf("file %d at commit %d\n", f, i)
			fmt.Fprintf(&stream, "M 100644 inline f%d\ndata %d\n%s", f, len(content), content)
		}
		stream.WriteString("\n")
	}
	// The store as the sandbox leaves it.
	for _, d := range []string{"objects/info", "refs/heads"} {
		if err := os.MkdirAll(filepath.Join(l.store, d), 0o755); err != nil {
			b.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(l.store, "HEAD"), []byte("ref: refs/paseo/host-worktree\n"), 0o644)
	os.WriteFile(filepath.Join(l.store, "objects/info/alternates"), []byte(filepath.Join(l.pristine, "objects")+"\n"), 0o644)
	os.WriteFile(filepath.Join(l.store, "refs/heads/feature"), []byte(l.base+"\n"), 0o644)
	run(stream.String(), "--git-dir="+l.store, "fast-import", "--quiet")
	l.tip = run("", "--git-dir="+l.store, "rev-parse", "refs/heads/feature")
	// The baseline's source: a repository with the same commits.
	run("", "clone", "-q", "--bare", "--no-local", l.pristine, l.src)
	run(stream.String(), "--git-dir="+l.src, "fast-import", "--quiet")
	benchOnce.lab = l
	return l
}

func (l *benchLab) freshShared(b *testing.B, i int) string {
	b.Helper()
	dst := filepath.Join(l.root, fmt.Sprintf("shared-%d.git", i))
	os.RemoveAll(dst)
	if out, err := exec.Command("cp", "-a", l.pristine, dst).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v %s", err, out)
	}
	return dst
}

func BenchmarkImport(b *testing.B) {
	l := newBenchLab(b)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		shared := l.freshShared(b, i)
		b.StartTimer()
		res, err := Import(context.Background(), Options{Repo: shared, StateRoot: filepath.Join(l.root, "state"), Store: l.store, Agent: "agent-1",
			Branch: "refs/heads/feature", Base: l.base, Home: "/nonexistent", WorkDir: l.root})
		if err != nil || len(res.Updated) != 1 || res.Updated[0].New != l.tip {
			b.Fatalf("import: %v %+v", err, res)
		}
		b.StopTimer()
		os.RemoveAll(shared)
		b.StartTimer()
	}
}

func BenchmarkFetch(b *testing.B) {
	l := newBenchLab(b)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		shared := l.freshShared(b, i)
		b.StartTimer()
		cmd := exec.Command("git", "--git-dir="+shared, "fetch", "-q", l.src, "refs/heads/feature:refs/heads/feature")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C"}
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("fetch: %v %s", err, out)
		}
		b.StopTimer()
		os.RemoveAll(shared)
		b.StartTimer()
	}
}

// TestMain removes the benchmarks' lab, which they share.
func TestMain(m *testing.M) {
	code := m.Run()
	if benchOnce.lab != nil {
		os.RemoveAll(benchOnce.lab.root)
	}
	os.Exit(code)
}
