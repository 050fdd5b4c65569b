package holder

import (
	"bufio"
	"io"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// idle is how long the holder saw no input or output: it depends on timing.
var idle = regexp.MustCompile(`"idleMillis":\d+`)

// The holder's answers to every op but stop, and to frames it refuses,
// byte for byte: what the supervisor decodes (and passes through). A
// change here is a change of the holder protocol.
func TestHolderWireBytes(t *testing.T) {
	skip.UnlessRoot(t, "the holder answers only root peers")
	h, stdin, _ := newProtocolHolder(t)
	sock := Socket(h.spec.StateRoot, h.spec.ID)
	go func() { _, _ = io.Copy(io.Discard, stdin) }()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	ask := func(line string) string {
		t.Helper()
		go func() { _, _ = io.WriteString(c, line+"\n") }()
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		for {
			got, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: no answer: %v", line, err)
			}
			if !strings.HasPrefix(got, `{"v":1,"event":`) {
				return idle.ReplaceAllString(strings.TrimSuffix(got, "\n"), `"idleMillis":N`)
			}
		}
	}
	state := `{"sandbox":"pp-t","deployment":"d","agent":"a","profile":"p","exited":false,"epoch":%s,"nextSeq":1,"acked":0,"outputPaused":false,"idleMillis":N}`
	for _, s := range []struct{ req, want string }{
		{`{"v":1,"id":"i","op":"inspect"}`, `{"v":1,"id":"i","ok":true,"result":` + strings.Replace(state, "%s", "0", 1) + `}`},
		{`{"v":1,"id":"a","op":"attach"}`, `{"v":1,"id":"a","ok":true,"result":{"epoch":1,"cursor":0}}`},
		{`{"v":1,"id":"w","op":"write","epoch":1,"inputId":"i1","data":"aW4K"}`, `{"v":1,"id":"w","ok":true,"result":{"applied":true}}`},
		{`{"v":1,"id":"w2","op":"write","epoch":1,"inputId":"i1","data":"aW4K"}`, `{"v":1,"id":"w2","ok":true,"result":{"applied":false}}`},
		{`{"v":1,"id":"w3","op":"write","epoch":2,"inputId":"i2","data":"aW4K"}`, `{"v":1,"id":"w3","ok":false,"error":{"code":"fenced","message":"epoch 2 is not the current attachment"}}`},
		{`{"v":1,"id":"k","op":"ack","cursor":0}`, `{"v":1,"id":"k","ok":true,"result":{"acked":0}}`},
		{`{"v":1,"id":"a2","op":"attach","cursor":0}`, `{"v":1,"id":"a2","ok":true,"result":{"epoch":2,"cursor":0}}`},
		{`{"v":1,"id":"t","op":"mcpToken","mcpToken":"tok-1"}`, `{"v":1,"id":"t","ok":true,"result":{"mcpToken":true}}`},
		{`{"v":1,"id":"t2","op":"mcpToken","mcpToken":"has space"}`, `{"v":1,"id":"t2","ok":false,"error":{"code":"malformed","message":"the MCP token (or model key) must be 1-4096 printable ASCII characters without spaces"}}`},
		{`{"v":1,"id":"r","op":"release"}`, `{"v":1,"id":"r","ok":false,"error":{"code":"state","message":"sandbox pp-t still runs: stop it first"}}`},
		{`{"v":1,"id":"ci","op":"closeInput","epoch":2}`, `{"v":1,"id":"ci","ok":true,"result":{"closed":true}}`},
		{`{"v":1,"id":"u","op":"bogus"}`, `{"v":1,"id":"u","ok":false,"error":{"code":"unknown-op","message":"unknown holder op \"bogus\""}}`},
		{`{"v":1,"id":"s","op":"signal","signal":"USR1"}`, `{"v":1,"id":"s","ok":false,"error":{"code":"malformed","message":"signal must be TERM, INT, HUP or KILL"}}`},
		{`{"v":2,"id":"v","op":"inspect"}`, `{"v":1,"id":"v","ok":false,"error":{"code":"malformed","message":"want one JSON request with v 1, an id and known fields only"}}`},
		{`{"v":1,"id":"x","op":"inspect","sandbox":"pp-t"}`, `{"v":1,"id":"x","ok":false,"error":{"code":"malformed","message":"want one JSON request with v 1, an id and known fields only"}}`},
		{`not json`, `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"want one JSON request with v 1, an id and known fields only"}}`},
		{`{"v":1,"id":"i2","op":"inspect"}`, `{"v":1,"id":"i2","ok":true,"result":` + strings.Replace(state, "%s", "2", 1) + `}`},
	} {
		if got := ask(s.req); got != s.want {
			t.Errorf("%s:\n got %s\nwant %s", s.req, got, s.want)
		}
	}
	// The sandbox ended: inspect says so, and release answers and ends
	// the holder (and with it the connection).
	close(h.done)
	ended := `{"sandbox":"pp-t","deployment":"d","agent":"a","profile":"p","exited":true,"exitCode":0,"epoch":2,"nextSeq":1,"acked":0,"outputPaused":false,"idleMillis":N}`
	if got, want := ask(`{"v":1,"id":"e","op":"inspect"}`), `{"v":1,"id":"e","ok":true,"result":`+ended+`}`; got != want {
		t.Errorf("inspect once ended:\n got %s\nwant %s", got, want)
	}
	if got, want := ask(`{"v":1,"id":"r","op":"release"}`), `{"v":1,"id":"r","ok":true,"result":{"released":"pp-t"}}`; got != want {
		t.Errorf("release once ended:\n got %s\nwant %s", got, want)
	}
	if !closedAfterEvents(c, br) {
		t.Error("after release the connection stays open")
	}
	select {
	case <-h.released:
	default:
		t.Error("release did not end the holder")
	}

	// A frame past MaxFrame is refused and the connection closed.
	c, err = net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br = bufio.NewReader(c)
	if got, want := ask(`{"v":1,"id":"l","op":"write","data":"`+strings.Repeat("A", MaxFrame)+`"}`), `{"v":1,"id":"","ok":false,"error":{"code":"malformed","message":"request longer than 2097152 bytes"}}`; got != want {
		t.Errorf("a long frame:\n got %s\nwant %s", got, want)
	}
	if !closedAfterEvents(c, br) {
		t.Error("after a long frame the connection stays open")
	}
}

// closedAfterEvents reports whether the holder closes c, after nothing
// but pushed events.
func closedAfterEvents(c net.Conn, br *bufio.Reader) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			return true
		}
		if err != nil || !strings.HasPrefix(line, `{"v":1,"event":`) {
			return false
		}
	}
}
