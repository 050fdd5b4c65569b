package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher/fsmonitor"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
)

// Pi's tools: the sandbox's git, with the settings the pi-session profile ships
// (checkStat minimal, no ctime, an untracked cache: docs/spec.md, "An
// agent's tools and the file path"), still sees what the host changes in
// the workspace mid-session, and host git, as the deployment user, sees
// what the agent changes, with no refresh of its own (issue 33). One
// sandbox of the profile as it ships, the image's git in it, a generated
// repository whose worktree is the workspace; the sandbox's git has
// already read the tree (a status, which writes its private index and
// untracked cache) before each host change. That the sandbox sees the
// host's files at all, and that a caching file mode would not, is the
// launcher's TestWorkspaceCoherence and its control.
func TestPiToolsGitSeesHostEdits(t *testing.T) { piToolsGitSeesHostEdits(t, false) }

// The same with the workspace monitor (the plan's fsmonitor grant, on by
// default in network mode sandbox): the sandbox's git asks the host which
// names changed, and every status must still say what a full scan says.
func TestPiToolsGitWithFSMonitor(t *testing.T) { piToolsGitSeesHostEdits(t, true) }

func piToolsGitSeesHostEdits(t *testing.T, fsmon bool) (*toolsSide, *toolsRepo) {
	im := image(t)
	host := filepath.Join(t.TempDir(), "host")
	r := genToolsRepo(t, host, 60)
	sbx := startToolsSandbox(t, im, host, r, "sandbox", fsmon)
	status := func(what string, want ...string) {
		t.Helper()
		out := sbx.output(t, "git status --porcelain")
		if fsmon {
			// A full scan, which writes no index: what the monitor's
			// answer must agree with.
			if full := sbx.output(t, "git -c core.fsmonitor=false --no-optional-locks status --porcelain"); full != out {
				t.Errorf("%s: with the monitor git status gave %q, a full scan %q", what, out, full)
			}
		}
		got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(got) == 1 && got[0] == "" {
			got = nil
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s: the sandbox's git status gave %q, want %q", what, got, want)
		}
	}
	status("the worktree as host git left it")
	status("again, with the token the first status stored")
	files := strings.Fields(sbx.output(t, "git ls-files -- src"))
	if len(files) < 4 {
		t.Fatalf("want 4 tracked files under src, got %q", files)
	}
	edit, gone, moved := files[0], files[1], files[2]
	// Appended to, deleted, renamed, and a new file in a directory the
	// untracked cache has seen: each as the user's editor or tools would.
	f, err := os.OpenFile(filepath.Join(r.ws, edit), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("// edited on the host\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Remove(filepath.Join(r.ws, gone)); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(r.ws, moved), filepath.Join(r.ws, moved+".moved")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(r.ws, filepath.Dir(edit), "host-new.txt"), "new\n")
	status("after the host's edits", " M "+edit, " D "+gone, " D "+moved, "?? "+moved+".moved", "?? "+filepath.Dir(edit)+"/host-new.txt")

	// The agent's changes, seen by host git as the deployment user.
	sbx.run(t, "echo agent >agent.txt && echo agent-edit >>"+files[3])
	if b, err := os.ReadFile(filepath.Join(r.ws, "agent.txt")); err != nil || string(b) != "agent\n" {
		t.Errorf("the agent's file on the host: %q, %v", b, err)
	}
	out, err := deployGit(t, r.ws, "status", "--porcelain")
	if err != nil {
		t.Fatalf("host git status: %v\n%s", err, out)
	}
	for _, want := range []string{" M " + files[3], "?? agent.txt", " M " + edit} {
		if !slices.Contains(strings.Split(out, "\n"), want) {
			t.Errorf("host git status lacks %q:\n%s", want, out)
		}
	}
	status("after the agent's changes", " M "+edit, " D "+gone, " D "+moved, "?? "+moved+".moved", "?? "+filepath.Dir(edit)+"/host-new.txt",
		" M "+files[3], "?? agent.txt")
	if fsmon {
		fsmonitorSteps(t, im, sbx, r)
	}
	return sbx, r
}

// fsmonitorSteps are the monitor's own cases, after the shared ones: the
// hook answers lists (the monitor is what git used), a link the agent
// plants out of the workspace is a name and never a place, and a flood
// past the reply's limit still gives git the right answer (everything
// changed: a full scan).
func fsmonitorSteps(t *testing.T, im imageInfo, sbx *toolsSide, r *toolsRepo) {
	t.Helper()
	full := func() string {
		return sbx.output(t, "git -c core.fsmonitor=false --no-optional-locks status --porcelain")
	}
	same := func(what string) {
		t.Helper()
		if got, want := sbx.output(t, "git status --porcelain"), full(); got != want {
			t.Errorf("%s: with the monitor git status gave %q, a full scan %q", what, got, want)
		}
	}
	// The hook, asked directly with the token the last status stored.
	ask := func() []string {
		t.Helper()
		out := sbx.output(t, `tok=$(`+fsmonitorTokenCmd+`) && `+fsmonitor.HookPath+` 2 "$tok" | tr '\0' '\n'`)
		return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	}
	same("settled")
	ans := ask()
	if len(ans) == 0 || !strings.HasPrefix(ans[0], "pp1:") || slices.Contains(ans[1:], "/") {
		t.Fatalf("the hook's answer to the stored token: %q, want a token and a list", ans)
	}

	// A link planted by the agent, pointing at a host directory outside
	// the workspace: the host then writes there. The watcher names the
	// link and nothing behind it.
	outside := filepath.Join(filepath.Dir(r.ws), "outside")
	write(t, filepath.Join(outside, "secret"), "s\n")
	sbx.run(t, "ln -s "+outside+" planted")
	same("a planted link")
	write(t, filepath.Join(outside, "secret"), "changed\n")
	write(t, filepath.Join(outside, "new"), "n\n")
	for _, n := range ask()[1:] {
		if strings.HasPrefix(n, "planted/") || n == "secret" || n == "new" {
			t.Errorf("the watcher reported %q, behind the planted link", n)
		}
	}

	// A flood past the reply's limit (fsmonitor.DefaultLimits.Paths).
	flood := filepath.Join(r.ws, "flood")
	for i := range fsmonitor.DefaultLimits.Paths + 500 {
		write(t, filepath.Join(flood, strconv.Itoa(i%50), strconv.Itoa(i)), "f")
	}
	if ans := ask(); !slices.Equal(ans[1:], []string{"/"}) {
		t.Errorf("after a flood past the limit the hook answered %d names, want everything", len(ans)-1)
	}
	same("after a flood past the limit")
	if err := os.RemoveAll(flood); err != nil {
		t.Fatal(err)
	}
	same("the flood removed")

	// A repository of the agent's own beneath the workspace: the hook,
	// which every git in the sandbox runs, must not answer it with the
	// workspace's names (it falls back to a full scan there).
	sbx.run(t, "mkdir nested && cd nested && git init -q && echo a >a.txt && git add a.txt && git -c user.name=a -c user.email=a@example.test commit -qm n && git status --porcelain && git status --porcelain")
	write(t, filepath.Join(r.ws, "nested", "a.txt"), "changed on the host\n")
	if got := sbx.output(t, "cd nested && git status --porcelain"); got != " M a.txt\n" {
		t.Errorf("a nested repository's status after a host edit: %q, want \" M a.txt\"", got)
	}

	// A host tool's Unix socket in the workspace: the sandbox, with the
	// monitor on, cannot connect to it (runsc runs without --host-uds;
	// threat 87). The control connects to the same socket from a sandbox
	// runsc runs with --host-uds=open, set by the test, never the product.
	sock := hostSocket(t, r.ws, "h.sock")
	if got := sbx.output(t, connectUnix); !strings.HasPrefix(got, "refused:") || sock.conns.Load() != 0 {
		t.Errorf("the sandbox with the monitor on connected to a host socket in the workspace: %q, %d connections", got, sock.conns.Load())
	}
	if got := hostUDSControl(t, im, r.ws); !strings.HasPrefix(got, "connected") || sock.conns.Load() == 0 {
		t.Errorf("control: under runsc --host-uds=open the same connect gave %q, %d connections; want it connected", got, sock.conns.Load())
	}

	res := sbx.finish()
	if st := res.FSMonitor; st == nil || st.Lists == 0 || st.Everything == 0 || st.Degraded {
		t.Errorf("the monitor's counters: %+v, want lists and everything answered, not degraded", st)
	} else {
		t.Logf("the monitor: %+v", *st)
	}
}

// fsmonitorTokenCmd prints the token the index stores (test-tool is not in
// the image: the FSMN extension read with od).
const fsmonitorTokenCmd = `git rev-parse --git-path index | xargs cat | tr '\0' '\n' | grep -a -o 'pp1:[0-9a-f]*:[0-9]*' | tail -n 1`

// connectUnix connects to h.sock in the working directory with the image's
// Perl (perl-base's Socket) and says what happened; it always exits 0.
const connectUnix = `perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die; ` +
	`if (connect($s, pack_sockaddr_un("h.sock"))) { print "connected\n" } else { print "refused: $!\n" }'`

type unixListener struct{ conns atomic.Int32 }

// hostSocket listens on a Unix socket named name in dir, as a host tool
// would leave one in the workspace (mode 0777: only the sandbox's reach
// decides), counting connections. Bound through the directory's
// descriptor: the test's path is longer than a socket address holds.
func hostSocket(t *testing.T, dir, name string) *unixListener {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), name)
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, name), 0o777); err != nil {
		t.Fatal(err)
	}
	u := &unixListener{}
	t.Cleanup(func() { ln.Close(); os.Remove(filepath.Join(dir, name)) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			c.Close()
		}
	}()
	return u
}

