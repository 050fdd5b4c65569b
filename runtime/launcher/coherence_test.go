package launcher

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/runsc"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// The workspace is one tree seen from both sides while the agent runs
// (issue 33): what the host writes, deletes or renames mid-session is what
// the sandbox reads next, what the agent writes is on the host as soon as
// its command returns, and host git, as the deployment user, sees the
// agent's changes in `git status` with no refresh of its own. The sandbox
// is a long-lived shell reading one command a line, as Pi's bash tool
// runs commands, and each step first has the sandbox read what the host
// then changes, so a sandbox that cached what it read would answer from
// the cache. The control runs the same steps in the same compiled sandbox
// with runsc's --file-access-mounts=exclusive (the gofer mounts' data and
// names cached in the Sentry, as if nothing else wrote them): it must see
// stale data, so the test can fail. Exclusive access is a control only,
// never a setting: it would break exactly this.
func TestWorkspaceCoherence(t *testing.T) {
	s, ws := coherenceScene(t)
	sh := launchShell(t, s)
	if bad := coherenceSteps(t, sh, ws); len(bad) > 0 {
		t.Errorf("the sandbox and the host disagree on the workspace:\n%s", strings.Join(bad, "\n"))
	}
	sh.stop(t)
	s.assertClean(t)
}

func TestWorkspaceCoherenceControl(t *testing.T) {
	s, ws := coherenceScene(t)
	sh := bareShell(t, s, "--file-access-mounts=exclusive")
	bad := coherenceSteps(t, sh, ws)
	sh.stop(t)
	if len(bad) == 0 {
		t.Fatal("with --file-access-mounts=exclusive the sandbox still saw every host change: this test cannot tell a caching sandbox from a coherent one")
	}
	t.Logf("exclusive file access, as expected stale:\n%s", strings.Join(bad, "\n"))
}

// coherenceServer reads one command a line, runs it, and ends its output
// with "@@END <status>".
const coherenceServer = `while read -r line; do eval "$line"; echo "@@END $?"; done`

// coherenceScene compiles the reference facts with the server in place of
// Pi over a real repository: the workspace a linked worktree of it, both
// the sandbox user's, as Paseo lays them out.
func coherenceScene(t *testing.T) (*sandbox, string) {
	t.Helper()
	testbundle.Prerequisites(t)
	host := filepath.Join(t.TempDir(), "host")
	repo := filepath.Join(host, "srv/paseo/repos/proj")
	ws := filepath.Join(host, "srv/paseo/workspace/proj-feature")
	hostGit(t, "", "init", "-q", "-b", "main", repo)
	writeFileT(t, filepath.Join(repo, "README"), "proj\n")
	hostGit(t, repo, "add", "README")
	hostGit(t, repo, "commit", "-q", "-m", "init")
	hostGit(t, repo, "worktree", "add", "-q", "-b", "feature", ws)
	sc := testbundle.New(t, testbundle.Options{Host: host, Argv: testbundle.Script(coherenceServer)})
	chownTree(t, filepath.Join(host, "srv/paseo/repos"))
	chownTree(t, ws)
	// Host git runs as the deployment user, who must reach the tree: the
	// test's own directories beneath the temp dir (never the temp dir
	// itself) get search permission for others.
	tmp := filepath.Clean(os.TempDir())
	for d := filepath.Dir(host); strings.HasPrefix(d, tmp+"/"); d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, st.Mode().Perm()|0o011); err != nil {
			t.Fatal(err)
		}
	}
	return sceneSandbox(sc), ws
}

// coherenceSteps runs the steps and returns every disagreement.
func coherenceSteps(t *testing.T, sh *shell, ws string) []string {
	t.Helper()
	var bad []string
	expect := func(step, cmd, want string) {
		t.Helper()
		if got := sh.try(t, cmd); got != want {
			bad = append(bad, fmt.Sprintf("%s: the sandbox's %q gave %q, want %q", step, cmd, got, want))
		}
	}
	a, b, c := filepath.Join(ws, "a.txt"), filepath.Join(ws, "b.txt"), filepath.Join(ws, "c.txt")
	writeFileT(t, a, "one\n")
	expect("a file the host wrote", "cat "+a, "one\n")
	expect("a listing", "ls "+ws, "README\na.txt\n")

	// Rewritten in place (the same inode, as an editor that truncates does):
	// longer, then the same size within the same second.
	writeFileT(t, a, "two, longer\n")
	expect("the host rewrote it longer", "cat "+a, "two, longer\n")
	writeFileT(t, a, "TWO, LONGER\n")
	expect("the host rewrote it, same size", "cat "+a, "TWO, LONGER\n")
	// Replaced by a new file renamed over it (as git checkout and most
	// editors save).
	writeFileT(t, a+".tmp", "three\n")
	if err := os.Rename(a+".tmp", a); err != nil {
		t.Fatal(err)
	}
	expect("the host replaced it", "cat "+a, "three\n")

	writeFileT(t, b, "bee\n")
	expect("a file the host created", "ls "+ws, "README\na.txt\nb.txt\n")
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	expect("a file the host deleted", "cat "+a+" 2>/dev/null || echo gone", "gone\n")
	if err := os.Rename(b, c); err != nil {
		t.Fatal(err)
	}
	expect("a file the host renamed", "ls "+ws+"; cat "+c, "README\nc.txt\nbee\n")

	// The agent's writes, on the host when its command returns.
	sh.run(t, "echo from-agent > "+ws+"/agent.txt; echo edited >> "+ws+"/README")
	if got, err := os.ReadFile(filepath.Join(ws, "agent.txt")); err != nil || string(got) != "from-agent\n" {
		bad = append(bad, fmt.Sprintf("the agent's new file on the host: %q, %v", got, err))
	}
	if got := readFileT(t, filepath.Join(ws, "README")); got != "proj\nedited\n" {
		bad = append(bad, fmt.Sprintf("the agent's edit on the host: %q", got))
	}
	// Host git as the deployment user, its index untouched since the
	// worktree was made: the stat data it recorded must not hide the edit.
	if got := deployGitStatus(t, ws); got != " M README\n?? agent.txt\n?? c.txt\n" {
		bad = append(bad, fmt.Sprintf("host git status: %q", got))
	}
	return bad
}

