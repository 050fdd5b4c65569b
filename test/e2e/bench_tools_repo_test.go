package e2e

// The repository make bench-tools works on, generated here from a seeded
// PRNG (no download): the same file count gives the same bytes and the same
// commit id on every run. It is laid out as Paseo lays out an agent's
// worktree: the user's repository (a main worktree) at
// srv/paseo/repos/proj and the agent's linked worktree, branch feature, at
// srv/paseo/workspace/proj-feature, both beneath root.

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// toolsRepo is one generated repository.
type toolsRepo struct {
	repo, ws string // the main worktree and the agent's linked worktree
	gitdir   string // the linked worktree's Git dir
	base     string // the one commit
	files    int    // tracked files
	bytes    int64  // their total size
}

// The tree's shape: about 12 files a directory, directories up to 8 deep,
// sizes mostly 0.2-4 KB with a tenth up to 40 KB, and four large text files
// (1, 2, 4 and 8 MiB: a fixture, a data dump, a minified bundle, a log).
const (
	toolsFilesPerDir = 12
	toolsMaxDepth    = 8
)

var (
	toolsWords = strings.Fields(`alpha beta gamma delta agent session model token route sandbox
		worker queue cache index tree node commit branch config store buffer stream frame record
		client server handler request response parse render compile check verify launch mount`)
	toolsExts  = []string{".go", ".go", ".go", ".ts", ".ts", ".js", ".md", ".json", ".py", ".txt"}
	toolsLarge = []struct {
		path string
		size int
	}{{"testdata/fixtures/large.json", 1 << 20}, {"data/dump.csv", 2 << 20}, {"web/dist/bundle.min.js", 4 << 20}, {"logs/sample.txt", 8 << 20}}
)

// genToolsRepo writes the repository with n tracked files (the large ones
// included) beneath root, commits it with fixed names and dates, adds the
// linked worktree, fills its ignored build output, and gives it all to the
// sandbox user (uid 1000, as Paseo's workspaces are the daemon user's).
// The commit's objects stay loose, as `git add` and `git commit` leave
// them (genToolsRepoPacked packs them).
func genToolsRepo(tb testing.TB, root string, n int) *toolsRepo {
	return genToolsRepoPacked(tb, root, n, false)
}

// genToolsRepoPacked is genToolsRepo with, when packed, the commit's
// objects repacked into one pack (`git repack -a -d`) before the worktree
// is added: the object store as a clone has it (one pack and its index, no
// loose object), which is what an agent's repository usually is.
func genToolsRepoPacked(tb testing.TB, root string, n int, packed bool) *toolsRepo {
	tb.Helper()
	r := &toolsRepo{repo: filepath.Join(root, "srv/paseo/repos/proj"), ws: filepath.Join(root, "srv/paseo/workspace/proj-feature")}
	r.gitdir = filepath.Join(r.repo, ".git/worktrees/proj-feature")
	rng := rand.New(rand.NewPCG(33, uint64(n)))
	if err := os.MkdirAll(r.repo, 0o755); err != nil {
		tb.Fatal(err)
	}
	toolsGit(tb, r.repo, "init", "-q", "-b", "main")

	// Directories: each new one under a random existing one, as deep as
	// toolsMaxDepth.
	dirs := []string{"src", "internal", "pkg", "web", "docs", "test"}
	depth := map[string]int{}
	for _, d := range dirs {
		depth[d] = 1
	}
	for len(dirs) < n/toolsFilesPerDir {
		parent := dirs[rng.IntN(len(dirs))]
		if depth[parent] >= toolsMaxDepth {
			continue
		}
		d := fmt.Sprintf("%s/%s%d", parent, toolsWords[rng.IntN(len(toolsWords))], len(dirs))
		depth[d] = depth[parent] + 1
		dirs = append(dirs, d)
	}
	for _, l := range toolsLarge {
		r.write(tb, l.path, toolsText(rng, ".txt", l.size))
	}
	r.write(tb, ".gitignore", "build/\nnode_modules/\n*.log\n")
	for i := len(toolsLarge) + 1; i < n; i++ {
		ext := toolsExts[rng.IntN(len(toolsExts))]
		size := 200 + rng.IntN(4000)
		if rng.IntN(10) == 0 {
			size = 4000 + rng.IntN(36000)
		}
		p := fmt.Sprintf("%s/%s_%d%s", dirs[rng.IntN(len(dirs))], toolsWords[rng.IntN(len(toolsWords))], i, ext)
		r.write(tb, p, toolsText(rng, ext, size))
	}
	toolsGit(tb, r.repo, "add", "-A")
	toolsGit(tb, r.repo, "commit", "-q", "-m", "the benchmark's tree")
	r.base = strings.TrimSpace(toolsGit(tb, r.repo, "rev-parse", "HEAD"))
	if packed {
		toolsGit(tb, r.repo, "repack", "-a", "-d", "-q")
	}
	toolsGit(tb, r.repo, "worktree", "add", "-q", "-b", "feature", r.ws)
	// Ignored build output in the agent's worktree, as a build leaves it.
	for i := range n / 10 {
		dir := "build/obj"
		if i%2 == 1 {
			dir = "node_modules/dep" + fmt.Sprint(i%40)
		}
		p := filepath.Join(r.ws, dir, fmt.Sprintf("out_%d.o", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(toolsText(rng, ".txt", 500+rng.IntN(2000))), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	chownTree(tb, r.repo, 1000, 1000)
	chownTree(tb, r.ws, 1000, 1000)
	// The chown moved every file's ctime: let git record the tree again,
	// in a second after every file's mtime (no entry racily clean), as
	// the deployment user's own git status leaves a checkout's index. The
	// launcher's vouch (fsmonitor/vouch) checks ctime too.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
	toolsGit(tb, r.ws, "-c", "safe.directory=*", "update-index", "-q", "--refresh")
	if err := os.Lchown(filepath.Join(r.gitdir, "index"), 1000, 1000); err != nil {
		tb.Fatal(err)
	}
	return r
}

func (r *toolsRepo) write(tb testing.TB, rel, content string) {
	tb.Helper()
	p := filepath.Join(r.repo, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
	r.files++
	r.bytes += int64(len(content))
}

// toolsText is size bytes of source-like lines for ext; Go files hold the
// `func ` lines the benchmark's rg counts.
func toolsText(rng *rand.Rand, ext string, size int) string {
	var b strings.Builder
	b.Grow(size + 80)
	w := func() string { return toolsWords[rng.IntN(len(toolsWords))] }
	for b.Len() < size {
		switch {
		case ext == ".go" && rng.IntN(4) == 0:
			fmt.Fprintf(&b, "func %s%s(%s int) int { return %s + %d }\n", w(), strings.ToUpper(w()[:1]), w(), w(), rng.IntN(1000))
		case ext == ".ts" || ext == ".js":
			fmt.Fprintf(&b, "export const %s_%d = (%s) => %s.%s(%d);\n", w(), rng.IntN(100), w(), w(), w(), rng.IntN(1000))
		default:
			fmt.Fprintf(&b, "%s %s %s %s %d %s\n", w(), w(), w(), w(), rng.IntN(100000), w())
		}
	}
	return b.String()[:size]
}

// toolsGit runs the host's git as root to build the tree: no config but
// the fixed identity and dates, so the commit id depends on the tree only.
func toolsGit(tb testing.TB, dir string, args ...string) string {
	tb.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=bench", "-c", "user.email=bench@example.test", "-c", "gc.auto=0"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(gitEnv(), "GIT_AUTHOR_DATE=2026-12-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-12-01T00:00:00Z")
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}
