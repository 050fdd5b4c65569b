// Package gitplant is test support for issue 19: host-side Git, run by the
// Paseo daemon in an agent's workspace, reads control data the agent could
// write from its sandbox (the worktree and the Git dirs are read-write
// there). It builds repository layouts with real git, plants a payload on
// each surface with plain file operations only (what a busybox-only
// sandbox can do: no git), and runs the daemon's host commands with a
// clean environment to see which payloads ran.
package gitplant

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Lab is one scratch area: the daemon's home and the directory payloads
// leave their markers in. Both lie outside every workspace it builds.
type Lab struct {
	Dir     string
	Home    string
	Markers string
	n       int
	// user, when set (RunAs), is who the daemon's host commands run as,
	// and who owns everything the lab builds.
	user *syscall.Credential
}

// New makes a lab with an empty global config, as the daemon user's.
func New(t testing.TB) *Lab {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("gitplant needs git on the host: %v", err)
	}
	// Not t.TempDir: test names put shell metacharacters in the path, and
	// Git runs core.fsmonitor through sh.
	dir, err := os.MkdirTemp("", "gitplant-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	l := &Lab{Dir: dir, Home: filepath.Join(dir, "home"), Markers: filepath.Join(dir, "markers")}
	mkdirAll(t, l.Home)
	mkdirAll(t, l.Markers)
	writeFile(t, filepath.Join(l.Home, ".gitconfig"), "")
	return l
}

// RunAs makes the lab the deployment user's: from now on it owns the lab
// (every layout Build makes is chowned to it), and the daemon's host
// commands run as it. Host git run as root in a tree the user owns would
// refuse it as of dubious ownership and run nothing, which proves nothing.
func (l *Lab) RunAs(t testing.TB, uid, gid uint32) {
	t.Helper()
	l.user = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
	l.Own(t)
}

// Own gives everything in the lab to the RunAs user (a no-op without
// one): run it after writing in the lab as root.
func (l *Lab) Own(t testing.TB) {
	t.Helper()
	if l.user == nil {
		return
	}
	err := filepath.WalkDir(l.Dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, int(l.user.Uid), int(l.user.Gid))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Env is the daemon's environment for git: nothing inherited but PATH, no
// system config, an empty global one, never a prompt.
func (l *Lab) Env() []string {
	return []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + l.Home, "XDG_CONFIG_HOME=" + filepath.Join(l.Home, ".config"),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0", "LANG=C", "LC_ALL=C",
	}
}

// Result is one host git command: its output and the markers its
// payloads left (the marker dir is emptied afterwards).
type Result struct {
	Out     string
	Err     error
	Markers []string
}

// HostGit runs git in dir as the daemon does, and reports which payload
// markers appeared while it ran.
func (l *Lab) HostGit(t testing.TB, dir string, args ...string) Result {
	t.Helper()
	l.clearMarkers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, l.Env(), strings.NewReader("")
	if l.user != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: l.user}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return Result{Out: out.String(), Err: err, Markers: l.clearMarkers(t)}
}

func (l *Lab) clearMarkers(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir(l.Markers)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		if err := os.Remove(filepath.Join(l.Markers, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(names)
	return names
}

// Command is one of the daemon's host commands.
type Command struct {
	Name string
	Args []string // nil: a fetch from the workspace into a scratch repository
}

// Commands are the host commands Paseo's daemon runs in a workspace.
var Commands = []Command{
	{"status", []string{"status", "--porcelain"}},
	{"diff", []string{"diff"}},
	{"log", []string{"log", "-1"}},
	{"rev-parse", []string{"rev-parse", "--show-toplevel"}},
	{"worktree-list", []string{"worktree", "list"}},
	{"fetch", nil},
}

// Run runs c for the workspace wt: in it, or, for the fetch, in a fresh
// bare scratch repository of the daemon's that fetches from it.
func (l *Lab) Run(t testing.TB, c Command, wt string) Result {
	t.Helper()
	if c.Args != nil {
		return l.HostGit(t, wt, c.Args...)
	}
	l.n++
	scratch := filepath.Join(l.Dir, "scratch", strconv.Itoa(l.n))
	l.Git(t, l.Dir, "init", "-q", "--bare", scratch)
	l.Own(t) // the daemon's own scratch repository
	return l.HostGit(t, scratch, "fetch", "--no-tags", wt)
}

// Git runs git to build a layout (never to plant): clean environment, a
// fixed identity, and any failure fails the test.
func (l *Lab) Git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=Builder", "-c", "user.email=builder@example.invalid", "-c", "init.defaultBranch=main"}, args...)...)
	cmd.Dir, cmd.Env = dir, l.Env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return strings.TrimSpace(string(out))
}
