package supervisor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Each test exceeds one of the supervisor's limits and shows the other
// clients (another uid, another connection, another deployment) served.

// restartWith restarts the fixture's supervisor with other limits.
func (f *fixture) restartWith(t *testing.T, lim Limits) {
	f.stop()
	f.cfg.Limits = lim
	f.start(t)
	time.Sleep(200 * time.Millisecond) // start's probe connection gives its slot back
}

// rawDial is a connection that sends what the test writes, nothing more.
func rawDial(t *testing.T, socket string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// answer reads one response line (and then whether the supervisor closed
// the connection within d, when closed is asked for).
func answer(t *testing.T, c net.Conn, d time.Duration) (Response, bool) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	if err != nil {
		t.Fatalf("no answer within %s: %v", d, err)
	}
	var r Response
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("answer is not JSON: %q", line)
	}
	_, err = br.ReadByte()
	return r, err == io.EOF
}

func listOn(t *testing.T, c net.Conn) Response {
	t.Helper()
	fmt.Fprintln(c, `{"v":1,"id":"l","op":"list"}`)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var r Response
	_ = json.Unmarshal(line, &r)
	return r
}

func TestConnectionCaps(t *testing.T) {
	f := newFixture(t, 200)

	// One uid holding its cap is refused one more; another uid is served.
	f.restartWith(t, Limits{MaxConns: 64, MaxConnsPerUID: 2})
	held := []net.Conn{rawDial(t, f.socket), rawDial(t, f.socket)}
	for _, c := range held {
		if r := listOn(t, c); !r.OK {
			t.Fatalf("a connection under the cap: %+v", r.Error)
		}
	}
	if r, closed := answer(t, rawDial(t, f.socket), 5*time.Second); r.Error == nil || r.Error.Code != rpcerr.Busy || !closed {
		t.Errorf("a third connection of uid %d: %+v (closed %v), want busy and closed", allowedUID, r.Error, closed)
	}
	if out, err := asOtherUser(t, f.socket, f.sc.Facts); err != nil || !strings.Contains(out, string(rpcerr.Forbidden)) {
		t.Errorf("uid %d while uid %d holds its cap: %q %v; want its own answer (forbidden), not busy", otherUID, allowedUID, out, err)
	}
	if r := listOn(t, held[0]); !r.OK {
		t.Errorf("a held connection after the refusal: %+v", r.Error)
	}
	if f.srv.Refused() != 1 {
		t.Errorf("refused %d connections, want 1", f.srv.Refused())
	}

	// Over the overall cap everyone waits, until the idle timeout cuts
	// the connections that hold the slots without asking anything.
	// The idle timeout leaves the other user's process (a re-exec, slow to
	// start on a loaded machine) time to meet the full cap before it cuts.
	f.restartWith(t, Limits{MaxConns: 2, MaxConnsPerUID: 16, IdleTimeout: 5 * time.Second})
	a, b := rawDial(t, f.socket), rawDial(t, f.socket)
	listOn(t, a)
	listOn(t, b)
	if out, _ := asOtherUser(t, f.socket, f.sc.Facts); !strings.Contains(out, string(rpcerr.Busy)) {
		t.Errorf("uid %d over the overall cap: %q, want busy", otherUID, out)
	}
	for _, c := range []net.Conn{a, b} {
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("an idle connection was not cut: %v", err)
		}
	}
	if out, err := asOtherUser(t, f.socket, f.sc.Facts); err != nil || !strings.Contains(out, string(rpcerr.Forbidden)) {
		t.Errorf("uid %d after the idle cut: %q %v", otherUID, out, err)
	}
}