// shell is the server running in a sandbox.
type shell struct {
	in   io.WriteCloser
	out  *bufio.Reader
	errb *bytes.Buffer
	wait func() (Result, error)
}

// run sends one command and returns its output; a status other than 0
// fails the test.
func (sh *shell) run(t *testing.T, cmd string) string {
	t.Helper()
	out := sh.try(t, cmd)
	if i := strings.LastIndex(out, "[status "); i >= 0 {
		t.Fatalf("%q: %s", cmd, out)
	}
	return out
}

// try sends one command and returns its output, followed by
// "[status N]" when N is not 0.
func (sh *shell) try(t *testing.T, cmd string) string {
	t.Helper()
	if _, err := io.WriteString(sh.in, cmd+"\n"); err != nil {
		t.Fatalf("%q: %v", cmd, err)
	}
	var out strings.Builder
	for {
		line, err := sh.out.ReadString('\n')
		if err != nil {
			t.Fatalf("%q: the sandbox's shell ended (%v) after %q; stderr: %s", cmd, err, out.String(), sh.errb)
		}
		if st, ok := strings.CutPrefix(line, "@@END "); ok {
			if st != "0\n" {
				fmt.Fprintf(&out, "[status %s]", strings.TrimSpace(st))
			}
			return out.String()
		}
		out.WriteString(line)
	}
}

func (sh *shell) stop(t *testing.T) {
	t.Helper()
	sh.in.Close()
	res, err := sh.wait()
	if err != nil || res.ExitCode != 0 {
		t.Errorf("the sandbox: %v, exit %d (%s); stderr: %s", err, res.ExitCode, res.Reason, sh.errb)
	}
}

// launchShell launches the scene as the product does.
func launchShell(t *testing.T, s *sandbox) *shell {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sh := &shell{in: inW, out: bufio.NewReader(outR), errb: &bytes.Buffer{}}
	var log bytes.Buffer
	done := make(chan struct{})
	var res Result
	var err error
	go func() {
		defer close(done)
		res, err = Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
			Secrets: staticSecret("v"), Stdin: inR, Stdout: outW, Stderr: sh.errb, Log: &log})
		outW.Close()
	}()
	sh.wait = func() (Result, error) {
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("the sandbox did not end after its input closed")
		}
		if len(res.Teardown) > 0 || log.Len() > 0 {
			t.Errorf("teardown failed: %v\nlog: %s", res.Teardown, log.String())
		}
		return res, err
	}
	t.Cleanup(func() { inW.Close() })
	return sh
}

// bareShell runs the same run dir the launcher would hand runsc, with
// extra runsc flags: the controls.
func bareShell(t *testing.T, s *sandbox, flags ...string) *shell {
	t.Helper()
	plan, err := launchplan.Load(s.bundle)
	if err != nil {
		t.Fatal(err)
	}
	id := newID()
	rs := &runsc.Runner{Path: s.runsc, Root: statedir.RunscRoot(s.state), Network: "none"}
	if err := os.MkdirAll(rs.Root, 0o700); err != nil {
		t.Fatal(err)
	}
	run, err := newRunDir(s.state, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run.remove() })
	spec, err := run.materialize(plan)
	if err != nil {
		t.Fatal(err)
	}
	staged, err := run.stageBinds(plan)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.writeSpec(spec, runtimeState{cgroupsPath: statedir.CgroupsPath(id), privateRoot: true, binds: staged}); err != nil {
		t.Fatal(err)
	}
	cmd := rs.Command(id, run.dir)
	i := slices.Index(cmd.Args, "run")
	cmd.Args = slices.Insert(cmd.Args, i, flags...)
	sh := &shell{errb: &bytes.Buffer{}}
	cmd.Stderr = sh.errb
	if sh.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sh.out = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); rs.Delete(id) })
	sh.wait = func() (Result, error) {
		err := cmd.Wait()
		rs.Delete(id)
		return Result{}, err
	}
	return sh
}

// hostGit runs the host's git as root to build the layout.
func hostGit(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.test"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// deployGitStatus is `git status --porcelain` in dir as the deployment
// user (uid 1000, who owns the tree), with no config of its own.
func deployGitStatus(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command("git", "status", "--porcelain")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("host git status: %v\n%s", err, out)
	}
	return string(out)
}
