package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// These tests run the supervisor with real runsc and the static fake Pi
// (root, bin/runsc, busybox): the protocol, peer checks, the bridge's
// continuity across 20 client disconnects, fencing, duplicate inputs,
// restart reconciliation and clean deletion.

const (
	allowedUID = 0    // the test process (root) is bound to host-alice
	otherUID   = 4242 // a peer bound to nothing
	socketGID  = 4242
)

type fixture struct {
	sc     *testbundle.Scene
	socket string
	cfg    Config
	srv    *Server
	cancel context.CancelFunc
	served chan error
}

// newFixture compiles nothing itself: the supervisor compiles the scene's
// facts against its registry. turnMS sets how long a fake Pi turn streams.
func newFixture(t *testing.T, turnMS int) *fixture {
	return newFixtureAgent(t, testbundle.BuildStatic(t, "./test/cmd/fake-pi"), turnMS)
}

// newFixtureAgent is newFixture with bin (a host file) as the image's pi.
func newFixtureAgent(t *testing.T, bin string, turnMS int) *fixture {
	sc := testbundle.New(t, testbundle.Options{
		Argv:          []string{"/usr/local/bin/pi", "--mode", "rpc"},
		RootfsFiles:   map[string]string{"/usr/local/bin/pi": bin},
		RegistryPatch: fmt.Sprintf(`{"deployments":{"host-alice":{"peers":{"uids":[%d],"gids":[4243]}}}}`, allowedUID),
	})
	// The real pi-session profile runs "pi --mode rpc --model ... --extension ...";
	// the fake accepts those flags and reads its knobs from the workspace.
	write(t, filepath.Join(sc.Workspace(), ".fake-pi-env"), fmt.Sprintf("FAKE_PI_TURN_MS=%d\nFAKE_PI_UPDATES=100\n", turnMS))
	dir, err := os.MkdirTemp("/run", "paseo-supervisor-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fixture{sc: sc, socket: filepath.Join(dir, "supervisor.sock")}
	f.cfg = Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry}, Socket: f.socket, SocketGID: socketGID,
		StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: func(_, _ string) ([]byte, error) { return []byte("test-key"), nil }}
	f.sweepHolders(t)
	f.start(t)
	return f
}

func (f *fixture) start(t *testing.T) {
	srv, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.srv, f.cancel, f.served = srv, cancel, make(chan error, 1)
	go func() { f.served <- srv.Listen(ctx) }()
	for i := 0; ; i++ {
		if c, err := Dial(f.socket); err == nil {
			c.Close()
			break
		}
		select {
		case err := <-f.served:
			t.Fatalf("the supervisor stopped listening: %v", err)
		default:
		}
		if i == 200 {
			t.Fatal("the supervisor socket never came up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		cancel()
		srv.Shutdown()
	})
}

// sweepHolders makes sure no holder outlives the test, even one whose
// supervisor the test killed before it could delete: at the very end, a
// supervisor over the same state adopts whatever is left and deletes it.
func (f *fixture) sweepHolders(t *testing.T) {
	t.Cleanup(func() {
		cfg := f.cfg
		cfg.Socket = ""
		if srv, err := New(cfg); err == nil {
			srv.Shutdown()
		}
	})
}

// stop stops the fixture's supervisor as SIGTERM would: its sandboxes go
// on in their holders.
func (f *fixture) stop() {
	f.cancel()
	f.srv.Close()
	<-f.served
	_ = os.Remove(f.socket)
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) dial(t *testing.T) *Client {
	c, err := Dial(f.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func (f *fixture) create(t *testing.T, c *Client) Info {
	var in Info
	if err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: f.sc.Facts}, &in); err != nil {
		t.Fatalf("createSandbox: %v", err)
	}
	return in
}

// transcript is the test's Transcript: a gap or duplicate fails the test.
type transcript struct{ Transcript }

func (tr *transcript) add(t *testing.T, e Event) {
	if err := tr.Add(e); err != nil {
		t.Fatal(err)
	}
}

// frames parses the transcript as Pi JSONL.
func (tr *transcript) frames(t *testing.T) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(tr.Stdout.Bytes()))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("transcript line is not JSON: %q", sc.Text())
		}
		out = append(out, m)
	}
	return out
}