// An attached client may stay silent past the idle timeout: it listens.
func TestIdleTimeoutSparesAttachments(t *testing.T) {
	f := newFixture(t, 200)
	f.restartWith(t, Limits{IdleTimeout: 500 * time.Millisecond})
	c := f.dial(t)
	in := f.create(t, c)
	if err := c.Call(tctx(t), Request{Op: "attach", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := c.Call(tctx(t), Request{Op: "inspect", Sandbox: in.Sandbox}, nil); err != nil {
		t.Errorf("an attached connection was cut while idle: %v", err)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
}

// Half a frame is cut after the frame timeout; a frame of any op but write
// past 64 KiB, and a write past 1 MiB, are refused and cut; a large write
// is read. Another connection is served throughout.
func TestFrameTimeoutAndSizes(t *testing.T) {
	f := newFixture(t, 200)
	f.restartWith(t, Limits{FrameTimeout: 500 * time.Millisecond})
	other := f.dial(t)

	half := rawDial(t, f.socket)
	fmt.Fprint(half, `{"v":1,"id":"h","op":"li`)
	if err := other.Call(tctx(t), Request{Op: "list"}, nil); err != nil {
		t.Errorf("another client while one sends half a frame: %v", err)
	}
	if r, closed := answer(t, half, 5*time.Second); r.Error == nil || r.Error.Code != rpcerr.Malformed || !closed {
		t.Errorf("half a frame: %+v (closed %v), want malformed and cut", r.Error, closed)
	}

	pad := strings.Repeat("a", MaxFrame)
	cases := []struct {
		name, frame string
		refused     bool
	}{
		{"large createSandbox", `{"v":1,"id":"c","op":"createSandbox","deployment":"host-alice","facts":{"x":"` + pad + `"}}`, true},
		{"op after the cut", `{"v":1,"id":"c","deployment":"` + pad + `","op":"write"}`, true},
		{"duplicate op", `{"v":1,"id":"c","op":"write","data":"` + pad + `","op":"list"}`, true},
		{"write past its limit", `{"v":1,"id":"w","op":"write","sandbox":"pp-x","data":"` + strings.Repeat("A", MaxWriteFrame) + `"}`, true},
		{"large write", `{"v":1,"id":"w","op":"write","sandbox":"pp-x","data":"` + strings.Repeat("A", 512<<10) + `"}`, false},
	}
	for _, tc := range cases {
		c := rawDial(t, f.socket)
		go func() { _, _ = io.WriteString(c, tc.frame+"\n") }()
		r, closed := answer(t, c, 10*time.Second)
		switch {
		case tc.refused && (r.Error == nil || r.Error.Code != rpcerr.Malformed || !closed):
			t.Errorf("%s: %+v (closed %v), want malformed and cut", tc.name, r.Error, closed)
		case !tc.refused && (r.Error == nil || r.Error.Code != rpcerr.NotFound):
			t.Errorf("%s: %+v, want it read and answered (not-found)", tc.name, r.Error)
		}
	}
	if err := other.Call(tctx(t), Request{Op: "list"}, nil); err != nil {
		t.Errorf("another client after the refusals: %v", err)
	}
}

// A deployment holding its maxSandboxes is refused one more, concurrent
// creations included; another deployment is still served; delete frees a
// place.
func TestMaxSandboxesPerDeployment(t *testing.T) {
	f := newFixture(t, 200)
	var reg map[string]any
	if err := json.Unmarshal(f.sc.Registry, &reg); err != nil {
		t.Fatal(err)
	}
	deps := reg["deployments"].(map[string]any)
	alice := deps["host-alice"].(map[string]any)
	bob := map[string]any{}
	for k, v := range alice {
		bob[k] = v
	}
	alice["maxSandboxes"] = 2
	deps["host-bob"] = bob
	data, _ := json.Marshal(reg)
	f.cfg.Registry = schema.Input{Name: "registry.json", Data: data}
	f.restartWith(t, Limits{})

	create := func(dep string) (Info, error) {
		facts := bytes.Replace(f.sc.Facts, []byte(`"host-alice"`), []byte(`"`+dep+`"`), 1)
		var in Info
		c := f.dial(t)
		err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: dep, Facts: facts}, &in)
		return in, err
	}
	var mu sync.Mutex
	var made []Info
	quota := 0
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, err := create("host-alice")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				made = append(made, in)
			case isCode(err, rpcerr.Quota):
				quota++
			default:
				t.Errorf("create: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(made) != 2 || quota != 1 {
		t.Fatalf("3 concurrent creations under maxSandboxes 2: %d made, %d refused quota", len(made), quota)
	}
	if _, err := create("host-alice"); !isCode(err, rpcerr.Quota) {
		t.Errorf("a fourth: %v, want quota", err)
	}
	b, err := create("host-bob")
	if err != nil {
		t.Errorf("another deployment while host-alice holds its cap: %v", err)
	}
	c := f.dial(t)
	for _, in := range []Info{made[0], b} {
		if in.Sandbox == "" {
			continue
		}
		if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
			t.Fatal(err)
		}
	}
	again, err := create("host-alice")
	if err != nil {
		t.Fatalf("after a delete: %v", err)
	}
	for _, in := range []Info{made[1], again} {
		if err := c.Call(context.Background(), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
			t.Error(err)
		}
	}
	f.assertNothingLeft(t)
}
