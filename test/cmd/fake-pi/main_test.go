package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakePi is the program built once by TestMain, static (CGO_ENABLED=0) as
// it will be used.
var fakePi string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fake-pi-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fakePi = filepath.Join(dir, "pi")
	goBin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "the go command is needed to build fake-pi:", err)
		os.Exit(1)
	}
	build := exec.Command(goBin, "build", "-o", fakePi, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building fake-pi: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running fake-pi with its stdout split into frames.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	frames chan frame
	stderr *syncBuffer
	waited chan struct{}
	err    error // from Wait, once waited is closed
}

type frame struct {
	raw string
	m   map[string]any
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// env is the base environment: nothing of the test runner's but PATH.
func baseEnv(t *testing.T) map[string]string {
	return map[string]string{
		"PATH":                os.Getenv("PATH"),
		"HOME":                t.TempDir(),
		"PI_CODING_AGENT_DIR": t.TempDir(),
		"FAKE_PI_TURN_MS":     "40",
	}
}

func start(t *testing.T, dir string, env map[string]string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(fakePi, args...)
	cmd.Dir = dir
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, stdin: stdin, frames: make(chan frame, 1024), stderr: &syncBuffer{}, waited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		br := bufio.NewReader(stdout)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				var m map[string]any
				if strings.HasSuffix(line, "\n") {
					_ = json.Unmarshal([]byte(line), &m)
				}
				p.frames <- frame{raw: line, m: m} // an unterminated line is flagged by next
			}
			if err != nil {
				break
			}
		}
		close(p.frames)
		// Wait only once stdout is drained, as os/exec requires.
		p.err = cmd.Wait()
		close(p.waited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.waited:
		default:
			cmd.Process.Kill()
			for range p.frames {
			}
			<-p.waited
		}
	})
	return p
}

func (p *proc) send(v any) {
	p.t.Helper()
	var b []byte
	switch x := v.(type) {
	case string:
		b = []byte(x)
	default:
		var err error
		b, err = json.Marshal(v)
		if err != nil {
			p.t.Fatal(err)
		}
		b = append(b, '\n')
	}
	if _, err := p.stdin.Write(b); err != nil {
		p.t.Fatalf("writing stdin: %v", err)
	}
}

// next returns the next stdout frame, which must be one JSON object on one
// LF-terminated line.
func (p *proc) next(timeout time.Duration) map[string]any {
	p.t.Helper()
	select {
	case f, ok := <-p.frames:
		if !ok {
			p.t.Fatalf("stdout closed; stderr: %s", p.stderr.String())
		}
		if !strings.HasSuffix(f.raw, "\n") || f.m == nil || strings.Count(f.raw, "\n") != 1 {
			p.t.Fatalf("bad frame %q", f.raw)
		}
		return f.m
	case <-time.After(timeout):
		p.t.Fatalf("no frame within %v; stderr: %s", timeout, p.stderr.String())
	}
	return nil
}

func (p *proc) request(v map[string]any) map[string]any {
	p.t.Helper()
	p.send(v)
	for {
		f := p.next(5 * time.Second)
		if f["type"] == "response" {
			return f
		}
	}
}

// exit waits for the process (discarding further frames) and returns its
// exit code and state.
func (p *proc) exit(timeout time.Duration) (int, *os.ProcessState) {
	p.t.Helper()
	frames := p.frames
	deadline := time.After(timeout)
	for {
		select {
		case _, ok := <-frames:
			if !ok {
				frames = nil
			}
		case <-p.waited:
			st := p.cmd.ProcessState
			return st.ExitCode(), st
		case <-deadline:
			p.t.Fatalf("fake-pi did not exit within %v; stderr: %s", timeout, p.stderr.String())
		}
	}
}