// readUntil reads events into tr until the transcript contains want (or
// the deadline passes), then acknowledges what it holds.
func readUntil(t *testing.T, c *Client, id string, tr *transcript, want string, d time.Duration) bool {
	deadline := time.After(d)
	for !strings.Contains(tr.Stdout.String(), want) {
		select {
		case e, ok := <-c.Events:
			if !ok {
				return false
			}
			tr.add(t, e)
		case <-deadline:
			return false
		}
	}
	_ = c.Call(tctx(t), Request{Op: "ack", Sandbox: id, Cursor: tr.Cursor}, nil)
	return true
}

// A turn streams for several seconds while the client connection is
// dropped twenty times mid-turn; every reattach from the last acknowledged
// cursor continues exactly there, the transcript is complete, ordered and
// free of duplicates, and the turn ends with agent_settled. Writes from a
// superseded epoch are refused, a retried input id is applied once, and an
// abort sent after a reattach reaches Pi.
func TestContinuityAcrossDisconnects(t *testing.T) {
	f := newFixture(t, 6000)
	c := f.dial(t)
	in := f.create(t, c)
	if in.Status != StatusRunning || in.Profile != "pi-session" {
		t.Fatalf("created: %+v", in)
	}
	var att struct{ Epoch uint64 }
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox, Cursor: 0}, &att); err != nil {
		t.Fatal(err)
	}
	send := func(c *Client, epoch uint64, inputID, line string) (bool, error) {
		var r struct{ Applied bool }
		err := c.Call(tctx(t), Request{Op: "write", Sandbox: in.Sandbox, Epoch: epoch, InputID: inputID, Data: []byte(line + "\n")}, &r)
		return r.Applied, err
	}
	if _, err := send(c, att.Epoch, "in-1", `{"id":"p1","type":"prompt","message":"stream for a while"}`); err != nil {
		t.Fatal(err)
	}
	tr := &transcript{}
	if !readUntil(t, c, in.Sandbox, tr, `"message_update"`, 30*time.Second) {
		t.Fatalf("no streaming started: %q", tr.Stdout.String())
	}
	oldEpoch := att.Epoch
	for i := 0; i < 20; i++ {
		c.Close() // the daemon's connection dies mid-turn
		c = f.dial(t)
		if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor}, &att); err != nil {
			t.Fatalf("reattach %d: %v", i, err)
		}
		if att.Epoch <= oldEpoch {
			t.Fatalf("reattach %d: epoch %d not newer than %d", i, att.Epoch, oldEpoch)
		}
		if _, err := send(c, oldEpoch, fmt.Sprintf("stale-%d", i), `{"type":"get_state"}`); !isCode(err, rpcerr.Fenced) {
			t.Fatalf("a write with a superseded epoch: %v", err)
		}
		oldEpoch = att.Epoch
		// Read a little of the live stream before the next drop.
		n := tr.Cursor
		deadline := time.After(400 * time.Millisecond)
	drain:
		for tr.Cursor < n+2 {
			select {
			case e := <-c.Events:
				tr.add(t, e)
			case <-deadline:
				break drain
			}
		}
		_ = c.Call(tctx(t), Request{Op: "ack", Sandbox: in.Sandbox, Cursor: tr.Cursor}, nil)
	}
	if !readUntil(t, c, in.Sandbox, tr, `"agent_settled"`, 60*time.Second) {
		t.Fatalf("the turn never settled; transcript tail: %q", tail(tr.Stdout.String()))
	}
	frames := tr.frames(t)
	var types []string
	for _, fr := range frames {
		types = append(types, fmt.Sprint(fr["type"]))
	}
	joined := strings.Join(types, ",")
	if !strings.HasPrefix(joined, "response,agent_start") || !strings.HasSuffix(joined, "agent_settled") {
		t.Errorf("transcript frame order: %s", joined)
	}

	// Duplicate input ids are applied once.
	a1, err1 := send(c, att.Epoch, "dup-1", `{"id":"s1","type":"get_state"}`)
	a2, err2 := send(c, att.Epoch, "dup-1", `{"id":"s1","type":"get_state"}`)
	if err1 != nil || err2 != nil || !a1 || a2 {
		t.Fatalf("duplicate input: %v %v %v %v", a1, err1, a2, err2)
	}
	if !readUntil(t, c, in.Sandbox, tr, `"id":"s1"`, 30*time.Second) {
		t.Fatal("no get_state response")
	}
	time.Sleep(300 * time.Millisecond)
	if n := strings.Count(tr.Stdout.String(), `"id":"s1"`); n != 1 {
		t.Errorf("a duplicated input was applied %d times", n)
	}

	// Abort after a reattach.
	if _, err := send(c, att.Epoch, "in-2", `{"id":"p2","type":"prompt","message":"again"}`); err != nil {
		t.Fatal(err)
	}
	if !readUntil(t, c, in.Sandbox, tr, `"id":"p2"`, 30*time.Second) {
		t.Fatal("second prompt not answered")
	}
	c.Close()
	c = f.dial(t)
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor}, &att); err != nil {
		t.Fatal(err)
	}
	before := tr.Stdout.Len()
	if _, err := send(c, att.Epoch, "in-3", `{"id":"a1","type":"abort"}`); err != nil {
		t.Fatal(err)
	}
	if !readUntil(t, c, in.Sandbox, tr, `"id":"a1"`, 30*time.Second) {
		t.Fatalf("no abort response: %q", tail(tr.Stdout.String()))
	}
	after := tr.Stdout.String()[before:]
	if i, j := strings.Index(after, `"agent_settled"`), strings.Index(after, `"id":"a1"`); i < 0 || i > j || !strings.Contains(after, `"aborted"`) {
		t.Errorf("abort after reattach: %q", tail(after))
	}

	// Delete leaves nothing behind.
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}

