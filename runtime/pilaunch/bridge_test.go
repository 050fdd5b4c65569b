package pilaunch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/runtime/supervisor"
)

// standIn is a stand-in for the supervisor (outside the command under
// test): one sandbox whose agent echoes its input, as `cat` would, on the
// protocol's wire. It records the ops it was asked for.
type standIn struct {
	t      *testing.T
	l      net.Listener
	mu     sync.Mutex
	ops    []string
	out    [][]byte // output records, seq = index+1
	att    net.Conn // the attached connection
	ends   bool     // the sandbox ended
	gone   bool     // deleted
	inputs map[string]bool
	// dropAfter closes the attached connection once, after this many
	// records (a supervisor restart).
	dropAfter int
	// answer: a written line that is a command with an id is answered as
	// Pi would, `{"type":"response","id":...,"command":...}`, instead of
	// echoed; answerAlso follows each answer as further records.
	answer     bool
	answerAlso [][]byte
	// deleteOnExit: what each createSandbox asked.
	deleteOnExit []bool
}

// emit appends a record and pushes it to the attachment (s.mu held).
func (s *standIn) emit(data []byte) {
	s.out = append(s.out, data)
	if s.att != nil {
		s.push(s.att, len(s.out), data)
	}
}

func newStandIn(t *testing.T) *standIn {
	p := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	s := &standIn{t: t, l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	t.Cleanup(func() { l.Close() })
	return s
}

func (s *standIn) socket() string { return s.l.Addr().String() }

func send(c net.Conn, v any) {
	b, _ := json.Marshal(v)
	_, _ = c.Write(append(b, '\n'))
}

func (s *standIn) push(c net.Conn, seq int, data []byte) {
	send(c, supervisor.Event{V: 1, Event: "output", Sandbox: "sb-1", Seq: uint64(seq), Stream: "stdout", Data: data})
}

func (s *standIn) serve(c net.Conn) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		var req supervisor.Request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			s.t.Errorf("stand-in: %v", err)
			return
		}
		s.mu.Lock()
		s.ops = append(s.ops, req.Op)
		var result any = struct{}{}
		switch req.Op {
		case "createSandbox":
			s.deleteOnExit = append(s.deleteOnExit, req.DeleteOnExit)
			result = supervisor.Info{Sandbox: "sb-1", Status: "running"}
		case "attach":
			s.att = c
			result = supervisor.AttachResult{Epoch: 1, Cursor: req.Cursor}
			send(c, map[string]any{"v": 1, "id": req.ID, "ok": true, "result": result})
			for i := int(req.Cursor); i < len(s.out); i++ {
				s.push(c, i+1, s.out[i])
			}
			s.mu.Unlock()
			continue
		case "write":
			// Applied once per input id, as the real bridge does.
			if s.inputs == nil {
				s.inputs = map[string]bool{}
			}
			if s.inputs[req.InputID] {
				break
			}
			s.inputs[req.InputID] = true
			var cmd struct{ ID, Type string }
			if s.answer && json.Unmarshal(req.Data, &cmd) == nil && cmd.ID != "" {
				s.emit([]byte(`{"type":"response","id":"` + cmd.ID + `","command":"` + cmd.Type + `","success":true}` + "\n"))
				for _, l := range s.answerAlso {
					s.emit(l)
				}
				s.answerAlso = nil
			} else {
				s.emit(req.Data)
			}
			if s.dropAfter > 0 && len(s.out) == s.dropAfter {
				s.dropAfter = 0
				s.att.Close()
				s.att = nil
			}
		case "closeInput":
			s.ends = true
			if s.att != nil {
				send(s.att, supervisor.Event{V: 1, Event: "detached", Sandbox: "sb-1", Reason: "sandbox ended"})
			}
		case "inspect":
			in := supervisor.Info{Sandbox: "sb-1", Status: "running", Epoch: 1, NextSeq: uint64(len(s.out) + 1)}
			if s.ends {
				zero := 0
				in.Status, in.ExitCode = "exited", &zero
			}
			result = in
		case "delete":
			s.gone = true
		}
		send(c, map[string]any{"v": 1, "id": req.ID, "ok": true, "result": result})
		s.mu.Unlock()
	}
}

func (s *standIn) opList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ops...)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func launchFor(agent string) *Launch {
	ln := &Launch{AgentID: agent}
	ln.Facts.Deployment.ID = "host-alice"
	return ln
}

