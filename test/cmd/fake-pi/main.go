// Command fake-pi is a deterministic stand-in for `pi --mode rpc` (Pi
// 0.84.2), for fast tests of the transport around the agent (framing,
// stderr separation, EOF, exit codes, signals, descendant cleanup) without
// Node or a model. It reads LF-delimited JSON commands on stdin and writes
// responses and events as JSON lines on stdout, in Pi's shapes and order:
//
//   - a prompt is answered with its response, then agent_start, turn_start,
//     the user message, the assistant message streamed as message_update
//     deltas over FAKE_PI_TURN_MS, turn_end, agent_end{willRetry:false} and
//     finally agent_settled;
//   - an abort mid-turn emits the aborted assistant message
//     (stopReason "aborted"), turn_end, agent_end and agent_settled, and only
//     then the abort response;
//   - responses echo the command's id, except "Unknown command" and parse
//     errors, which Pi sends without one.
//
// Sessions are written like Pi's: <dir>/<ISO timestamp>_<uuidv7>.jsonl with
// a version 3 header, nothing written until the first assistant message.
// dir is --session-dir, else $PI_CODING_AGENT_SESSION_DIR, else
// <agent dir>/sessions/--<cwd with / as ->--, the agent dir being
// $PI_CODING_AGENT_DIR or ~/.pi/agent. --session PATH resumes (exit 1 when
// the header's cwd is gone), --no-session writes nothing.
//
// Test hooks (environment):
//
//	FAKE_PI_TURN_MS          how long a turn streams (default 200)
//	FAKE_PI_UPDATES          text_delta updates per turn (default 5)
//	FAKE_PI_REPLY            the assistant text (default "fake-pi reply: <prompt>")
//	FAKE_PI_MODEL            provider/id when --model is absent (default fake/fake-1)
//	FAKE_PI_BASE_URL         the model's baseUrl in get_state and friends
//	FAKE_PI_MCP_ADAPTER=1    get_commands lists the adapter's "mcp" extension command
//	FAKE_PI_STRICT_FLAGS=1   --mcp-config is an unknown (fatal) flag unless the
//	                         adapter is present, as in real Pi
//	FAKE_PI_STDERR           written to stderr at startup (a newline is added)
//	FAKE_PI_EXIT_CODE        exit status after stdin EOF (default 0)
//	FAKE_PI_SPAWN=N          start N sleeping children of this program; each
//	                         pid is reported on stderr as "fake-pi: child pid N"
//	FAKE_PI_SPAWN_SETSID=1   children start their own sessions
//	FAKE_PI_SPAWN_INHERIT=1  children inherit stdout and stderr
//	FAKE_PI_CHILD_SECONDS    how long children sleep (default 600)
//	FAKE_PI_CHILD_IGNORE_TERM=1 children ignore SIGTERM, SIGHUP and SIGINT
//
// SIGTERM exits 143 and SIGHUP 129, as Pi's RPC mode does; SIGINT keeps its
// default action. The program is static with CGO_ENABLED=0.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// version is the Pi release this program imitates.
const version = "0.84.2"

// envChild marks a spawned child: it only sleeps.
const envChild = "FAKE_PI_CHILD"

func main() {
	if os.Getenv(envChild) != "" {
		childMain(os.Getenv)
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGHUP)
	os.Exit(run(os.Args[1:], envWithFile(os.Getenv), os.Stdin, os.Stdout, os.Stderr, sig))
}

// envWithFile adds KEY=VALUE lines from ./.fake-pi-env (the working
// directory is the workspace) under the real environment: a compiled
// sandbox passes only allowlisted variables, so tests that go through the
// compiler configure the fake this way.
func envWithFile(getenv func(string) string) func(string) string {
	data, err := os.ReadFile(".fake-pi-env")
	if err != nil {
		return getenv
	}
	extra := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && k != "" {
			extra[k] = v
		}
	}
	return func(k string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return extra[k]
	}
}