func tail(s string) string {
	if len(s) > 600 {
		return s[len(s)-600:]
	}
	return s
}

func isCode(err error, code rpcerr.Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// assertNothingLeft checks the state root and runsc after delete.
func (f *fixture) assertNothingLeft(t *testing.T) {
	t.Helper()
	entries, err := inventory.Inventory{StateRoot: f.sc.State, RunscPath: f.sc.Runsc}.PS()
	if err != nil || len(entries) != 0 {
		t.Errorf("left after delete: %+v %v", entries, err)
	}
	for _, d := range []string{"run", "records", "net/netns", "net/leases", "bundles", "holders"} {
		if ents, _ := os.ReadDir(filepath.Join(f.sc.State, d)); len(ents) > 0 {
			t.Errorf("%s left: %v", d, ents)
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), f.sc.State) {
		t.Errorf("mounts left under %s", f.sc.State)
	}
}

// A peer not bound to a deployment is refused; facts naming another
// deployment than the request are refused; garbage is a typed error that
// changes nothing; ids of other deployments are not visible.
func TestPeerChecksAndMalformedRequests(t *testing.T) {
	f := newFixture(t, 200)
	c := f.dial(t)
	err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "docker-official", Facts: f.sc.Facts}, nil)
	if !isCode(err, rpcerr.Forbidden) {
		t.Errorf("a deployment the peer is not bound to: %v", err)
	}
	smuggled := bytes.Replace(f.sc.Facts, []byte(`"host-alice"`), []byte(`"docker-official"`), 1)
	err = c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: smuggled}, nil)
	if !isCode(err, rpcerr.Forbidden) {
		t.Errorf("facts naming another deployment: %v", err)
	}
	err = c.Call(tctx(t), Request{Op: "rm -rf", Sandbox: "x"}, nil)
	if !isCode(err, rpcerr.UnknownOp) {
		t.Errorf("unknown op: %v", err)
	}
	err = c.Call(tctx(t), Request{Op: "inspect", Sandbox: "pp-0000000000000000"}, nil)
	if !isCode(err, rpcerr.NotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	// Raw garbage and unknown fields on a fresh connection.
	raw, err := net.Dial("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, line := range []string{`not json`, `{"v":1,"id":"x","op":"list","argv":["runsc"]}`, `{"v":2,"id":"y","op":"list"}`} {
		if _, err := raw.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	var list []Info
	if err := c.Call(tctx(t), Request{Op: "list"}, &list); err != nil || len(list) != 0 {
		t.Errorf("garbage changed something: %+v %v", list, err)
	}

	// A process of another uid can connect (socket group) but not create.
	out, err := asOtherUser(t, f.socket, f.sc.Facts)
	if err != nil || !strings.Contains(out, string(rpcerr.Forbidden)) {
		t.Errorf("peer uid %d: %q %v", otherUID, out, err)
	}
}

// The helper process is a client of another uid.
func TestHelperOtherPeer(t *testing.T) {
	sock := os.Getenv("PASEO_TEST_PEER_SOCKET")
	if sock == "" {
		return
	}
	facts, _ := os.ReadFile(os.Getenv("PASEO_TEST_PEER_FACTS"))
	c, err := Dial(sock)
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	err = c.Call(context.Background(), Request{Op: "createSandbox", Deployment: "host-alice", Facts: facts}, nil)
	fmt.Println("result:", err)
}

func asOtherUser(t *testing.T, socket string, facts []byte) (string, error) {
	dir, err := os.MkdirTemp("/run", "paseo-peer-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	_ = os.Chmod(dir, 0o755)
	factsFile := filepath.Join(dir, "facts.json")
	write(t, factsFile, string(facts))
	exe := filepath.Join(dir, "client")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestHelperOtherPeer$")
	cmd.Env = []string{"PASEO_TEST_PEER_SOCKET=" + socket, "PASEO_TEST_PEER_FACTS=" + factsFile}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUID, Gid: socketGID}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// A supervisor killed with SIGKILL in the middle of a streaming turn. The
// sandbox's holder keeps its stdio and bridge, so the turn goes on; the
// next supervisor adopts it as running-unattached, a client reattaches from
// its last acknowledged cursor and receives the rest of the turn with no
// gap or duplicate, through agent_settled; delete then leaves nothing,
// holder included. Killing a holder instead ends its sandbox (runsc run is
// its child), which the supervisor reports with its output lost.
func TestSupervisorRestartKeepsTheTurn(t *testing.T) {
	f := newFixture(t, 5000)
	f.stop()

	sup := f.supervisorProcess(t)
	c := f.waitDial(t)
	in := f.create(t, c)
	var att struct{ Epoch uint64 }
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox}, &att); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(tctx(t), Request{Op: "write", Sandbox: in.Sandbox, Epoch: att.Epoch, InputID: "p1",
		Data: []byte(`{"id":"p1","type":"prompt","message":"stream"}` + "\n")}, nil); err != nil {
		t.Fatal(err)
	}
	tr := &transcript{}
	if !readUntil(t, c, in.Sandbox, tr, `"message_update"`, 30*time.Second) {
		t.Fatalf("no streaming started: %q", tr.Stdout.String())
	}
	_ = sup.Process.Kill() // the supervisor dies mid-turn
	_ = sup.Wait()
	c.Close()
	_ = os.Remove(f.socket)

	f.start(t) // a new supervisor over the same state
	c = f.dial(t)
	var got Info
	if err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: in.Sandbox}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status != StatusRunningUnattached {
		t.Fatalf("after restart: %+v", got)
	}
	// Only root reaches a holder: its socket is 0600 in a 0700 directory.
	for p, want := range map[string]os.FileMode{HolderDir(f.sc.State): 0o700, holderSocket(f.sc.State, in.Sandbox): 0o600} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want || fi.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s: %v %v, want root-owned %v", p, fi.Mode(), err, want)
		}
	}
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor}, &att); err != nil {
		t.Fatalf("reattach after restart: %v", err)
	}
	if !readUntil(t, c, in.Sandbox, tr, `"agent_settled"`, 60*time.Second) {
		t.Fatalf("the turn did not go on after the restart: %q", tail(tr.Stdout.String()))
	}
	var types []string
	for _, fr := range tr.frames(t) {
		types = append(types, fmt.Sprint(fr["type"]))
	}
	if joined := strings.Join(types, ","); !strings.HasPrefix(joined, "response,agent_start") || !strings.HasSuffix(joined, "agent_settled") ||
		strings.Count(joined, "agent_settled") != 1 {
		t.Errorf("transcript across the restart: %s", joined)
	}
	if err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: in.Sandbox}, &got); err != nil || got.Status != StatusRunning {
		t.Errorf("after reattach: %+v %v", got, err)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)

	// A holder that dies takes its sandbox with it.
	in = f.create(t, c)
	holder := holderPID(t, f.sc.State, in.Sandbox)
	if err := syscall.Kill(holder, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: in.Sandbox}, &got); err != nil {
			t.Fatal(err)
		}
		if got.Status == StatusExited || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got.Status != StatusExited || !strings.Contains(got.Reason, "holder") || got.ExitCode != nil {
		t.Fatalf("after the holder died: %+v", got)
	}
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox}, nil); !isCode(err, rpcerr.State) {
		t.Errorf("attach without a holder: %v", err)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}

