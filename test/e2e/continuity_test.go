package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// The continuity promise with the real Pi: the supervisor owns Pi's stdio,
// so a daemon whose connection (or whole process) dies mid-turn reattaches
// from its last acknowledged record and receives the rest of the same turn,
// complete, in order and without duplicates, ending in agent_settled; an
// abort sent after a reattach stops the next turn.
func TestPiContinuityThroughSupervisor(t *testing.T) {
	words := strings.Repeat("streaming ", 60)
	e := newEnv(t,
		fakemodel.Slow(words, 60, 6*time.Second),
		fakemodel.Slow(words, 60, 6*time.Second),
	)
	sc := e.scene(t, "pi-session", "")
	dir, err := os.MkdirTemp("/run", "paseo-e2e-supervisor-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	socket := filepath.Join(dir, "supervisor.sock")
	cfg := supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: sc.Registry},
		Socket: socket, SocketGID: 0, StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: secrets,
		Uplink: e.world.Uplink, Resolve: e.resolve, ModelRoots: e.ca.PEM}
	// supervise starts a supervisor over the test's state; the returned
	// function stops it the way SIGTERM does, leaving its sandboxes to
	// their holders.
	supervise := func() (stop func()) {
		srv, err := supervisor.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithCancel(context.Background())
		served := make(chan struct{})
		go func() { _ = srv.Listen(sctx); close(served) }()
		t.Cleanup(func() { cancel(); srv.Shutdown() })
		return func() { cancel(); <-served; srv.Close() }
	}
	stopSupervisor := supervise()
	dial := func() *supervisor.Client { return dialSupervisor(t, socket) }
	c := ctx(t)
	cl := dial()
	var in supervisor.Info
	if err := cl.Call(c, supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: sc.Facts}, &in); err != nil {
		t.Fatal(err)
	}
	tr := &stream{}
	attach := func() uint64 {
		var att struct{ Epoch uint64 }
		if err := cl.Call(c, supervisor.Request{Op: "attach", Sandbox: in.Sandbox, Cursor: tr.Cursor}, &att); err != nil {
			t.Fatal(err)
		}
		return att.Epoch
	}
	write := func(epoch uint64, id, line string) {
		if err := cl.Call(c, supervisor.Request{Op: "write", Sandbox: in.Sandbox, Epoch: epoch, InputID: id, Data: []byte(line + "\n")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	epoch := attach()
	write(epoch, "p1", `{"id":"p1","type":"prompt","message":"stream"}`)
	if !tr.until(t, cl, in.Sandbox, `"text_delta"`, 60*time.Second) {
		t.Fatalf("no streaming: %q", tr.tail())
	}

	// Five dropped connections mid-turn.
	for i := 0; i < 5; i++ {
		cl.Close()
		cl = dial()
		attach()
		tr.some(t, cl, in.Sandbox, 3, 500*time.Millisecond)
	}
	// A client process that dies mid-turn: it attaches (taking the
	// attachment), reads without acknowledging, and is killed.
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperContinuityClient$")
	cmd.Env = append(os.Environ(), "PASEO_E2E_CLIENT_SOCKET="+socket, "PASEO_E2E_CLIENT_SANDBOX="+in.Sandbox,
		fmt.Sprintf("PASEO_E2E_CLIENT_CURSOR=%d", tr.Cursor))
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(out)
	for {
		line, err := br.ReadString('\n')
		if err != nil || strings.HasPrefix(line, "received") {
			break
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	cl.Close()
	// The supervisor restarts mid-turn: the new one adopts the sandbox
	// from its holder as running-unattached, and the turn goes on.
	stopSupervisor()
	supervise()
	cl = dial()
	var got supervisor.Info
	if err := cl.Call(c, supervisor.Request{Op: "inspect", Sandbox: in.Sandbox}, &got); err != nil || got.Status != supervisor.StatusRunningUnattached {
		t.Fatalf("after the supervisor restart: %+v %v", got, err)
	}
	epoch = attach()
	if !tr.until(t, cl, in.Sandbox, `"agent_settled"`, 90*time.Second) {
		t.Fatalf("the turn never settled: %q", tr.tail())
	}
	text := tr.Stdout.String()
	if strings.Count(text, `"type":"agent_settled"`) != 1 {
		t.Errorf("agent_settled %d times", strings.Count(text, `"type":"agent_settled"`))
	}
	if got := assistantText(t, text); got != words {
		t.Errorf("the assistant text through reattaches differs: %d bytes, want %d", len(got), len(words))
	}

	// Abort after a reattach.
	tr.from = tr.Stdout.Len()
	write(epoch, "p2", `{"id":"p2","type":"prompt","message":"again"}`)
	if !tr.until(t, cl, in.Sandbox, `"text_delta"`, 60*time.Second) {
		t.Fatal("second turn did not stream")
	}
	cl.Close()
	cl = dial()
	epoch = attach()
	mark := tr.Stdout.Len()
	tr.from = mark
	write(epoch, "a1", `{"id":"a1","type":"abort"}`)
	if !tr.until(t, cl, in.Sandbox, `"id":"a1"`, 60*time.Second) {
		t.Fatalf("no abort response: %q", tr.tail())
	}
	after := tr.Stdout.String()[mark:]
	if i, j := strings.Index(after, `"agent_settled"`), strings.Index(after, `"id":"a1"`); i < 0 || i > j || !strings.Contains(after, `"aborted"`) {
		t.Errorf("abort after reattach: %q", after)
	}
	if err := cl.Call(c, supervisor.Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestHelperContinuityClient is the client process the test kills.
func TestHelperContinuityClient(t *testing.T) {
	socket := os.Getenv("PASEO_E2E_CLIENT_SOCKET")
	if socket == "" {
		return
	}
	var cursor uint64
	fmt.Sscan(os.Getenv("PASEO_E2E_CLIENT_CURSOR"), &cursor)
	cl, err := supervisor.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Call(context.Background(), supervisor.Request{Op: "attach", Sandbox: os.Getenv("PASEO_E2E_CLIENT_SANDBOX"), Cursor: cursor}, nil); err != nil {
		t.Fatal(err)
	}
	for e := range cl.Events {
		if e.Event == "output" {
			fmt.Println("received", e.Seq)
		}
	}
}

// stream is the daemon's side of a sandbox's output across attachments.
type stream struct {
	supervisor.Transcript
	from int // until looks only at output after this offset
}

func (s *stream) add(t *testing.T, e supervisor.Event) {
	if err := s.Add(e); err != nil {
		t.Fatal(err)
	}
}

func (s *stream) ack(t *testing.T, cl *supervisor.Client, id string) {
	_ = cl.Call(ctx(t), supervisor.Request{Op: "ack", Sandbox: id, Cursor: s.Cursor}, nil)
}

func (s *stream) until(t *testing.T, cl *supervisor.Client, id, want string, d time.Duration) bool {
	deadline := time.After(d)
	for !strings.Contains(s.Stdout.String()[s.from:], want) {
		select {
		case e, ok := <-cl.Events:
			if !ok {
				return false
			}
			s.add(t, e)
		case <-deadline:
			return false
		}
	}
	s.ack(t, cl, id)
	return true
}

func (s *stream) some(t *testing.T, cl *supervisor.Client, id string, n int, d time.Duration) {
	deadline := time.After(d)
	start := s.Cursor
	for s.Cursor < start+uint64(n) {
		select {
		case e, ok := <-cl.Events:
			if !ok {
				return
			}
			s.add(t, e)
		case <-deadline:
			s.ack(t, cl, id)
			return
		}
	}
	s.ack(t, cl, id)
}

func (s *stream) tail() string {
	str := s.Stdout.String()
	if len(str) > 800 {
		return str[len(str)-800:]
	}
	return str
}

// assistantText concatenates the text deltas of the first assistant turn.
func assistantText(t *testing.T, transcript string) string {
	return assistantDeltas(t, transcript, true)
}

// assistantDeltas concatenates the transcript's text deltas, up to the
// first agent_settled when firstTurn is set.
func assistantDeltas(t *testing.T, transcript string, firstTurn bool) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(transcript))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var f struct {
			Type string `json:"type"`
			Ev   struct {
				Type  string `json:"type"`
				Delta string `json:"delta"`
			} `json:"assistantMessageEvent"`
		}
		if json.Unmarshal(sc.Bytes(), &f) != nil {
			t.Fatalf("not a JSON frame: %q", sc.Text())
		}
		if f.Type == "message_update" && f.Ev.Type == "text_delta" {
			b.WriteString(f.Ev.Delta)
		}
		if firstTurn && f.Type == "agent_settled" {
			break
		}
	}
	return b.String()
}