func TestFramingAndIDs(t *testing.T) {
	env := baseEnv(t)
	env["FAKE_PI_MCP_ADAPTER"] = "1"
	p := start(t, t.TempDir(), env, "--mode", "rpc", "--model", "fake/fake-1", "--thinking", "high",
		"--no-session", "--extension", "/tmp/paseo-integration.mjs", "--mcp-config", "/tmp/mcp.json")

	st := p.request(map[string]any{"id": "req_1", "type": "get_state"})
	if st["id"] != "req_1" || st["command"] != "get_state" || st["success"] != true {
		t.Fatalf("get_state response %v", st)
	}
	data := st["data"].(map[string]any)
	if data["isStreaming"] != false || data["thinkingLevel"] != "high" || data["sessionId"] == "" {
		t.Errorf("state %v", data)
	}
	if _, ok := data["sessionFile"]; ok {
		t.Errorf("--no-session state has a sessionFile: %v", data["sessionFile"])
	}
	m := data["model"].(map[string]any)
	if m["provider"] != "fake" || m["id"] != "fake-1" || m["api"] != "openai-completions" {
		t.Errorf("model %v", m)
	}

	cmds := p.request(map[string]any{"id": "req_2", "type": "get_commands"})
	list := cmds["data"].(map[string]any)["commands"].([]any)
	found := false
	for _, c := range list {
		c := c.(map[string]any)
		if c["name"] == "mcp" && c["source"] == "extension" {
			found = true
		}
	}
	if !found || cmds["id"] != "req_2" {
		t.Errorf("get_commands %v lacks the adapter's mcp command", cmds)
	}

	models := p.request(map[string]any{"id": "req_3", "type": "get_available_models"})
	if ms := models["data"].(map[string]any)["models"].([]any); len(ms) != 1 || models["id"] != "req_3" {
		t.Errorf("get_available_models %v", models)
	}

	// A CRLF-terminated command, a numeric id, and a message holding U+2028
	// (a JSON-legal character that naive line readers split on).
	p.send("{\"id\":7,\"type\":\"get_state\"}\r\n")
	if r := p.next(5 * time.Second); r["id"] != float64(7) || r["success"] != true {
		t.Errorf("CRLF/numeric id response %v", r)
	}
	p.send(map[string]any{"id": "req_4", "type": "prompt", "message": "a\u2028b"})
	var text string
	for {
		f := p.next(5 * time.Second)
		if ev, ok := f["assistantMessageEvent"].(map[string]any); ok && ev["type"] == "text_end" {
			text = ev["content"].(string)
		}
		if f["type"] == "agent_settled" {
			break
		}
	}
	if !strings.HasSuffix(text, "a\u2028b") {
		t.Errorf("reply %q lost the U+2028", text)
	}

	// Pi answers unknown commands and unparsable lines without an id.
	unk := p.request(map[string]any{"id": "req_5", "type": "frobnicate"})
	if _, has := unk["id"]; has || unk["success"] != false || unk["command"] != "frobnicate" ||
		!strings.Contains(unk["error"].(string), "Unknown command: frobnicate") {
		t.Errorf("unknown command response %v", unk)
	}
	p.send("{not json\n")
	if r := p.next(5 * time.Second); r["command"] != "parse" || r["success"] != false {
		t.Errorf("parse error response %v", r)
	}

	p.stdin.Close()
	if code, _ := p.exit(5 * time.Second); code != 0 {
		t.Errorf("exit %d after EOF", code)
	}
	if s := p.stderr.String(); s != "" {
		t.Errorf("unexpected stderr %q", s)
	}
}

// eventTypes collects frames until agent_settled, returning their types
// and the frames.
func collectTurn(p *proc) ([]string, []map[string]any) {
	p.t.Helper()
	var types []string
	var frames []map[string]any
	for {
		f := p.next(5 * time.Second)
		typ, _ := f["type"].(string)
		if typ == "message_update" {
			typ += ":" + f["assistantMessageEvent"].(map[string]any)["type"].(string)
		}
		types = append(types, typ)
		frames = append(frames, f)
		if typ == "agent_settled" {
			return types, frames
		}
	}
}