// supervisorProcess runs the real `paseo-policy supervise` over the
// fixture's state, as systemd would, so the test can kill it; its holders
// are that binary re-executed.
func (f *fixture) supervisorProcess(t *testing.T) *exec.Cmd {
	bin := testbundle.BuildStatic(t, "./cmd/paseo-policy")
	dir := t.TempDir()
	regFile, secrets := filepath.Join(dir, "registry.json"), filepath.Join(dir, "secrets")
	write(t, regFile, string(f.sc.Registry))
	// One directory per deployment: <secrets>/<deployment>/<ref>.
	for _, ref := range []string{"alice/fake-llm", "paseo/mcp-token"} {
		p := filepath.Join(secrets, "host-alice", ref)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("test-key\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "supervise", "--registry", regFile, "--socket", f.socket, "--socket-group", fmt.Sprint(socketGID),
		"--state-root", f.sc.State, "--runsc", f.sc.Runsc, "--secrets-dir", secrets)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

func (f *fixture) waitDial(t *testing.T) *Client {
	for i := 0; i < 200; i++ {
		if c, err := Dial(f.socket); err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the supervisor socket never came up")
	return nil
}

// holderPID is the pid of the sandbox's holder, which its launch record
// names as the launcher.
func holderPID(t *testing.T, state, id string) int {
	recs, err := statedir.Records(state)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == id {
			return r.LauncherPID
		}
	}
	t.Fatalf("no launch record for %s", id)
	return 0
}

// The official Docker topology: the daemon in its container names
// container paths; the registry maps them to host paths. A sandbox created
// through the supervisor runs with its workspace and state at the
// container paths, and what it writes lands in the mapped host dirs. A
// host path smuggled into docker facts is refused.
func TestDockerTopology(t *testing.T) {
	bin := testbundle.BuildStatic(t, "./test/cmd/fake-pi")
	sc := testbundle.New(t, testbundle.Options{
		Argv:          []string{"/usr/local/bin/pi", "--mode", "rpc"},
		RootfsFiles:   map[string]string{"/usr/local/bin/pi": bin},
		RegistryPatch: fmt.Sprintf(`{"deployments":{"docker-official":{"peers":{"uids":[%d],"gids":[4243]}}}}`, allowedUID),
	})
	hostWS := filepath.Join(sc.Host, "srv/paseo-docker/workspace/app")
	for _, d := range []string{hostWS, filepath.Join(sc.Host, "srv/paseo-docker/state/pi-agent"), filepath.Join(sc.Host, "srv/paseo-docker/state/pi-sessions/agent-b2"),
		filepath.Join(sc.Host, "srv/paseo-docker/state/pi-cache/agent-b2")} {
		if err := os.Chown(d, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(hostWS, ".fake-pi-env"), "FAKE_PI_TURN_MS=200\n")
	dockerFacts, err := patchJSON(sc.Facts, `{"deployment":{"id":"docker-official"},"agent":{"id":"agent-b2"},"workspace":{"cwd":"/workspace/app","git":null},
		"state":{"agentDir":"/paseo-state/pi-agent","sessionDir":"/paseo-state/pi-sessions/agent-b2","cacheDir":"/paseo-state/pi-cache/agent-b2"},
		"launch":{"extension":"/tmp/paseo-pi-extension-b2/paseo-integration.mjs","mcpConfig":"/tmp/paseo-pi-mcp-b2/mcp.json"}}`)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/run", "paseo-supervisor-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := &fixture{sc: sc, socket: filepath.Join(dir, "supervisor.sock")}
	f.cfg = Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry}, Socket: f.socket, SocketGID: socketGID,
		StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: func(_, _ string) ([]byte, error) { return []byte("test-key"), nil }}
	f.sweepHolders(t)
	f.start(t)
	c := f.dial(t)

	smuggled, _ := patchJSON(dockerFacts, `{"workspace":{"cwd":"`+hostWS+`"}}`)
	if err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "docker-official", Facts: smuggled}, nil); !isCode(err, rpcerr.Refused) || !strings.Contains(err.Error(), "workspace.cwd") {
		t.Errorf("a host path in docker facts: %v", err)
	}

	var in Info
	if err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "docker-official", Facts: dockerFacts}, &in); err != nil {
		t.Fatal(err)
	}
	var att struct{ Epoch uint64 }
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox}, &att); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(tctx(t), Request{Op: "write", Sandbox: in.Sandbox, Epoch: att.Epoch, InputID: "1",
		Data: []byte(`{"id":"p","type":"prompt","message":"hi"}` + "\n")}, nil); err != nil {
		t.Fatal(err)
	}
	tr := &transcript{}
	if !readUntil(t, c, in.Sandbox, tr, `"agent_settled"`, 30*time.Second) {
		t.Fatalf("no turn: %q", tail(tr.Stdout.String()))
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	logs, _ := filepath.Glob(filepath.Join(sc.Host, "srv/paseo-docker/state/pi-sessions/agent-b2", "*.jsonl"))
	if len(logs) != 1 {
		t.Fatalf("the session log did not land in the mapped host dir: %v", logs)
	}
	head, _ := os.ReadFile(logs[0])
	if !strings.Contains(string(head), `"cwd":"/workspace/app"`) {
		t.Errorf("the agent did not run at the container path: %.200s", head)
	}
	f.assertNothingLeft(t)
}