// childMain is a spawned descendant: it sleeps, optionally deaf to the
// polite signals so a cleanup must use SIGKILL.
func childMain(getenv func(string) string) {
	if getenv("FAKE_PI_CHILD_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
	}
	// Tell the parent the signal disposition is in place (fd 3).
	if ready := os.NewFile(3, "ready"); ready != nil {
		ready.Write([]byte{1})
		ready.Close()
	}
	secs := envInt(getenv, "FAKE_PI_CHILD_SECONDS", 600)
	time.Sleep(time.Duration(secs) * time.Second)
}

func envInt(getenv func(string) string, name string, def int) int {
	if v := getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

// options are the parsed command line.
type options struct {
	mode       string
	model      string
	provider   string
	thinking   string
	session    string
	sessionDir string
	noSession  bool
	version    bool
	help       bool
}

// flagSpec lists Pi's flags: true takes a value.
var flagSpec = map[string]bool{
	"--mode": true, "--model": true, "--provider": true, "--thinking": true,
	"--session": true, "--session-dir": true, "--session-id": true, "--fork": true,
	"--extension": true, "-e": true, "--api-key": true, "--system-prompt": true,
	"--append-system-prompt": true, "--name": true, "-n": true, "--models": true,
	"--tools": true, "--exclude-tools": true, "--skill": true, "--prompt-template": true,
	"--theme": true, "--export": true,
	"--no-session": false, "--offline": false, "--verbose": false, "--continue": false,
	"-c": false, "--resume": false, "-r": false, "--print": false, "-p": false,
	"--no-extensions": false, "-ne": false, "--no-skills": false,
	"--no-prompt-templates": false, "--no-themes": false, "--no-context-files": false,
	"--no-tools": false, "--no-builtin-tools": false, "--version": false, "-v": false,
	"--help": false, "-h": false,
}

// parseArgs reads Pi's command line. Flags an extension would register are
// accepted when allowed says so (--mcp-config, from pi-mcp-adapter);
// anything else unknown is fatal, as in Pi.
func parseArgs(args []string, allowed map[string]bool) (options, error) {
	var o options
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			if strings.HasPrefix(a, "@") {
				return o, errors.New("@file arguments are not supported in RPC mode")
			}
			continue // a message: unused in RPC mode
		}
		name, val, hasVal := strings.Cut(a, "=")
		takes, known := flagSpec[name]
		if !known {
			if !allowed[name] {
				return o, fmt.Errorf("Unknown option: %s", name)
			}
			takes = true
		}
		if takes && !hasVal {
			if i+1 >= len(args) {
				return o, fmt.Errorf("Option %s requires a value", name)
			}
			i++
			val = args[i]
		}
		switch name {
		case "--mode":
			o.mode = val
		case "--model":
			o.model = val
		case "--provider":
			o.provider = val
		case "--thinking":
			o.thinking = val
		case "--session":
			o.session = val
		case "--session-dir":
			o.sessionDir = val
		case "--no-session":
			o.noSession = true
		case "--version", "-v":
			o.version = true
		case "--help", "-h":
			o.help = true
		}
	}
	return o, nil
}

// model is Pi's Model object.
type model struct {
	ID            string    `json:"id"`
	Name          string    `json:"name"`
	API           string    `json:"api"`
	Provider      string    `json:"provider"`
	BaseURL       string    `json:"baseUrl"`
	Reasoning     bool      `json:"reasoning"`
	Input         []string  `json:"input"`
	ContextWindow int       `json:"contextWindow"`
	MaxTokens     int       `json:"maxTokens"`
	Cost          modelCost `json:"cost"`
}

type modelCost struct {
	Input      float64 `json:"input"`
	Output     float64 `json:"output"`
	CacheRead  float64 `json:"cacheRead"`
	CacheWrite float64 `json:"cacheWrite"`
}

var thinkingLevels = map[string]bool{"off": true, "minimal": true, "low": true, "medium": true, "high": true, "xhigh": true, "max": true}

// resolveModel turns --provider/--model (provider/id[:thinking]) into a
// model and an optional thinking level from the suffix.
func resolveModel(provider, spec, baseURL string) (model, string) {
	thinking := ""
	if i := strings.LastIndex(spec, ":"); i >= 0 && thinkingLevels[spec[i+1:]] {
		thinking = spec[i+1:]
		spec = spec[:i]
	}
	id := spec
	if provider == "" {
		if p, rest, ok := strings.Cut(spec, "/"); ok {
			provider, id = p, rest
		} else {
			provider = "fake"
		}
	}
	return model{
		ID: id, Name: id, API: "openai-completions", Provider: provider, BaseURL: baseURL,
		Input: []string{"text"}, ContextWindow: 128000, MaxTokens: 16384,
	}, thinking
}