func TestTurnEventOrder(t *testing.T) {
	env := baseEnv(t)
	env["FAKE_PI_UPDATES"] = "4"
	env["FAKE_PI_REPLY"] = "hello world, from pi"
	p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
	p.send(map[string]any{"id": "req_1", "type": "prompt", "message": "say hi"})
	resp := p.next(5 * time.Second)
	if resp["type"] != "response" || resp["command"] != "prompt" || resp["id"] != "req_1" || resp["success"] != true {
		t.Fatalf("first frame %v, want the prompt response", resp)
	}
	if _, has := resp["data"]; has {
		t.Errorf("prompt response has data: %v", resp)
	}
	types, frames := collectTurn(p)
	want := []string{
		"agent_start", "turn_start", "message_start", "message_end",
		"message_start", "message_update:text_start",
		"message_update:text_delta", "message_update:text_delta", "message_update:text_delta", "message_update:text_delta",
		"message_update:text_end", "message_end", "turn_end", "agent_end", "agent_settled",
	}
	if strings.Join(types, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n got %v\nwant %v", types, want)
	}
	if frames[2]["message"].(map[string]any)["role"] != "user" || frames[4]["message"].(map[string]any)["role"] != "assistant" {
		t.Errorf("message roles wrong")
	}
	var deltas string
	for _, f := range frames {
		if ev, ok := f["assistantMessageEvent"].(map[string]any); ok {
			if _, has := f["message"]; has {
				t.Errorf("message_update carries a cumulative message (Pi 0.84 dropped it)")
			}
			if ev["type"] == "text_delta" {
				deltas += ev["delta"].(string)
			}
		}
	}
	end := frames[11]["message"].(map[string]any)
	if deltas != "hello world, from pi" || end["stopReason"] != "stop" ||
		end["content"].([]any)[0].(map[string]any)["text"] != deltas {
		t.Errorf("deltas %q, final %v", deltas, end)
	}
	if ae := frames[13]; ae["willRetry"] != false || len(ae["messages"].([]any)) != 2 {
		t.Errorf("agent_end %v", ae)
	}
	st := p.request(map[string]any{"id": "req_2", "type": "get_state"})
	if d := st["data"].(map[string]any); d["isStreaming"] != false || d["messageCount"] != float64(2) {
		t.Errorf("state after the turn %v", d)
	}
	last := p.request(map[string]any{"id": "req_3", "type": "get_last_assistant_text"})
	if last["data"].(map[string]any)["text"] != "hello world, from pi" {
		t.Errorf("last assistant text %v", last)
	}
}

func TestBusyPromptRejected(t *testing.T) {
	env := baseEnv(t)
	env["FAKE_PI_TURN_MS"] = "2000"
	p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
	p.send(map[string]any{"id": "req_1", "type": "prompt", "message": "long"})
	p.next(5 * time.Second) // the prompt response
	st := p.request(map[string]any{"id": "req_2", "type": "get_state"})
	if st["data"].(map[string]any)["isStreaming"] != true {
		t.Errorf("not streaming mid-turn: %v", st)
	}
	busy := p.request(map[string]any{"id": "req_3", "type": "prompt", "message": "again"})
	if busy["id"] != "req_3" || busy["success"] != false || !strings.Contains(busy["error"].(string), "streamingBehavior") {
		t.Errorf("second prompt %v", busy)
	}
	q := p.request(map[string]any{"id": "req_4", "type": "prompt", "message": "later", "streamingBehavior": "followUp"})
	if q["success"] != true {
		t.Errorf("queued prompt %v", q)
	}
}

func TestAbortOrdering(t *testing.T) {
	env := baseEnv(t)
	env["FAKE_PI_TURN_MS"] = "10000"
	env["FAKE_PI_UPDATES"] = "100"
	p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
	p.send(map[string]any{"id": "req_1", "type": "prompt", "message": "go"})
	for {
		f := p.next(5 * time.Second)
		if ev, ok := f["assistantMessageEvent"].(map[string]any); ok && ev["type"] == "text_delta" {
			break
		}
	}
	began := time.Now()
	p.send(map[string]any{"id": "req_2", "type": "abort"})
	var types []string
	var frames []map[string]any
	for {
		f := p.next(5 * time.Second)
		typ, _ := f["type"].(string)
		if typ == "message_update" {
			continue // a delta already in flight
		}
		types = append(types, typ)
		frames = append(frames, f)
		if typ == "response" {
			break
		}
	}
	if time.Since(began) > 2*time.Second {
		t.Errorf("abort took %v; the turn did not stop", time.Since(began))
	}
	want := "message_end turn_end agent_end agent_settled response"
	if strings.Join(types, " ") != want {
		t.Fatalf("after abort got %v, want %s", types, want)
	}
	msg := frames[0]["message"].(map[string]any)
	if msg["role"] != "assistant" || msg["stopReason"] != "aborted" {
		t.Errorf("aborted message %v", msg)
	}
	if r := frames[4]; r["command"] != "abort" || r["id"] != "req_2" || r["success"] != true {
		t.Errorf("abort response %v", r)
	}
	// Idle abort: just the response.
	if r := p.request(map[string]any{"id": "req_3", "type": "abort"}); r["success"] != true || r["id"] != "req_3" {
		t.Errorf("idle abort %v", r)
	}
	// The agent takes a new prompt after an abort.
	p.send(map[string]any{"id": "req_4", "type": "prompt", "message": "again"})
	if r := p.next(5 * time.Second); r["command"] != "prompt" || r["success"] != true {
		t.Errorf("prompt after abort %v", r)
	}
}