func patchJSON(doc []byte, patch string) ([]byte, error) {
	var a, p map[string]any
	if err := json.Unmarshal(doc, &a); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(patch), &p); err != nil {
		return nil, err
	}
	merge(a, p)
	return json.Marshal(a)
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		if v == nil {
			delete(dst, k)
			continue
		}
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// The socket's directory must be root-owned, not writable by others and
// searchable by the socket's group, and not the state root (which the
// launcher keeps 0700): otherwise the supervisor does not start.
func TestSocketDirectoryChecks(t *testing.T) {
	skip.UnlessRoot(t, "it makes root-owned socket directories under /run")
	reg, err := os.ReadFile(testbundle.Repo(t, "testdata/base/registry.json"))
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	for _, tc := range []struct {
		name string
		mode os.FileMode
		want string
	}{
		{"group writable", 0o775, "no one else can write"},
		{"not searchable", 0o700, "searchable"},
	} {
		dir, err := os.MkdirTemp("/run", "paseo-socketdir-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		if err := os.Chmod(dir, tc.mode); err != nil {
			t.Fatal(err)
		}
		srv, err := New(Config{Registry: schema.Input{Name: "registry.json", Data: reg}, Socket: filepath.Join(dir, "s.sock"), StateRoot: state})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Listen(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	srv, err := New(Config{Registry: schema.Input{Name: "registry.json", Data: reg}, Socket: filepath.Join(state, "s.sock"), StateRoot: state})
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(state, 0o755)
	if err := srv.Listen(context.Background()); err == nil || !strings.Contains(err.Error(), "state root") {
		t.Errorf("socket in the state root: %v", err)
	}
}

// An ended sandbox that nobody deletes: its holder keeps the output for
// HolderLinger after the last connection closed, then exits on its own;
// the supervisor then reports the sandbox ended with its output lost, and
// delete still removes every trace.
func TestHolderLingersThenExits(t *testing.T) {
	f := newFixture(t, 200)
	f.stop()
	f.cfg.HolderLinger = time.Second
	f.start(t)

	c := f.dial(t)
	in := f.create(t, c)
	var att struct{ Epoch uint64 }
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox}, &att); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(tctx(t), Request{Op: "closeInput", Sandbox: in.Sandbox, Epoch: att.Epoch}, nil); err != nil {
		t.Fatal(err)
	}
	var got Info
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: in.Sandbox}, &got); err != nil {
			t.Fatal(err)
		}
		if got.Status == StatusExited || time.Now().After(deadline) {
			break
		}
	}
	if got.Status != StatusExited || got.ExitCode == nil || *got.ExitCode != 0 {
		t.Fatalf("after its input closed: %+v", got)
	}
	c.Close() // the last connection to the holder goes with the attachment

	sock := holderSocket(f.sc.State, in.Sandbox)
	start := time.Now()
	for {
		if _, err := os.Stat(sock); os.IsNotExist(err) {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("the holder of an ended sandbox never exited")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if time.Since(start) < 900*time.Millisecond {
		t.Errorf("the holder exited after %v, before its linger of 1s", time.Since(start))
	}
	c = f.dial(t)
	if err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: in.Sandbox}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status != StatusExited || !strings.Contains(got.Reason, "lost") {
		t.Errorf("after the holder lingered out: %+v", got)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}
