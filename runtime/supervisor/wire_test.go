package supervisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

// wireConn speaks the protocol as raw lines, so a test sees the bytes a
// client gets: field names, their order, omitted fields.
type wireConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
	// ids are replaced by their stand-ins in what ask returns: a
	// sandbox's id differs on every run.
	ids map[string]string
}

func dialWire(t *testing.T, socket string) *wireConn {
	c := rawDial(t, socket)
	return &wireConn{t: t, c: c, br: bufio.NewReaderSize(c, 1<<20), ids: map[string]string{}}
}

// ask sends one request line and returns the next line that is not a
// pushed event (the answer), with known ids replaced.
func (w *wireConn) ask(line string) string {
	w.t.Helper()
	go func() { _, _ = io.WriteString(w.c, line+"\n") }() // a large frame would fill the socket buffer
	return w.next()
}

func (w *wireConn) next() string {
	w.t.Helper()
	_ = w.c.SetReadDeadline(time.Now().Add(90 * time.Second))
	for {
		got, err := w.br.ReadString('\n')
		if err != nil {
			w.t.Fatalf("no answer: %v", err)
		}
		if strings.HasPrefix(got, `{"v":1,"event":`) {
			continue
		}
		got = strings.TrimSuffix(got, "\n")
		for id, stand := range w.ids {
			got = strings.ReplaceAll(got, id, stand)
		}
		// How far the agent's output got depends on timing.
		return bridgePosition.ReplaceAllString(got, `"nextSeq":N,"acked":A`)
	}
}

// closed reports whether the supervisor closed the connection (after
// what was read).
func (w *wireConn) closed() bool {
	_ = w.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		line, err := w.br.ReadString('\n')
		if err == io.EOF && line == "" {
			return true
		}
		if err != nil || !strings.HasPrefix(line, `{"v":1,"event":`) {
			return false
		}
	}
}

var bridgePosition = regexp.MustCompile(`"nextSeq":\d+,"acked":\d+`)

var sandboxInAnswer = regexp.MustCompile(`"sandbox":"(pp-[0-9a-f]{16})"`)

