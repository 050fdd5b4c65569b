package e2e

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// dialAs connects to the supervisor as uid/gid (SO_PEERCRED is the
// connecting thread's): a thread of its own takes the ids with raw
// per-thread syscalls and dies with its goroutine, so no other thread of
// the test ever runs as them.
func dialAs(t *testing.T, socket string, id int) *supervisor.Client {
	t.Helper()
	type dialed struct {
		c   *supervisor.Client
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		for _, sc := range []struct{ nr, a, b, c uintptr }{
			{unix.SYS_SETGROUPS, 0, 0, 0},
			{unix.SYS_SETRESGID, uintptr(id), uintptr(id), uintptr(id)},
			{unix.SYS_SETRESUID, uintptr(id), uintptr(id), uintptr(id)},
		} {
			if _, _, errno := unix.RawSyscall(sc.nr, sc.a, sc.b, sc.c); errno != 0 {
				ch <- dialed{err: errno}
				return
			}
		}
		c, err := supervisor.Dial(socket)
		ch <- dialed{c, err}
	}()
	d := <-ch
	if d.err != nil {
		t.Fatalf("dial as %d: %v", id, d.err)
	}
	t.Cleanup(func() { d.c.Close() })
	return d.c
}

// The supervisor's gitImport with the real Pi in gVisor: the daemon (uid
// 1000, the repository's owner) creates the sandbox, so the supervisor
// records the branch's value as that uid; Pi's bash RPC command commits
// in the linked worktree (into the agent's store: the repository stays
// read-only); gitImport, asked on the daemon's connection, brings the
// commit onto the worktree's branch, with git run as the daemon (no file
// of root's in the repository) and fsck clean. The host then moves the
// branch: the next gitImport answers PP-GIT-IMPORT-MOVED as data and
// leaves it. Control: before the import the commit is nowhere on the host.
func TestPiGitImportThroughSupervisor(t *testing.T) {
	e := newEnv(t)
	repo := filepath.Join(e.host, "srv/paseo/repos/proj")
	ws := filepath.Join(e.host, "srv/paseo/workspace/proj-feature")
	common := filepath.Join(repo, ".git")
	initRepo(t, repo)
	hostSetupGit(t, "-C", repo, "worktree", "add", "-q", "-b", "feature", ws)
	sc := e.scene(t, "pi-session", "")
	chownTree(t, repo, daemonUID, daemonUID)
	chownTree(t, ws, daemonUID, daemonUID)
	searchable(t, common)
	base := hostRev(t, common, "refs/heads/feature")

	dir, err := os.MkdirTemp("/run", "paseo-e2e-gitimport-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	socket := filepath.Join(dir, "supervisor.sock")
	srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry},
		Socket: socket, SocketGID: daemonUID, StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: secrets,
		Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	go func() { _ = srv.Listen(sctx) }()
	t.Cleanup(func() { cancel(); srv.Shutdown() })
	dialSupervisor(t, socket).Close() // up

	c := ctx(t)
	cl := dialAs(t, socket, daemonUID)
	var in supervisor.Info
	if err := cl.Call(c, supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts}, &in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Call(context.Background(), supervisor.Request{Op: "delete", Sandbox: in.Sandbox}, nil) })
	var att struct{ Epoch uint64 }
	if err := cl.Call(c, supervisor.Request{Op: "attach", Sandbox: in.Sandbox}, &att); err != nil {
		t.Fatal(err)
	}
	tr := &stream{}
	commit := func(id, msg string) {
		t.Helper()
		line := `{"id":"` + id + `","type":"bash","command":"cd ` + ws + ` && export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@example.test GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@example.test && git commit -q --allow-empty -m ` + msg + ` && echo commit-ok"}` + "\n"
		if err := cl.Call(c, supervisor.Request{Op: "write", Sandbox: in.Sandbox, Epoch: att.Epoch, InputID: id, Data: []byte(line)}, nil); err != nil {
			t.Fatal(err)
		}
		if !tr.until(t, cl, in.Sandbox, `"id":"`+id+`"`, 90*time.Second) || !strings.Contains(tr.Stdout.String()[tr.from:], "commit-ok") {
			t.Fatalf("the commit in the sandbox: %q", tr.tail())
		}
		tr.from = tr.Stdout.Len()
	}
	gitImport := func() supervisor.GitImportResult {
		t.Helper()
		var res supervisor.GitImportResult
		if err := cl.Call(c, supervisor.Request{Op: supervisor.OpGitImport, Sandbox: in.Sandbox}, &res); err != nil {
			t.Fatalf("gitImport: %v", err)
		}
		return res
	}

	commit("b1", "by-agent-via-supervisor")
	if got, _ := deployGit(t, repo, "log", "--all", "--format=%s"); strings.Contains(got, "by-agent-via-supervisor") {
		t.Fatalf("control: the commit is on the host before any import: %q", got)
	}
	res := gitImport()
	head := hostRev(t, common, "refs/heads/feature")
	if len(res.Diagnostics) != 0 || len(res.Updated) != 1 || res.Updated[0].Ref != "refs/heads/feature" || res.Updated[0].Old != base ||
		res.Updated[0].New != head || res.Base != head || res.Branch != "refs/heads/feature" {
		t.Fatalf("gitImport: %+v (branch now %s, base %s)", res, head, base)
	}
	if got, err := deployGit(t, repo, "log", "-1", "--format=%s", "refs/heads/feature"); err != nil || got != "by-agent-via-supervisor\n" {
		t.Errorf("the branch's head: %q %v", got, err)
	}
	if got, err := deployGit(t, repo, "fsck", "--strict", "--no-dangling"); err != nil || strings.TrimSpace(got) != "" {
		t.Errorf("fsck after the import: %v %q", err, got)
	}
	_ = filepath.Walk(common, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*unix.Stat_t); ok && st.Uid == 0 {
			t.Errorf("a file of root's in the daemon's repository after the import: %s", p)
		}
		return nil
	})

	// The host moves the branch; the agent commits again.
	if out, err := deployGit(t, repo, "update-ref", "refs/heads/feature", base); err != nil {
		t.Fatalf("host move: %v %s", err, out)
	}
	commit("b2", "second-by-agent")
	res = gitImport()
	if len(res.Diagnostics) != 1 || res.Diagnostics[0].Code != diag.GitImportMoved || len(res.Updated) != 0 || res.Base != head {
		t.Errorf("after the host moved the branch: %+v", res)
	}
	if got := hostRev(t, common, "refs/heads/feature"); got != base {
		t.Errorf("a refused import moved the branch: %s, the host had %s", got, base)
	}
}