// Bytes both ways, a dropped connection redialled and reattached from the
// cursor with nothing twice, and stdin's end with the parent alive: Pi's
// input closed, the sandbox's end deleted and the record removed.
func TestBridgeBytesAndEnd(t *testing.T) {
	s := newStandIn(t)
	s.dropAfter = 2
	st, err := OpenStore(privateDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	in, w := io.Pipe()
	var out, errOut syncBuffer
	b := &Bridge{Socket: s.socket(), Store: st, Stdin: in, Stdout: &out, Stderr: &errOut,
		Sig: Signals{Term: make(chan struct{}), Gone: func() bool { return false }}, EOFGrace: 50 * time.Millisecond, CallTimeout: 5 * time.Second}
	done := make(chan Result, 1)
	go func() {
		res, err := b.Run(launchFor("agent-1"))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	lines := []string{`{"id":"req_1","type":"get_state"}` + "\n", `{"id":"req_2","type":"prompt","message":"hi"}` + "\n", "partial line without newline"}
	for _, l := range lines {
		if _, err := io.WriteString(w, l); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	w.Close()
	select {
	case res := <-done:
		if res.Outcome != Ended || res.Code != 0 {
			t.Errorf("result %+v", res)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the bridge never ended")
	}
	if got, want := out.String(), lines[0]+lines[1]+lines[2]; got != want {
		t.Errorf("stdout %q, want %q (byte for byte, each once)", got, want)
	}
	if r, _ := st.Load("agent-1"); r != nil {
		t.Errorf("the record survived the end: %+v", r)
	}
	if !s.gone {
		t.Error("the ended sandbox was not deleted")
	}
	var attaches int
	for _, op := range s.opList() {
		if op == "attach" {
			attaches++
		}
	}
	if attaches < 2 {
		t.Errorf("no reattach after the dropped connection: %v", s.opList())
	}
}

// A Paseo that goes away without closing (the parent is gone when stdin
// ends) leaves the sandbox and the record with the cursor; a SIGTERM is
// a close: delete at once.
func TestBridgeAbandonAndTerm(t *testing.T) {
	s := newStandIn(t)
	st, err := OpenStore(privateDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	in, w := io.Pipe()
	var out syncBuffer
	b := &Bridge{Socket: s.socket(), Store: st, Stdin: in, Stdout: &out, Stderr: io.Discard,
		Sig: Signals{Term: make(chan struct{}), Gone: func() bool { return true }}, EOFGrace: 50 * time.Millisecond, CallTimeout: 5 * time.Second}
	done := make(chan Result, 1)
	go func() { res, _ := b.Run(launchFor("agent-2")); done <- res }()
	_, _ = io.WriteString(w, "one\n")
	time.Sleep(200 * time.Millisecond)
	w.Close()
	res := <-done
	if res.Outcome != Abandoned || s.gone {
		t.Fatalf("result %+v, deleted %v", res, s.gone)
	}
	r, err := st.Load("agent-2")
	if err != nil || r == nil || r.Sandbox != "sb-1" || r.Cursor != 1 {
		t.Fatalf("record %+v %v", r, err)
	}

	// The respawn reattaches from the record's cursor (nothing twice) and a
	// SIGTERM ends it.
	in2, w2 := io.Pipe()
	defer w2.Close()
	term := make(chan struct{})
	var out2 syncBuffer
	b2 := &Bridge{Socket: s.socket(), Store: st, Stdin: in2, Stdout: &out2, Stderr: io.Discard,
		Sig: Signals{Term: term, Gone: func() bool { return false }}, EOFGrace: 50 * time.Millisecond, CallTimeout: 5 * time.Second}
	go func() { res, _ := b2.Run(launchFor("agent-2")); done <- res }()
	_, _ = io.WriteString(w2, "two\n")
	time.Sleep(200 * time.Millisecond)
	close(term)
	res = <-done
	if res.Outcome != Ended || !s.gone || out2.String() != "two\n" {
		t.Errorf("after SIGTERM: %+v, deleted %v, stdout %q", res, s.gone, out2.String())
	}
	if r, _ := st.Load("agent-2"); r != nil {
		t.Errorf("the record survived the close: %+v", r)
	}
}

func privateDir(t *testing.T) string {
	d := t.TempDir()
	if err := os.Chmod(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// A respawn's bridge forwards a response frame only for an id it wrote
// and has not seen answered. The killed daemon's answers in the replayed
// backlog (one split across records, one with the id the new daemon uses
// next), an answer to an id nobody sent and a second answer to an
// answered id are dropped, counted on stderr without their content; every
// other line passes byte for byte, and the cursor stays at a line's start.
func TestBridgeStaleResponses(t *testing.T) {
	s := newStandIn(t)
	s.answer = true
	event := `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"rest"}}` + "\n"
	s.out = [][]byte{
		[]byte(`{"type":"response","id":"req_1","command":"prompt","success":true}` + "\n"), // the killed daemon's req_1
		[]byte(event),
		[]byte(`{"type":"respo`), []byte(`nse","id":"req_3","command":"bash","success":true,"data":{}}` + "\n"), // split across records
	}
	s.answerAlso = [][]byte{
		[]byte(`{"type":"response","id":"req_9","success":true}` + "\n"),                       // an id never sent
		[]byte(`{"type":"response","id":"req_1","command":"get_state","success":true}` + "\n"), // answered already
		[]byte(`{"type":"response","id":"req_7","ID":"req_1","Type":"x"}` + "\n"),              // exact keys only
		[]byte(`{"type":"response","id":"req_1"` + "\n"),                                       // no JSON Paseo could route
		[]byte("not json at all\n"),
	}
	st, err := OpenStore(privateDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Save("agent-3", Record{Sandbox: "sb-1"}); err != nil { // the killed spawn's record
		t.Fatal(err)
	}
	in, w := io.Pipe()
	term := make(chan struct{})
	var out, errOut syncBuffer
	b := &Bridge{Socket: s.socket(), Store: st, Stdin: in, Stdout: &out, Stderr: &errOut,
		Sig: Signals{Term: term, Gone: func() bool { return false }}, EOFGrace: 50 * time.Millisecond, CallTimeout: 5 * time.Second}
	done := make(chan Result, 1)
	go func() { res, _ := b.Run(launchFor("agent-3")); done <- res }()
	// The new daemon numbers from req_1 again.
	if _, err := io.WriteString(w, `{"id":"req_1","type":"get_state"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	answer := `{"type":"response","id":"req_1","command":"get_state","success":true}` + "\n"
	want := event + answer + "not json at all\n"
	deadline := time.Now().Add(10 * time.Second)
	for out.String() != want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(term)
	res := <-done
	if got := out.String(); got != want {
		t.Errorf("stdout\n%q\nwant\n%q", got, want)
	}
	if res.Dropped != 6 {
		t.Errorf("dropped %d lines, want 6", res.Dropped)
	}
	if e := errOut.String(); !strings.Contains(e, "dropped 1 stdout line(s)") || strings.Contains(e, "req_") || strings.Contains(e, "bash") {
		t.Errorf("stderr %q: want the drops counted, without their content", e)
	}
}

// The line filter alone: a line split anywhere across records is decided
// once whole; the cursor may advance only between lines; an over-long
// line is dropped whole; a command's answer that began before the command
// was written answers something else.
func TestOutLines(t *testing.T) {
	p := &pending{}
	o := &outLines{pend: p}
	p.add("req_1", 2)
	resp := []byte(`{"type":"response","id":"req_1","success":true}` + "\n")
	for cut := 1; cut < len(resp); cut++ {
		o2 := &outLines{pend: &pending{}}
		o2.pend.add("req_1", 0)
		a, _ := o2.feed(1, resp[:cut])
		if len(a) != 0 || o2.boundary() {
			t.Fatalf("cut %d: a partial line was decided", cut)
		}
		b, _ := o2.feed(2, resp[cut:])
		if string(a)+string(b) != string(resp) || !o2.boundary() {
			t.Fatalf("cut %d: %q", cut, string(a)+string(b))
		}
	}
	if out, d := o.feed(2, resp); len(out) != 0 || d != 1 {
		t.Errorf("a frame from record 2 answered a command written after it: %q", out)
	}
	if out, _ := o.feed(3, resp); string(out) != string(resp) {
		t.Errorf("the answer after the write was not forwarded: %q", out)
	}
	long := append([]byte(`{"type":"event","pad":"`), bytes.Repeat([]byte("a"), MaxFrameLine)...)
	if out, d := o.feed(4, long); len(out) != 0 || d != 1 || o.boundary() {
		t.Errorf("an over-long line: %d bytes out, %d drops", len(out), d)
	}
	if out, _ := o.feed(5, []byte("\"}\n{\"type\":\"x\"}\n")); string(out) != `{"type":"x"}`+"\n" {
		t.Errorf("after an over-long line: %q", out)
	}
	var in inLines
	if ids := in.feed([]byte(`{"type":"prompt","id":"req_`)); ids != nil {
		t.Errorf("ids of a partial line: %v", ids)
	}
	if ids := in.feed([]byte("2\"}\n{\"id\":3}\n{\"id\":\"req_4\"}")); len(ids) != 1 || ids[0] != "req_2" {
		t.Errorf("ids %v, want [req_2]", ids)
	}
}

// A probe (no store: nobody's session) asks the supervisor to delete its
// sandbox once it ended, so a probe command killed before its own delete
// leaves nothing; a session does not, so that a killed daemon's sandbox
// outlives its command.
func TestProbeAsksDeleteOnExit(t *testing.T) {
	s := newStandIn(t)
	st, err := OpenStore(privateDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, store := range []*Store{nil, st} {
		in, w := io.Pipe()
		b := &Bridge{Socket: s.socket(), Store: store, Stdin: in, Stdout: io.Discard, Stderr: io.Discard,
			Sig: Signals{Term: make(chan struct{}), Gone: func() bool { return false }}, EOFGrace: 50 * time.Millisecond, CallTimeout: 5 * time.Second}
		w.Close()
		s.mu.Lock()
		s.ends = false
		s.mu.Unlock()
		if _, err := b.Run(launchFor("agent-4")); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.deleteOnExit) != 2 || !s.deleteOnExit[0] || s.deleteOnExit[1] {
		t.Errorf("deleteOnExit asked by a probe, then a session: %v, want [true false]", s.deleteOnExit)
	}
}