// hostUDSControl runs connectUnix in a sandbox of the test's own: the
// image's rootfs, ws bound at /ws (its cwd), the sandbox user, runsc with
// the launcher's fixed flags (launchplan.RunscFlags) plus --host-uds=open.
// It returns what the connect said.
func hostUDSControl(t *testing.T, im imageInfo, ws string) string {
	t.Helper()
	runsc := testbundle.Prerequisites(t)
	dir := t.TempDir()
	// runsc wants the rootfs's own path (the checkout's .image may be a link).
	rootfs, err := filepath.EvalSymlinks(im.Rootfs)
	if err != nil {
		t.Fatal(err)
	}
	spec := rspec.Spec{Version: rspec.Version, Root: &rspec.Root{Path: rootfs, Readonly: true},
		Process: &rspec.Process{User: rspec.User{UID: 1000, GID: 1000}, Cwd: "/ws", Env: []string{"PATH=/usr/bin:/bin"},
			Args: []string{"/bin/sh", "-c", connectUnix}},
		Mounts: []rspec.Mount{{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/ws", Type: "bind", Source: ws, Options: []string{"rbind", "rw"}}},
		Linux: &rspec.Linux{Namespaces: []rspec.LinuxNamespace{{Type: rspec.PIDNamespace}, {Type: rspec.IPCNamespace},
			{Type: rspec.UTSNamespace}, {Type: rspec.MountNamespace}, {Type: rspec.NetworkNamespace}}}}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "runsc-root")
	id := fmt.Sprintf("pp-hostuds-control-%d", os.Getpid())
	args := append(launchplan.RunscFlags(root, "none"), "--host-uds=open", "run", "--bundle", dir, id)
	out, err := exec.Command(runsc, args...).CombinedOutput()
	exec.Command(runsc, "--root", root, "delete", "--force", id).Run()
	// runsc leaves an nsfs mount under its root (as the launcher's
	// teardown knows), at times stacked: detach until none is left.
	for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
	}
	if err != nil {
		t.Fatalf("control: runsc %q: %v: %s", args, err, out)
	}
	return string(out)
}