var sessionName = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z_([0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12})\.jsonl$`)

func readLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(b, []byte("\n")) {
		t.Errorf("%s does not end in a newline", path)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("bad session line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// oneTurn runs a prompt to agent_settled and returns get_state's data.
func oneTurn(p *proc, msg string) map[string]any {
	p.t.Helper()
	p.send(map[string]any{"id": "p", "type": "prompt", "message": msg})
	collectTurn(p)
	return p.request(map[string]any{"id": "s", "type": "get_state"})["data"].(map[string]any)
}

func TestSessionFiles(t *testing.T) {
	ws := t.TempDir()
	ws, _ = filepath.EvalSymlinks(ws)

	t.Run("default dir per cwd", func(t *testing.T) {
		env := baseEnv(t)
		agentDir := env["PI_CODING_AGENT_DIR"]
		p := start(t, ws, env, "--mode", "rpc", "--model", "fake/fake-1", "--thinking", "low")
		st := p.request(map[string]any{"id": "s0", "type": "get_state"})["data"].(map[string]any)
		file := st["sessionFile"].(string)
		wantDir := filepath.Join(agentDir, "sessions", "--"+strings.ReplaceAll(strings.TrimPrefix(ws, "/"), "/", "-")+"--")
		if filepath.Dir(file) != wantDir {
			t.Errorf("session dir %s, want %s", filepath.Dir(file), wantDir)
		}
		sm := sessionName.FindStringSubmatch(filepath.Base(file))
		if sm == nil || sm[1] != st["sessionId"] {
			t.Fatalf("file name %s does not match <ts>_<sessionId>.jsonl (id %v)", filepath.Base(file), st["sessionId"])
		}
		if fi, err := os.Stat(wantDir); err != nil || !fi.IsDir() {
			t.Errorf("session dir not created at startup: %v", err)
		}
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Errorf("session file exists before any assistant message: %v", err)
		}
		oneTurn(p, "first")
		lines := readLines(t, file)
		if len(lines) != 5 {
			t.Fatalf("got %d lines, want header, model_change, thinking_level_change, user, assistant", len(lines))
		}
		h := lines[0]
		if h["type"] != "session" || h["version"] != float64(3) || h["id"] != st["sessionId"] || h["cwd"] != ws || h["timestamp"] == nil {
			t.Errorf("header %v", h)
		}
		wantTypes := []string{"model_change", "thinking_level_change", "message", "message"}
		var parent any
		for i, l := range lines[1:] {
			if l["type"] != wantTypes[i] || l["parentId"] != parent || l["id"] == nil {
				t.Errorf("entry %d = %v (want %s with parent %v)", i, l, wantTypes[i], parent)
			}
			parent = l["id"]
		}
		if lines[2]["thinkingLevel"] != "low" || lines[4]["message"].(map[string]any)["role"] != "assistant" {
			t.Errorf("entries %v", lines)
		}
		p.stdin.Close()
		p.exit(5 * time.Second)

		// Resume it.
		r := start(t, ws, env, "--mode", "rpc", "--session", file)
		st2 := r.request(map[string]any{"id": "s", "type": "get_state"})["data"].(map[string]any)
		if st2["sessionId"] != st["sessionId"] || st2["sessionFile"] != file || st2["messageCount"] != float64(2) {
			t.Errorf("resumed state %v", st2)
		}
		oneTurn(r, "second")
		lines2 := readLines(t, file)
		if len(lines2) != 7 {
			t.Fatalf("after resume %d lines, want 7", len(lines2))
		}
		if lines2[5]["parentId"] != lines[4]["id"] || lines2[6]["parentId"] != lines2[5]["id"] {
			t.Errorf("resumed entries do not continue the chain")
		}
		headers := 0
		for _, l := range lines2 {
			if l["type"] == "session" {
				headers++
			}
		}
		if headers != 1 {
			t.Errorf("%d headers after resume", headers)
		}
		r.stdin.Close()
		r.exit(5 * time.Second)

		// By id prefix, as Pi allows.
		id := st["sessionId"].(string)
		r2 := start(t, ws, env, "--mode", "rpc", "--session", id[:13])
		if got := r2.request(map[string]any{"id": "s", "type": "get_state"})["data"].(map[string]any)["sessionFile"]; got != file {
			t.Errorf("--session <id prefix> opened %v", got)
		}
	})

	t.Run("explicit dirs are flat", func(t *testing.T) {
		env := baseEnv(t)
		envDir := filepath.Join(t.TempDir(), "env-sessions")
		env["PI_CODING_AGENT_SESSION_DIR"] = envDir
		p := start(t, ws, env, "--mode", "rpc")
		st := oneTurn(p, "x")
		if f := st["sessionFile"].(string); filepath.Dir(f) != envDir || sessionName.FindString(filepath.Base(f)) == "" {
			t.Errorf("PI_CODING_AGENT_SESSION_DIR session at %s", f)
		}
		flagDir := filepath.Join(t.TempDir(), "flag-sessions")
		q := start(t, ws, env, "--mode", "rpc", "--session-dir", flagDir)
		st = oneTurn(q, "x")
		if f := st["sessionFile"].(string); filepath.Dir(f) != flagDir {
			t.Errorf("--session-dir session at %s", f)
		}
		if _, err := os.Stat(st["sessionFile"].(string)); err != nil {
			t.Error(err)
		}
	})

	t.Run("new file at an explicit path", func(t *testing.T) {
		env := baseEnv(t)
		path := filepath.Join(t.TempDir(), "chosen.jsonl")
		p := start(t, ws, env, "--mode", "rpc", "--session", path)
		st := oneTurn(p, "x")
		if st["sessionFile"] != path {
			t.Errorf("sessionFile %v, want %s", st["sessionFile"], path)
		}
		if lines := readLines(t, path); lines[0]["type"] != "session" || lines[0]["cwd"] != ws {
			t.Errorf("header %v", lines[0])
		}
	})

	t.Run("resume with a missing cwd is fatal", func(t *testing.T) {
		env := baseEnv(t)
		gone := filepath.Join(t.TempDir(), "gone")
		path := filepath.Join(t.TempDir(), "s.jsonl")
		h := fmt.Sprintf(`{"type":"session","version":3,"id":"019700000000-7000-8000-000000000000","timestamp":"2026-01-01T00:00:00.000Z","cwd":%q}`+"\n", gone)
		if err := os.WriteFile(path, []byte(h), 0o644); err != nil {
			t.Fatal(err)
		}
		p := start(t, ws, env, "--mode", "rpc", "--session", path)
		code, _ := p.exit(5 * time.Second)
		if code != 1 || !strings.Contains(p.stderr.String(), gone) {
			t.Errorf("exit %d, stderr %q", code, p.stderr.String())
		}
	})

	t.Run("no-session writes nothing", func(t *testing.T) {
		env := baseEnv(t)
		env["PI_CODING_AGENT_SESSION_DIR"] = filepath.Join(t.TempDir(), "s")
		p := start(t, ws, env, "--mode", "rpc", "--no-session")
		st := oneTurn(p, "x")
		if _, has := st["sessionFile"]; has {
			t.Errorf("sessionFile %v with --no-session", st["sessionFile"])
		}
		for _, d := range []string{env["PI_CODING_AGENT_SESSION_DIR"], filepath.Join(env["PI_CODING_AGENT_DIR"], "sessions")} {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				t.Errorf("%s exists with --no-session", d)
			}
		}
	})
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
	}{
		{"unknown flag", nil, []string{"--mode", "rpc", "--bogus"}, 1},
		{"missing value", nil, []string{"--mode", "rpc", "--model"}, 1},
		{"not rpc", nil, []string{"--mode", "json"}, 1},
		{"strict mcp-config without adapter", map[string]string{"FAKE_PI_STRICT_FLAGS": "1"}, []string{"--mode", "rpc", "--mcp-config", "/x"}, 1},
		{"strict mcp-config with adapter", map[string]string{"FAKE_PI_STRICT_FLAGS": "1", "FAKE_PI_MCP_ADAPTER": "1"}, []string{"--mode", "rpc", "--no-session", "--mcp-config", "/x"}, 0},
		{"usual flags", nil, []string{"--mode", "rpc", "--model", "p/m:high", "--thinking", "low", "--no-session", "--extension", "/e.mjs", "-e", "/f.mjs", "--mcp-config", "/m.json", "--session-dir=/tmp/x", "--offline"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := baseEnv(t)
			for k, v := range tc.env {
				env[k] = v
			}
			p := start(t, t.TempDir(), env, tc.args...)
			p.stdin.Close()
			code, _ := p.exit(5 * time.Second)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, p.stderr.String())
			}
			if tc.code == 1 && !strings.HasPrefix(p.stderr.String(), "Error: ") {
				t.Errorf("stderr %q", p.stderr.String())
			}
		})
	}
	if out, err := exec.Command(fakePi, "--version").Output(); err != nil || strings.TrimSpace(string(out)) != version {
		t.Errorf("--version: %q %v", out, err)
	}
}

func TestEOFAndExitCode(t *testing.T) {
	env := baseEnv(t)
	env["FAKE_PI_EXIT_CODE"] = "7"
	p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
	p.request(map[string]any{"type": "get_state"})
	p.stdin.Close()
	if code, _ := p.exit(5 * time.Second); code != 7 {
		t.Errorf("exit %d, want 7", code)
	}

	// EOF mid-turn: Pi stops emitting and exits 0, promptly.
	env = baseEnv(t)
	env["FAKE_PI_TURN_MS"] = "10000"
	q := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
	q.send(map[string]any{"type": "prompt", "message": "x"})
	q.next(5 * time.Second)
	began := time.Now()
	q.stdin.Close()
	if code, _ := q.exit(5 * time.Second); code != 0 || time.Since(began) > 2*time.Second {
		t.Errorf("exit %d after %v", code, time.Since(began))
	}

	// A last command without a newline is still handled before exit.
	r := start(t, t.TempDir(), baseEnv(t), "--mode", "rpc", "--no-session")
	r.send(`{"id":"last","type":"get_state"}`)
	r.stdin.Close()
	if f := r.next(5 * time.Second); f["id"] != "last" {
		t.Errorf("unterminated last line answered with %v", f)
	}
	r.exit(5 * time.Second)
}

func TestSignals(t *testing.T) {
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGTERM, 143}, {syscall.SIGHUP, 129}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			env := baseEnv(t)
			env["FAKE_PI_TURN_MS"] = "10000"
			p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
			p.send(map[string]any{"type": "prompt", "message": "x"})
			p.next(5 * time.Second) // ready, and mid-turn
			if err := p.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			code, st := p.exit(5 * time.Second)
			if code != tc.code || st.Sys().(syscall.WaitStatus).Signaled() {
				t.Errorf("exit %d (status %v), want an exit status of %d", code, st, tc.code)
			}
		})
	}
}

func TestStderrSeparation(t *testing.T) {
	env := baseEnv(t)
	env["FAKE_PI_STDERR"] = "Warning: something on stderr\nsecond line"
	p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
	oneTurn(p, "x") // every stdout frame is checked to be a JSON line
	p.stdin.Close()
	p.exit(5 * time.Second)
	if s := p.stderr.String(); s != "Warning: something on stderr\nsecond line\n" {
		t.Errorf("stderr %q", s)
	}
}

var childPid = regexp.MustCompile(`fake-pi: child pid (\d+)`)

func alive(pid int) bool {
	// Signal 0 on a zombie succeeds: read its state instead.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func TestSpawnDescendants(t *testing.T) {
	for _, setsid := range []bool{false, true} {
		t.Run(fmt.Sprintf("setsid=%v", setsid), func(t *testing.T) {
			env := baseEnv(t)
			env["FAKE_PI_SPAWN"] = "2"
			env["FAKE_PI_CHILD_SECONDS"] = "60"
			env["FAKE_PI_CHILD_IGNORE_TERM"] = "1"
			if setsid {
				env["FAKE_PI_SPAWN_SETSID"] = "1"
			}
			p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
			p.request(map[string]any{"type": "get_state"})
			childPids := func() []int {
				var pids []int
				for _, m := range childPid.FindAllStringSubmatch(p.stderr.String(), -1) {
					n, _ := strconv.Atoi(m[1])
					pids = append(pids, n)
				}
				return pids
			}
			t.Cleanup(func() {
				for _, pid := range childPids() {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})
			// os/exec copies stderr asynchronously: poll for both lines.
			var pids []int
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if pids = childPids(); len(pids) == 2 {
					break
				}
			}
			if len(pids) != 2 {
				t.Fatalf("stderr %q names %d children", p.stderr.String(), len(pids))
			}
			parentPgid, _ := syscall.Getpgid(p.cmd.Process.Pid)
			for _, pid := range pids {
				if !alive(pid) {
					t.Errorf("child %d is not running", pid)
				}
				pgid, err := syscall.Getpgid(pid)
				if err != nil {
					t.Fatal(err)
				}
				if (pgid == parentPgid) == setsid {
					t.Errorf("child %d pgid %d, parent's %d (setsid %v)", pid, pgid, parentPgid, setsid)
				}
				// Children ignore SIGTERM: only SIGKILL removes them.
				syscall.Kill(pid, syscall.SIGTERM)
			}
			time.Sleep(100 * time.Millisecond)
			p.stdin.Close()
			p.exit(5 * time.Second)
			for _, pid := range pids {
				if !alive(pid) {
					t.Errorf("child %d went away with the parent or on SIGTERM; it must be left for cleanup", pid)
				}
			}
		})
	}
}

// TestRunInProcess drives run with pipes, for the race detector.
func TestRunInProcess(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	env := map[string]string{"FAKE_PI_TURN_MS": "20", "HOME": t.TempDir()}
	sig := make(chan os.Signal, 1)
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"--mode", "rpc", "--no-session"}, func(k string) string { return env[k] }, inR, outW, io.Discard, sig)
		outW.Close()
	}()
	br := bufio.NewReader(outR)
	read := func() map[string]any {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	fmt.Fprintln(inW, `{"id":"a","type":"prompt","message":"hi"}`)
	for read()["type"] != "agent_settled" {
	}
	fmt.Fprintln(inW, `{"id":"b","type":"prompt","message":"again"}`)
	read()
	sig <- syscall.SIGTERM
	go io.Copy(io.Discard, outR)
	select {
	case c := <-code:
		if c != 143 {
			t.Errorf("run returned %d on SIGTERM", c)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return on SIGTERM")
	}
	inW.Close()
}

func TestBackToBackTurns(t *testing.T) {
	env := baseEnv(t)
	env["FAKE_PI_TURN_MS"] = "300"
	p := start(t, t.TempDir(), env, "--mode", "rpc", "--no-session")
	p.send(map[string]any{"id": "1", "type": "prompt", "message": "one"})
	p.next(5 * time.Second)
	collectTurn(p)
	// The next prompt right after agent_settled starts a fresh turn that
	// reports itself as streaming.
	p.send(map[string]any{"id": "2", "type": "prompt", "message": "two"})
	if r := p.next(5 * time.Second); r["id"] != "2" || r["success"] != true {
		t.Fatalf("second prompt %v", r)
	}
	time.Sleep(50 * time.Millisecond)
	st := p.request(map[string]any{"id": "3", "type": "get_state"})
	if st["data"].(map[string]any)["isStreaming"] != true {
		t.Errorf("second turn not streaming: %v", st)
	}
	types, _ := collectTurn(p) // get_state's reply came mid-turn
	if types[len(types)-2] != "agent_end" {
		t.Errorf("second turn ended with %v", types)
	}
}