// expandHome is Pi's tilde expansion for path settings.
func expandHome(p string, getenv func(string) string) string {
	home := getenv("HOME")
	if p == "~" {
		return home
	}
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		return filepath.Join(home, rest)
	}
	return p
}

func absFrom(cwd, p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(cwd, p)
}

// getwd is the kernel's view of the working directory, as Node's
// process.cwd() reports it (os.Getwd would prefer a $PWD alias).
func getwd() (string, error) {
	return syscall.Getwd()
}

// output serializes whole JSON lines to stdout.
type output struct {
	mu sync.Mutex
	w  io.Writer
}

func (o *output) emit(v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // JSON.stringify does not escape <, > and &
	if err := enc.Encode(v); err != nil {
		panic(err) // fixed types: cannot fail
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	_, _ = o.w.Write(buf.Bytes())
}

// hold takes the output lock for good, so the process can exit without
// cutting a line in half; it gives up after a while if stdout is stuck.
func (o *output) hold() {
	deadline := time.Now().Add(time.Second)
	for !o.mu.TryLock() {
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// response is Pi's RPC response frame.
type response struct {
	ID      json.RawMessage `json:"id,omitempty"`
	Type    string          `json:"type"`
	Command string          `json:"command,omitempty"`
	Success bool            `json:"success"`
	Data    json.RawMessage `json:"data,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// marshal is JSON.stringify: no HTML escaping, no trailing newline.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func mustJSON(v any) json.RawMessage {
	b, err := marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// command is the part of an RPC command fake-pi reads.
type command struct {
	ID                json.RawMessage `json:"id"`
	Type              *string         `json:"type"`
	Message           string          `json:"message"`
	StreamingBehavior string          `json:"streamingBehavior"`
	Provider          string          `json:"provider"`
	ModelID           string          `json:"modelId"`
	Level             string          `json:"level"`
	Name              string          `json:"name"`
}

// agent is the fake session state shared by the command loop and a turn.
type agent struct {
	out     *output
	getenv  func(string) string
	stderr  io.Writer
	turnDur time.Duration
	updates int
	adapter bool

	mu        sync.Mutex
	model     model
	thinking  string
	sess      *session
	streaming bool
	abort     chan struct{}
	abortOnce *sync.Once
	quit      chan struct{}
	done      chan struct{}
}

func (a *agent) warn(err error) {
	if err != nil {
		fmt.Fprintf(a.stderr, "fake-pi: session write failed: %v\n", err)
	}
}

func run(args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer, sig <-chan os.Signal) int {
	adapter := getenv("FAKE_PI_MCP_ADAPTER") == "1"
	allowed := map[string]bool{"--mcp-config": adapter || getenv("FAKE_PI_STRICT_FLAGS") != "1"}
	opts, err := parseArgs(args, allowed)
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
	if opts.version {
		fmt.Fprintln(stdout, version)
		return 0
	}
	if opts.help {
		fmt.Fprintln(stdout, "fake-pi: a stand-in for `pi --mode rpc` in tests")
		return 0
	}
	if opts.mode != "rpc" {
		fmt.Fprintln(stderr, "Error: fake-pi implements only --mode rpc")
		return 1
	}

	if msg := getenv("FAKE_PI_STDERR"); msg != "" {
		if !strings.HasSuffix(msg, "\n") {
			msg += "\n"
		}
		io.WriteString(stderr, msg)
	}

	cwd, err := getwd()
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
	baseURL := getenv("FAKE_PI_BASE_URL")
	if baseURL == "" {
		baseURL = "http://127.0.0.1:18080/v1"
	}
	spec := opts.model
	if spec == "" {
		spec = getenv("FAKE_PI_MODEL")
	}
	if spec == "" {
		spec = "fake/fake-1"
	}
	m, suffixThinking := resolveModel(opts.provider, spec, baseURL)
	thinking := opts.thinking
	if thinking == "" {
		thinking = suffixThinking
	}
	if thinking == "" {
		thinking = "medium"
	}

	sess, err := openForArgs(opts, cwd, getenv)
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}

	if n := envInt(getenv, "FAKE_PI_SPAWN", 0); n > 0 {
		if err := spawnChildren(n, getenv, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "Error: spawning children: %v\n", err)
			return 1
		}
	}

	a := &agent{
		out:      &output{w: stdout},
		getenv:   getenv,
		stderr:   stderr,
		turnDur:  time.Duration(envInt(getenv, "FAKE_PI_TURN_MS", 200)) * time.Millisecond,
		updates:  max(1, envInt(getenv, "FAKE_PI_UPDATES", 5)),
		adapter:  adapter,
		model:    m,
		thinking: thinking,
		sess:     sess,
		quit:     make(chan struct{}),
	}
	if len(sess.lines) == 1 {
		// A new session records its model and thinking level first.
		a.warn(sess.appendModelChange(m.Provider, m.ID))
		a.warn(sess.appendThinkingChange(thinking))
	}

	eof := make(chan struct{})
	go func() {
		a.readCommands(stdin)
		close(eof)
	}()
	select {
	case <-eof:
		a.stop()
		a.out.hold()
		return envInt(getenv, "FAKE_PI_EXIT_CODE", 0)
	case s := <-sig:
		a.stop()
		a.out.hold()
		if s == syscall.SIGHUP {
			return 129
		}
		return 143
	}
}

// openForArgs picks the session as Pi's createSessionManager does.
func openForArgs(opts options, cwd string, getenv func(string) string) (*session, error) {
	if opts.noSession {
		return inMemorySession(cwd), nil
	}
	agentDir := getenv("PI_CODING_AGENT_DIR")
	if agentDir == "" {
		agentDir = filepath.Join(getenv("HOME"), ".pi", "agent")
	}
	agentDir = absFrom(cwd, expandHome(agentDir, getenv))
	// An explicit directory holds files directly; only the default one is
	// split per cwd.
	dir := ""
	if opts.sessionDir != "" {
		dir = absFrom(cwd, expandHome(opts.sessionDir, getenv))
	} else if v := getenv("PI_CODING_AGENT_SESSION_DIR"); v != "" {
		dir = absFrom(cwd, expandHome(v, getenv))
	}
	if opts.session != "" {
		arg := opts.session
		path := ""
		if strings.ContainsAny(arg, `/\`) || strings.HasSuffix(arg, ".jsonl") {
			path = absFrom(cwd, expandHome(arg, getenv))
		} else {
			lookIn := dir
			if lookIn == "" {
				lookIn = defaultSessionDir(agentDir, cwd)
			}
			p, ok := findSession(lookIn, arg)
			if !ok {
				return nil, fmt.Errorf("No session found matching '%s'", arg)
			}
			path = p
		}
		return openSession(path, dir, cwd)
	}
	if dir == "" {
		dir = defaultSessionDir(agentDir, cwd)
	}
	return newSession(dir, cwd)
}

// spawnChildren starts n sleeping copies of this program.
func spawnChildren(n int, getenv func(string) string, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	env := []string{envChild + "=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FAKE_PI_SPAWN=") && !strings.HasPrefix(kv, envChild+"=") {
			env = append(env, kv)
		}
	}
	for i := 0; i < n; i++ {
		cmd := exec.Command(exe)
		cmd.Env = env
		if getenv("FAKE_PI_SPAWN_INHERIT") == "1" {
			cmd.Stdout, cmd.Stderr = stdout, stderr
		}
		if getenv("FAKE_PI_SPAWN_SETSID") == "1" {
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		}
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		cmd.ExtraFiles = []*os.File{w}
		err = cmd.Start()
		w.Close()
		if err != nil {
			r.Close()
			return err
		}
		go cmd.Wait() // reap it if it ends while we live
		// Wait until the child is set up, so a test may signal it at once.
		r.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = r.Read(make([]byte, 1))
		r.Close()
		if err != nil {
			return fmt.Errorf("child %d did not start: %w", cmd.Process.Pid, err)
		}
		fmt.Fprintf(stderr, "fake-pi: child pid %d\n", cmd.Process.Pid)
	}
	return nil
}

// readCommands handles stdin line by line (LF only, a trailing CR
// dropped) until EOF; a last unterminated line is handled too.
func (a *agent) readCommands(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			line = bytes.TrimSuffix(line, []byte("\n"))
			line = bytes.TrimSuffix(line, []byte("\r"))
			a.handle(line)
		}
		if err != nil {
			return
		}
	}
}

func (a *agent) ok(id json.RawMessage, cmd string, data any) {
	r := response{ID: id, Type: "response", Command: cmd, Success: true}
	if data != nil {
		r.Data = mustJSON(data)
	}
	a.out.emit(r)
}

func (a *agent) okNull(id json.RawMessage, cmd string) {
	a.out.emit(response{ID: id, Type: "response", Command: cmd, Success: true, Data: json.RawMessage("null")})
}

func (a *agent) fail(id json.RawMessage, cmd, msg string) {
	a.out.emit(response{ID: id, Type: "response", Command: cmd, Success: false, Error: msg})
}

// handle runs one command line.
func (a *agent) handle(line []byte) {
	var c command
	if err := json.Unmarshal(line, &c); err != nil {
		var probe any
		if jerr := json.Unmarshal(line, &probe); jerr != nil {
			a.fail(nil, "parse", "Failed to parse command: "+jerr.Error())
			return
		}
		// Valid JSON of another shape: Pi finds no type in it.
		a.fail(nil, "", "Unknown command: undefined")
		return
	}
	if c.Type == nil {
		a.fail(nil, "", "Unknown command: undefined")
		return
	}
	id, typ := c.ID, *c.Type
	switch typ {
	case "extension_ui_response":
		// Answers to extension dialogs: fake-pi never asks, so nothing waits.
	case "prompt":
		a.prompt(id, c)
	case "abort":
		a.abortTurn()
		a.ok(id, "abort", nil)
	case "steer", "follow_up":
		// Accepted and dropped: fake-pi runs one turn per prompt.
		a.ok(id, typ, nil)
	case "get_state":
		a.ok(id, typ, a.state())
	case "get_commands":
		cmds := []map[string]string{}
		if a.adapter {
			cmds = append(cmds, map[string]string{"name": "mcp", "description": "Show MCP server status", "source": "extension"})
		}
		a.ok(id, typ, map[string]any{"commands": cmds})
	case "get_available_models":
		a.mu.Lock()
		m := a.model
		a.mu.Unlock()
		a.ok(id, typ, map[string]any{"models": []model{m}})
	case "set_model":
		a.mu.Lock()
		m := a.model
		match := c.Provider == m.Provider && c.ModelID == m.ID
		if match {
			a.warn(a.sess.appendModelChange(m.Provider, m.ID))
		}
		a.mu.Unlock()
		if !match {
			a.fail(id, typ, fmt.Sprintf("Model not found: %s/%s", c.Provider, c.ModelID))
			return
		}
		a.ok(id, typ, m)
	case "cycle_model", "cycle_thinking_level":
		a.okNull(id, typ) // one model, no reasoning: nothing to cycle
	case "set_thinking_level":
		a.mu.Lock()
		a.thinking = c.Level
		a.warn(a.sess.appendThinkingChange(c.Level))
		a.mu.Unlock()
		a.ok(id, typ, nil)
	case "get_available_thinking_levels":
		a.ok(id, typ, map[string]any{"levels": []string{"off"}})
	case "set_steering_mode", "set_follow_up_mode", "set_auto_compaction", "set_auto_retry", "abort_retry", "abort_bash":
		a.ok(id, typ, nil)
	case "get_messages":
		a.mu.Lock()
		msgs := append([]json.RawMessage{}, a.sess.messages...)
		a.mu.Unlock()
		a.ok(id, typ, map[string]any{"messages": msgs})
	case "get_last_assistant_text":
		a.ok(id, typ, map[string]any{"text": a.lastAssistantText()})
	case "get_session_stats":
		a.ok(id, typ, a.stats())
	case "get_fork_messages":
		a.ok(id, typ, map[string]any{"messages": []any{}})
	case "set_session_name":
		name := strings.TrimSpace(c.Name)
		if name == "" {
			a.fail(id, typ, "Session name cannot be empty")
			return
		}
		a.mu.Lock()
		a.warn(a.sess.appendSessionInfo(name))
		a.mu.Unlock()
		a.ok(id, typ, nil)
	case "new_session":
		a.abortTurn()
		a.mu.Lock()
		a.sess.start()
		a.warn(a.sess.appendModelChange(a.model.Provider, a.model.ID))
		a.warn(a.sess.appendThinkingChange(a.thinking))
		a.mu.Unlock()
		a.ok(id, typ, map[string]bool{"cancelled": false})
	case "compact", "bash", "export_html", "switch_session", "fork", "clone", "get_entries", "get_tree":
		a.fail(id, typ, "fake-pi does not implement "+typ)
	default:
		// Pi answers an unknown command without its id.
		a.fail(nil, typ, "Unknown command: "+typ)
	}
}

// sessionState is get_state's data, field order as Pi sends it.
type sessionState struct {
	Model                 model  `json:"model"`
	ThinkingLevel         string `json:"thinkingLevel"`
	IsStreaming           bool   `json:"isStreaming"`
	IsCompacting          bool   `json:"isCompacting"`
	SteeringMode          string `json:"steeringMode"`
	FollowUpMode          string `json:"followUpMode"`
	SessionFile           string `json:"sessionFile,omitempty"`
	SessionID             string `json:"sessionId"`
	SessionName           string `json:"sessionName,omitempty"`
	AutoCompactionEnabled bool   `json:"autoCompactionEnabled"`
	MessageCount          int    `json:"messageCount"`
	PendingMessageCount   int    `json:"pendingMessageCount"`
}

func (a *agent) state() sessionState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return sessionState{
		Model: a.model, ThinkingLevel: a.thinking, IsStreaming: a.streaming,
		SteeringMode: "one-at-a-time", FollowUpMode: "one-at-a-time",
		SessionFile: a.sess.sessionFile(), SessionID: a.sess.id, SessionName: a.sess.name,
		AutoCompactionEnabled: true, MessageCount: len(a.sess.messages),
	}
}

type roleView struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
	Usage   *usage `json:"usage"`
}

func (a *agent) stats() map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	var users, assistants int
	var in, out int
	for _, raw := range a.sess.messages {
		var m roleView
		_ = json.Unmarshal(raw, &m)
		switch m.Role {
		case "user":
			users++
		case "assistant":
			assistants++
			if m.Usage != nil {
				in += m.Usage.Input
				out += m.Usage.Output
			}
		}
	}
	st := map[string]any{
		"sessionId": a.sess.id, "userMessages": users, "assistantMessages": assistants,
		"toolCalls": 0, "toolResults": 0, "totalMessages": len(a.sess.messages),
		"tokens": map[string]int{"input": in, "output": out, "cacheRead": 0, "cacheWrite": 0, "total": in + out},
		"cost":   0,
	}
	if f := a.sess.sessionFile(); f != "" {
		st["sessionFile"] = f
	}
	return st
}

func (a *agent) lastAssistantText() *string {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := len(a.sess.messages) - 1; i >= 0; i-- {
		var m struct {
			Role    string        `json:"role"`
			Content []textContent `json:"content"`
		}
		if json.Unmarshal(a.sess.messages[i], &m) != nil || m.Role != "assistant" {
			continue
		}
		var parts []string
		for _, c := range m.Content {
			if c.Type == "text" {
				parts = append(parts, c.Text)
			}
		}
		s := strings.Join(parts, "")
		return &s
	}
	return nil
}

// abortTurn stops a running turn and waits until it has settled.
func (a *agent) abortTurn() {
	a.mu.Lock()
	if !a.streaming {
		a.mu.Unlock()
		return
	}
	ab, once, done := a.abort, a.abortOnce, a.done
	a.mu.Unlock()
	once.Do(func() { close(ab) })
	<-done
}

// stop ends a running turn silently (stdin EOF or a signal): Pi
// unsubscribes from the session before disposing of it.
func (a *agent) stop() {
	a.mu.Lock()
	done := a.done
	select {
	case <-a.quit:
	default:
		close(a.quit)
	}
	a.mu.Unlock()
	if done != nil {
		<-done
	}
}