// The responses of every op and of the frame checks, byte for byte: what
// the reference client and clients/typescript decode. It pins the wire
// while the server's code moves (issue 22); a change here is a protocol
// change, and the TypeScript client must agree with it.
func TestWireBytes(t *testing.T) {
	f := newFixture(t, 200)
	w := dialWire(t, f.socket)
	pad := strings.Repeat("a", MaxFrame)
	steps := []struct{ req, want string }{
		{`{"v":1,"id":"l0","op":"list"}`, `{"v":1,"id":"l0","ok":true,"result":[]}`},
		{`{"v":1,"id":"u","op":"nope","sandbox":"pp-0000000000000000"}`, `{"v":1,"id":"u","ok":false,"error":{"code":"unknown-op","message":"unknown op \"nope\""}}`},
		{`{"v":1,"id":"n","op":"inspect","sandbox":"pp-0000000000000000"}`, `{"v":1,"id":"n","ok":false,"error":{"code":"not-found","message":"no sandbox \"pp-0000000000000000\" for this peer"}}`},
		{`not json`, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"want one JSON request with v 1, an id and known fields only"}}`},
		{`{"v":2,"id":"v2","op":"list"}`, `{"v":1,"id":"v2","ok":false,"error":{"code":"malformed","message":"want one JSON request with v 1, an id and known fields only"}}`},
		{`{"v":1,"id":"x","op":"list","argv":["runsc"]}`, `{"v":1,"id":"x","ok":false,"error":{"code":"malformed","message":"want one JSON request with v 1, an id and known fields only"}}`},
		{`{"v":1,"id":"f","op":"createSandbox","deployment":"docker-official","facts":{}}`, `{"v":1,"id":"f","ok":false,"error":{"code":"forbidden","message":"peer uid 0 gid 0 is not bound to deployment \"docker-official\""}}`},
		{`{"v":1,"id":"m","op":"createSandbox","deployment":"host-alice","mcpToken":"has space"}`, `{"v":1,"id":"m","ok":false,"error":{"code":"malformed","message":"the MCP token (or model key) must be 1-4096 printable ASCII characters without spaces"}}`},
	}
	for _, s := range steps {
		if got := w.ask(s.req); got != s.want {
			t.Errorf("%s:\n got %s\nwant %s", s.req, got, s.want)
		}
	}

	var facts bytes.Buffer
	if err := json.Compact(&facts, f.sc.Facts); err != nil {
		t.Fatal(err)
	}
	created := w.ask(`{"v":1,"id":"c","op":"createSandbox","deployment":"host-alice","facts":` + facts.String() + `}`)
	m := sandboxInAnswer.FindStringSubmatch(created)
	if m == nil {
		t.Fatalf("createSandbox: %s", created)
	}
	id := m[1]
	w.ids[id] = "pp-ID"
	created = strings.ReplaceAll(created, id, "pp-ID")
	info := func(status, tail string) string {
		return `{"sandbox":"pp-ID","deployment":"host-alice","agent":"agent-7f3c","profile":"pi-session","status":"` + status + `"` + tail + `}`
	}
	running := info("running", `,"epoch":0,"nextSeq":N,"acked":A,"outputPaused":false`)
	steps = []struct{ req, want string }{
		{"", `{"v":1,"id":"c","ok":true,"result":` + running + `}`},
		{`{"v":1,"id":"i","op":"inspect","sandbox":"` + id + `"}`, `{"v":1,"id":"i","ok":true,"result":` + running + `}`},
		{`{"v":1,"id":"l1","op":"list"}`, `{"v":1,"id":"l1","ok":true,"result":[` + running + `]}`},
		{`{"v":1,"id":"s0","op":"signal","sandbox":"` + id + `","signal":"USR1"}`, `{"v":1,"id":"s0","ok":false,"error":{"code":"malformed","message":"signal must be TERM, INT, HUP or KILL"}}`},
		{`{"v":1,"id":"g","op":"gitImport","sandbox":"` + id + `"}`, `{"v":1,"id":"g","ok":false,"error":{"code":"state","message":"sandbox pp-ID: the sandbox was created by a root peer: the import runs as the connecting daemon's uid, and root is no daemon"}}`},
		{`{"v":1,"id":"gn","op":"gitImport","sandbox":"pp-0000000000000000"}`, `{"v":1,"id":"gn","ok":false,"error":{"code":"not-found","message":"no sandbox \"pp-0000000000000000\" for this peer"}}`},
		{`{"v":1,"id":"a","op":"attach","sandbox":"` + id + `"}`, `{"v":1,"id":"a","ok":true,"result":{"cursor":0,"epoch":1}}`},
		{`{"v":1,"id":"w1","op":"write","sandbox":"` + id + `","epoch":1,"inputId":"i1","data":"eyJ0eXBlIjoiZ2V0X3N0YXRlIn0K"}`, `{"v":1,"id":"w1","ok":true,"result":{"applied":true}}`},
		{`{"v":1,"id":"w2","op":"write","sandbox":"` + id + `","epoch":1,"inputId":"i1","data":"eyJ0eXBlIjoiZ2V0X3N0YXRlIn0K"}`, `{"v":1,"id":"w2","ok":true,"result":{"applied":false}}`},
		{`{"v":1,"id":"w3","op":"write","sandbox":"` + id + `","epoch":7,"inputId":"i2","data":"e30K"}`, `{"v":1,"id":"w3","ok":false,"error":{"code":"fenced","message":"epoch 7 is not the current attachment"}}`},
		{`{"v":1,"id":"k","op":"ack","sandbox":"` + id + `","cursor":1}`, `{"v":1,"id":"k","ok":true,"result":{"acked":1}}`},
		{`{"v":1,"id":"ci0","op":"closeInput","sandbox":"` + id + `","epoch":7}`, `{"v":1,"id":"ci0","ok":false,"error":{"code":"fenced","message":"bridge: write from a superseded attachment (stale epoch)"}}`},
		{`{"v":1,"id":"ci","op":"closeInput","sandbox":"` + id + `","epoch":1}`, `{"v":1,"id":"ci","ok":true,"result":{"closed":true}}`},
	}
	for _, s := range steps {
		got := created
		if s.req != "" {
			got = w.ask(s.req)
		}
		if got != s.want {
			t.Errorf("%s:\n got %s\nwant %s", s.req, got, s.want)
		}
	}

	// Its input closed, the agent ends, and inspect reports the exit.
	var ended string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if ended = w.ask(`{"v":1,"id":"e","op":"inspect","sandbox":"` + id + `"}`); strings.Contains(ended, `"status":"exited"`) {
			break
		}
	}
	if want := `{"v":1,"id":"e","ok":true,"result":` + info("exited", `,"exitCode":0,"epoch":1,"nextSeq":N,"acked":A,"outputPaused":false`) + `}`; ended != want {
		t.Errorf("inspect after closeInput:\n got %s\nwant %s", ended, want)
	}
	steps = []struct{ req, want string }{
		{`{"v":1,"id":"d","op":"delete","sandbox":"` + id + `"}`, `{"v":1,"id":"d","ok":true,"result":{"deleted":"pp-ID"}}`},
		{`{"v":1,"id":"d2","op":"inspect","sandbox":"` + id + `"}`, `{"v":1,"id":"d2","ok":false,"error":{"code":"not-found","message":"no sandbox \"pp-ID\" for this peer"}}`},
		{`{"v":1,"id":"l2","op":"list"}`, `{"v":1,"id":"l2","ok":true,"result":[]}`},
	}
	for _, s := range steps {
		if got := w.ask(s.req); got != s.want {
			t.Errorf("%s:\n got %s\nwant %s", s.req, got, s.want)
		}
	}

	// The frame checks answer and close the connection.
	frames := []struct{ name, req, want string }{
		{"large createSandbox", `{"v":1,"id":"c","op":"createSandbox","facts":{"x":"` + pad + `"}}`, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"request longer than 65536 bytes (only write may be longer, up to 1048576)"}}`},
		{"duplicate op", `{"v":1,"id":"c","op":"write","data":"` + pad + `","op":"list"}`, `{"v":1,"id":"c","ok":false,"error":{"code":"malformed","message":"only write may be longer than 65536 bytes"}}`},
		{"write past its limit", `{"v":1,"id":"w","op":"write","data":"` + strings.Repeat("A", MaxWriteFrame) + `"}`, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"write request longer than 1048576 bytes"}}`},
	}
	for _, fr := range frames {
		c := dialWire(t, f.socket)
		if got := c.ask(fr.req); got != fr.want || !c.closed() {
			t.Errorf("%s:\n got %s (closed %v)\nwant %s, closed", fr.name, got, c.closed(), fr.want)
		}
	}

	// A half frame past the frame timeout, and a connection past the cap.
	f.restartWith(t, Limits{MaxConns: 1, FrameTimeout: 300 * time.Millisecond})
	half := dialWire(t, f.socket)
	fmt.Fprint(half.c, `{"v":1,"id":"h","op":"li`)
	time.Sleep(100 * time.Millisecond) // half holds the one slot
	busy := dialWire(t, f.socket)
	for name, c := range map[string]struct {
		w    *wireConn
		want string
	}{
		"busy":       {busy, `{"v":1,"id":"","ok":false,"error":{"code":"busy","message":"the supervisor serves its cap of 1 connections"}}`},
		"half frame": {half, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"request did not arrive whole within 300ms"}}`},
	} {
		if got := c.w.next(); got != c.want || !c.w.closed() {
			t.Errorf("%s:\n got %s\nwant %s, closed", name, got, c.want)
		}
	}
}
