// Package picontract is the Pi contract suite: what paseo-policy relies on
// from the Pi in its image, checked against that Pi (the image's node
// running the image's Pi bundle as a host process, talking only to a fake
// model this test starts on loopback).
//
// Two kinds of check:
//
//   - the contract proper, asserted for any Pi: the RPC frames and commands
//     the bridge, the TypeScript client and Paseo's Pi provider use; the
//     environment the image sets (/etc/paseo-image.env) read by Pi; every
//     settings.json key policy/compiler/settings.go judges still a key Pi
//     reads; the compiler's embedded model catalogue equal to the image's;
//     a workspace's planted .pi files not loaded in RPC mode;
//   - a record of the rest of Pi's surface (testdata/pi-<version>.json):
//     the settings keys and PI_* variables it reads, each RPC command's
//     answer and the events of a turn, the files it writes in the agent and
//     session dirs, the commands an extension adds. A Pi whose surface
//     differs from its record fails; PASEO_UPDATE=1 writes the record, and
//     the diff against the previous Pi's record is what an upgrade reviews
//     (docs/image.md, "Upgrading Pi").
//
// The image is the repository's .image (make image), or the image directory
// PASEO_PI_IMAGE names.
package picontract

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/compiler"
)

var update = os.Getenv("PASEO_UPDATE") == "1"

// piImage is what the suite needs of the image: where its tree is and what
// image.json says it holds.
type piImage struct {
	Version string `json:"version"`
	Pi      string `json:"pi"`
	Bundle  struct {
		File string `json:"file"`
	} `json:"bundle"`
	dir    string
	rootfs string
}

func (im piImage) node() string { return filepath.Join(im.rootfs, "usr/local/bin/node") }
func (im piImage) bundle() string {
	return filepath.Join(im.rootfs, im.Bundle.File)
}
func (im piImage) pkg(name string) string {
	return filepath.Join(im.rootfs, "opt/pi/node_modules", name)
}

func loadImage(t *testing.T) piImage {
	t.Helper()
	// The image is root's to build (debootstrap, mounts): without root
	// this suite skips, image or not, like the real-Pi e2e tests.
	skip.UnlessRoot(t, "it runs the Pi image, which only root builds (make image)")
	dir := testbundle.Repo(t, ".image")
	if v := os.Getenv("PASEO_PI_IMAGE"); v != "" {
		dir = v
	}
	data, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		t.Fatalf("the Pi image is missing (%v): run `make image` (make test-pi-contract does) or set PASEO_PI_IMAGE", err)
	}
	var im piImage
	if err := json.Unmarshal(data, &im); err != nil {
		t.Fatal(err)
	}
	if im.Pi == "" || im.Bundle.File == "" {
		t.Fatalf("%s/image.json names no Pi version or bundle", dir)
	}
	im.dir, im.rootfs = dir, filepath.Join(dir, "rootfs")
	return im
}

// record is testdata/pi-<version>.json: Pi's surface as this suite saw it.
type record struct {
	Pi string `json:"pi"`
	// Settings are the top-level settings.json keys Pi declares.
	Settings []string `json:"settings"`
	// Env are the PI_* names Pi's code mentions (environment variables
	// among them).
	Env []string `json:"env"`
	// Commands are each RPC command's answer: ok or the error, and the
	// keys of its data.
	Commands map[string]answer `json:"commands"`
	// Turn are the event types of one prompt's turn, in first-seen order.
	Turn []string `json:"turn"`
	// AgentFiles and SessionFiles are what Pi wrote in its agent and
	// session dirs in that session (session file names as a pattern).
	AgentFiles   []string `json:"agentFiles"`
	SessionFiles []string `json:"sessionFiles"`
	// SessionEntries are the entry types of the session file, first seen
	// order, and the header's keys.
	SessionHeader  []string `json:"sessionHeader"`
	SessionEntries []string `json:"sessionEntries"`
	// Messages are the roles get_messages lists after one prompt's turn,
	// and MessageCount get_state's count then (clients count turns by it).
	Messages     []string `json:"messages"`
	MessageCount int      `json:"messageCount"`
	// ExtensionCommands are the commands get_commands lists from the
	// extension --extension loaded, as name:source.
	ExtensionCommands []string `json:"extensionCommands"`
}

type answer struct {
	OK    bool     `json:"ok"`
	Error string   `json:"error,omitempty"`
	Data  []string `json:"data,omitempty"`
}

// TestPiContract runs the image's Pi and checks the contract, then its
// record.
func TestPiContract(t *testing.T) {
	im := loadImage(t)
	rec := record{Pi: im.Pi}

	t.Run("version", func(t *testing.T) {
		out, err := exec.Command(im.node(), im.bundle(), "--version").Output()
		if err != nil {
			t.Fatalf("pi --version: %v", err)
		}
		if got := strings.TrimSpace(string(out)); got != im.Pi {
			t.Fatalf("the bundle says it is Pi %q; image.json says %q", got, im.Pi)
		}
	})

	t.Run("catalogue", func(t *testing.T) {
		// The compiler's API lookup must be this Pi's catalogue, byte for
		// byte (policy/compiler/pi-catalogue.json).
		out, err := exec.Command(im.node(), testbundle.Repo(t, "image/pi/catalogue.mjs"), im.pkg("@earendil-works/pi-ai")).Output()
		if err != nil {
			t.Fatalf("image/pi/catalogue.mjs: %v", stderrOf(err))
		}
		_, embedded := compiler.EmbeddedPiCatalogue()
		if !bytes.Equal(out, embedded) {
			t.Fatalf("policy/compiler/pi-catalogue.json is not the image's Pi %s catalogue: regenerate it with `%s image/pi/catalogue.mjs %s > policy/compiler/pi-catalogue.json` and review the diff (an API the route does not know refuses api-key launches of that model)",
				im.Pi, im.node(), im.pkg("@earendil-works/pi-ai"))
		}
	})

	t.Run("settings", func(t *testing.T) {
		rec.Settings = settingsKeys(t, im)
		// Every key the compiler judges is one Pi reads, or a legacy key
		// Pi migrates: a key Pi dropped or renamed means the allowlist
		// judges something Pi no longer does (and perhaps misses what it
		// does now).
		for _, k := range compiler.SettingKeys() {
			if !slices.Contains(rec.Settings, k) && !slices.Contains(legacySettings, k) {
				t.Errorf("policy/compiler/settings.go judges settings key %q, which Pi %s does not declare: look at what Pi reads now", k, im.Pi)
			}
		}
		// A key Pi reads that the allowlist does not judge is refused at
		// compile (fail closed); the record's diff shows it.
	})

	t.Run("env", func(t *testing.T) {
		rec.Env = envNames(t, im)
		out, err := exec.Command(im.node(), im.bundle(), "--help").Output()
		if err != nil {
			t.Fatalf("pi --help: %v", stderrOf(err))
		}
		// The variables Pi's help lists (some names, such as
		// PI_CODING_AGENT_DIR, are built from the app's name, not written).
		listed := regexp.MustCompile(`(?m)^ +([A-Z][A-Z0-9_]+[A-Z0-9]) +- `)
		for _, m := range listed.FindAllSubmatch(out, -1) {
			rec.Env = append(rec.Env, string(m[1]))
		}
		slices.Sort(rec.Env)
		rec.Env = slices.Compact(rec.Env)
		// What the image sets for Pi (image/build.sh, /etc/paseo-image.env)
		// and the compiler sets in the process environment.
		for _, v := range imageEnv(t, im) {
			if !slices.Contains(rec.Env, v) {
				t.Errorf("the image sets %s, which Pi %s does not read", v, im.Pi)
			}
		}
	})

	t.Run("rpc", func(t *testing.T) { rpcContract(t, im, &rec) })
	t.Run("approve-control", func(t *testing.T) { approveControl(t, im) })
	t.Run("adapter-project-mcp", func(t *testing.T) { adapterProjectMCP(t, im) })

	if t.Failed() {
		return
	}
	p := testbundle.Repo(t, filepath.Join("test/picontract/testdata", "pi-"+im.Pi+".json"))
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(rec); err != nil {
		t.Fatal(err)
	}
	got := buf.Bytes()
	if update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("no record of Pi %s's surface (%v): run with PASEO_UPDATE=1 and review it against the previous Pi's record (docs/image.md, \"Upgrading Pi\")", im.Pi, err)
	}
	var wantRec record
	if err := json.Unmarshal(want, &wantRec); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(wantRec, rec); d != "" {
		t.Fatalf("Pi %s's surface differs from test/picontract/testdata/pi-%s.json (-recorded +seen): judge the change (settings.go, modelroute.go, the bridge, the TypeScript client), then PASEO_UPDATE=1:\n%s", im.Pi, im.Pi, d)
	}
}

// legacySettings are keys settings.go judges that Pi reads only to migrate
// them (migrations.js), not as part of its Settings type.
var legacySettings = []string{"apiKeys", "queueMode", "websockets"}

// settingsKeys lists the top-level keys of Pi's settings.json as Pi
// declares them: the SettingsSchema object (Pi 1.x,
// core/settings-schema.d.ts) or the Settings interface (0.x,
// core/settings-manager.d.ts).
func settingsKeys(t *testing.T, im piImage) []string {
	core := filepath.Join(im.pkg("@earendil-works/pi-coding-agent"), "dist/core")
	src, start, end := "settings-schema.d.ts", "export declare const SettingsSchema: Type.TObject<{", "}>;"
	data, err := os.ReadFile(filepath.Join(core, src))
	if err != nil {
		src, start, end = "settings-manager.d.ts", "export interface Settings {", "}"
		if data, err = os.ReadFile(filepath.Join(core, src)); err != nil {
			t.Fatalf("Pi %s declares its settings in neither settings-schema.d.ts nor settings-manager.d.ts: look again", im.Pi)
		}
	}
	key := regexp.MustCompile(`^    (\$?[A-Za-z][A-Za-z0-9]*)\??:`)
	var keys []string
	in := false
	for line := range strings.Lines(string(data)) {
		line = strings.TrimRight(line, "\n")
		switch {
		case !in && line == start:
			in = true
		case in && line == end:
			in = false
		case in:
			if m := key.FindStringSubmatch(line); m != nil {
				keys = append(keys, m[1])
			}
		}
	}
	if len(keys) < 20 {
		t.Fatalf("found %d settings keys in %s: its form changed, look again", len(keys), src)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// envNames lists the PI_* names in the code of Pi's own packages.
func envNames(t *testing.T, im piImage) []string {
	name := regexp.MustCompile(`\bPI_[A-Z][A-Z0-9_]*[A-Z0-9]\b`)
	seen := map[string]bool{}
	root := im.pkg("@earendil-works")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "node_modules" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".js") || !strings.Contains(p, "/dist/") || strings.Contains(p, "/dist/bundle/") ||
			strings.HasPrefix(d.Name(), "pi.chunk-") || d.Name() == "pi.bundle.js" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range name.FindAll(data, -1) {
			seen[string(m)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return slices.Sorted(maps.Keys(seen))
}

// imageEnv are the PI_* variables of the image's /etc/paseo-image.env.
func imageEnv(t *testing.T, im piImage) []string {
	data, err := os.ReadFile(filepath.Join(im.rootfs, "etc/paseo-image.env"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(data)) {
		if k, _, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "PI_") {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		t.Fatal("/etc/paseo-image.env sets no PI_ variable")
	}
	return out
}

// contractExtension registers one command, as Paseo's integration
// extension registers its own.
const contractExtension = `export default function (pi) {
	pi.registerCommand("paseo_contract", { description: "the contract suite's extension command", handler: async () => {} });
}
`

// plantedExtension is a workspace's .pi extension: in RPC mode without
// --approve Pi must not load it.
const plantedExtension = `import { writeFileSync } from "node:fs";
writeFileSync(process.env.PASEO_CONTRACT_MARKER, "planted extension ran\n");
export default function (pi) {
	pi.registerCommand("paseo_planted", { description: "planted", handler: async () => {} });
}
`

// rpcContract runs `pi --mode rpc` against the fake model: the commands
// the bridge, the client and Paseo's provider send, one turn, and what Pi
// leaves in its dirs.
func rpcContract(t *testing.T, im piImage, rec *record) {
	fm := fakemodel.New(fakemodel.Options{Script: []fakemodel.Turn{fakemodel.Text("contract reply")}, APIKey: "contract-key"})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go fm.Serve(l) //nolint:errcheck // closed below
	t.Cleanup(func() { fm.Close() })

	base := t.TempDir()
	home, agent, sessions, cwd, tmp := filepath.Join(base, "home"), filepath.Join(base, "agent"), filepath.Join(base, "sessions"), filepath.Join(base, "work"), filepath.Join(base, "tmp")
	for _, d := range []string{home, agent, sessions, cwd, tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(base, "planted-ran")
	writeFile(t, filepath.Join(agent, "models.json"), `{"providers":{"fake":{"baseUrl":"http://`+l.Addr().String()+`/v1","api":"openai-completions","apiKey":"contract-key","compat":{"supportsDeveloperRole":false},"models":[{"id":"fake-1","input":["text"],"contextWindow":128000,"maxTokens":16384}]}}}`)
	ext := filepath.Join(base, "ext/paseo-contract.mjs")
	writeFile(t, ext, contractExtension)
	// A workspace's planted project files: settings that would load an
	// extension and trust the project, the extension, and an MCP config
	// whose env value is a command.
	writeFile(t, filepath.Join(cwd, ".pi/extensions/planted.mjs"), plantedExtension)
	writeFile(t, filepath.Join(cwd, ".pi/settings.json"), `{"extensions":["extensions/planted.mjs"],"defaultProjectTrust":"always"}`)
	writeFile(t, filepath.Join(cwd, ".pi/mcp.json"), `{"mcpServers":{"planted":{"command":"/bin/sh","args":["-c","echo mcp > \"$PASEO_CONTRACT_MARKER\""],"env":{"X":"!echo command > \"$PASEO_CONTRACT_MARKER\""}}}}`)

	cmd := exec.Command(im.node(), im.bundle(), "--mode", "rpc", "--model", "fake/fake-1", "--extension", ext)
	cmd.Dir = cwd
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "LANG=C.UTF-8", "PI_OFFLINE=1", "PI_TELEMETRY=0",
		"PI_CODING_AGENT_DIR=" + agent, "PI_CODING_AGENT_SESSION_DIR=" + sessions, "PASEO_CONTRACT_MARKER=" + marker}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pi stderr:\n%s", stderr.String())
		}
	}()
	c := piproto.New(stdout, stdin)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	rec.Commands = map[string]answer{}
	call := func(cmd map[string]any) piproto.Frame {
		t.Helper()
		f, _, err := c.Call(ctx, cmd)
		if err != nil {
			t.Fatalf("%v: %v", cmd["type"], err)
		}
		// The frame every client routes by: a response, echoing the id and
		// naming the command.
		if f.Type != "response" || f.Command != cmd["type"] || f.Success == nil {
			t.Fatalf("%v answered %s: not {type: response, id, command, success}", cmd["type"], f.Raw)
		}
		a := answer{OK: f.OK(), Error: scrub(f.Error)}
		var data map[string]json.RawMessage
		if json.Unmarshal(f.Data, &data) == nil {
			a.Data = slices.Sorted(maps.Keys(data))
		}
		rec.Commands[cmd["type"].(string)] = a
		return f
	}
	need := func(f piproto.Frame, keys ...string) {
		t.Helper()
		if !f.OK() {
			t.Fatalf("%s failed: %s", f.Command, f.Raw)
		}
		var data map[string]json.RawMessage
		_ = json.Unmarshal(f.Data, &data)
		for _, k := range keys {
			if _, ok := data[k]; !ok {
				t.Errorf("%s's data has no %q: %s", f.Command, k, f.Raw)
			}
		}
	}

	// What the bridge, the TypeScript client and Paseo's provider read.
	need(call(map[string]any{"type": "get_state"}), "model", "thinkingLevel", "isStreaming", "sessionFile", "sessionId")
	need(call(map[string]any{"type": "get_available_models"}), "models")
	need(call(map[string]any{"type": "set_thinking_level", "level": "high"}))
	need(call(map[string]any{"type": "set_model", "provider": "fake", "modelId": "fake-1"}))
	cmds := call(map[string]any{"type": "get_commands"})
	need(cmds, "commands")
	var listed struct {
		Commands []struct {
			Name   string `json:"name"`
			Source string `json:"source"`
		} `json:"commands"`
	}
	_ = json.Unmarshal(cmds.Data, &listed)
	for _, cm := range listed.Commands {
		if cm.Source == "extension" {
			rec.ExtensionCommands = append(rec.ExtensionCommands, cm.Name+":"+cm.Source)
		}
		if cm.Name == "paseo_planted" {
			t.Errorf("Pi loaded the workspace's planted .pi extension in RPC mode")
		}
	}
	slices.Sort(rec.ExtensionCommands)
	if !slices.Contains(rec.ExtensionCommands, "paseo_contract:extension") {
		t.Errorf("get_commands does not list the --extension's command: %s", cmds.Raw)
	}

	// One turn: the prompt's response, then its events through agent_end.
	id, err := c.Send(map[string]any{"type": "prompt", "message": "hello"})
	if err != nil {
		t.Fatal(err)
	}
	var frames []piproto.Frame
	resp, seen, err := c.Until(ctx, piproto.Response(id))
	if err != nil {
		t.Fatalf("prompt: %v", err)
	}
	frames = append(frames, seen...)
	if !resp.OK() {
		t.Fatalf("prompt failed: %s", resp.Raw)
	}
	rec.Commands["prompt"] = answer{OK: true}
	end, seen, err := c.Until(ctx, piproto.Event("agent_end"))
	if err != nil {
		t.Fatalf("waiting for agent_end: %v", err)
	}
	frames = append(append(frames, seen...), end)
	text := false
	for _, f := range frames {
		if !slices.Contains(rec.Turn, f.Type) {
			rec.Turn = append(rec.Turn, f.Type)
		}
		if f.Type == "message_end" && bytes.Contains(f.Raw, []byte("contract reply")) {
			text = true
		}
	}
	if !text {
		t.Errorf("no message_end of the turn carries the model's text: %v", piproto.Types(frames))
	}
	for _, want := range []string{"agent_start", "message_update", "message_end", "agent_end"} {
		if !slices.Contains(rec.Turn, want) {
			t.Errorf("the turn has no %s event: %v", want, rec.Turn)
		}
	}

	msgs := call(map[string]any{"type": "get_messages"})
	need(msgs, "messages")
	var got struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(msgs.Data, &got)
	for _, m := range got.Messages {
		rec.Messages = append(rec.Messages, m.Role)
	}
	var st struct {
		MessageCount int `json:"messageCount"`
	}
	_ = json.Unmarshal(call(map[string]any{"type": "get_state"}).Data, &st)
	rec.MessageCount = st.MessageCount
	need(call(map[string]any{"type": "get_session_stats"}))
	// Idle: abort answers at once, steer and follow_up queue nothing to run.
	need(call(map[string]any{"type": "abort"}))
	for _, typ := range []string{"clear_queue", "get_entries", "get_available_thinking_levels"} {
		call(map[string]any{"type": typ}) // recorded; newer commands
	}
	unknown := call(map[string]any{"type": "paseo_contract_unknown"})
	if unknown.OK() || !strings.Contains(unknown.Error, "Unknown command") {
		t.Errorf("an unknown command answered %s; Paseo's provider falls back on \"Unknown command\"", unknown.Raw)
	}

	stdin.Close()
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatal("pi did not exit when its stdin closed")
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Errorf("a planted workspace file ran: %q", b)
	}
	rec.AgentFiles = listFiles(t, agent)
	rec.SessionFiles = listFiles(t, sessions)
	rec.SessionHeader, rec.SessionEntries = sessionShape(t, sessions)
	if len(rec.SessionEntries) == 0 {
		t.Errorf("Pi wrote no session file in PI_CODING_AGENT_SESSION_DIR: %v", rec.SessionFiles)
	}
}

// approveControl is the planted-files check's control: the same planted
// workspace, with the project trusted for the run (--approve), loads the
// planted extension, so its absence in rpcContract is the trust gate's
// doing and not a plant that could never load.
func approveControl(t *testing.T, im piImage) {
	base := t.TempDir()
	home, agent, cwd, tmp := filepath.Join(base, "home"), filepath.Join(base, "agent"), filepath.Join(base, "work"), filepath.Join(base, "tmp")
	for _, d := range []string{home, agent, cwd, tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	marker := filepath.Join(base, "planted-ran")
	writeFile(t, filepath.Join(cwd, ".pi/extensions/planted.mjs"), plantedExtension)
	writeFile(t, filepath.Join(cwd, ".pi/settings.json"), `{"extensions":["extensions/planted.mjs"]}`)
	cmd := exec.Command(im.node(), im.bundle(), "--mode", "rpc", "--no-session", "--approve")
	cmd.Dir = cwd
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "LANG=C.UTF-8", "PI_OFFLINE=1", "PI_TELEMETRY=0",
		"PI_CODING_AGENT_DIR=" + agent, "PASEO_CONTRACT_MARKER=" + marker}
	cmd.Stdin = strings.NewReader(`{"id":"c1","type":"get_commands"}` + "\n")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pi --approve: %v", stderrOf(err))
	}
	if !bytes.Contains(out, []byte(`"paseo_planted"`)) {
		t.Errorf("with --approve Pi did not list the planted extension's command, so the planted-files check proves nothing: %s", out)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("with --approve the planted extension did not run, so the planted-files check proves nothing: %v", err)
	}
}

// adapterProjectMCP: pi-mcp-adapter starts the servers of a workspace's
// .mcp.json and .pi/mcp.json, trusted or not, unless PI_MCP_CONFIG_MODE is
// "exclusive", when it reads <agentDir>/mcp.json only. The compiler sets
// exclusive mode and binds the generated config there (env.go, plan.go);
// the control run without it shows the planted servers start.
func adapterProjectMCP(t *testing.T, im piImage) {
	adapter := im.pkg("pi-mcp-adapter")
	if _, err := os.Stat(adapter); err != nil {
		t.Fatalf("the image has no pi-mcp-adapter: %v", err)
	}
	tmp := t.TempDir() // shared: the second run reuses jiti's transpile of the adapter
	for _, exclusive := range []bool{false, true} {
		base := t.TempDir()
		home, agent, cwd := filepath.Join(base, "home"), filepath.Join(base, "agent"), filepath.Join(base, "work")
		for _, d := range []string{home, agent, cwd} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		server := func(name, marker string) string {
			return `{"mcpServers":{"` + name + `":{"command":"/bin/sh","args":["-c","echo ran > ` + filepath.Join(base, marker) + `"],"lifecycle":"eager"}}}`
		}
		writeFile(t, filepath.Join(agent, "settings.json"), `{"packages":["`+adapter+`"]}`)
		writeFile(t, filepath.Join(agent, "mcp.json"), server("daemon", "daemon-ran"))
		writeFile(t, filepath.Join(cwd, ".mcp.json"), server("planted", "dot-mcp-ran"))
		writeFile(t, filepath.Join(cwd, ".pi/mcp.json"), server("plantedpi", "pi-mcp-ran"))
		env := []string{"HOME=" + home, "PATH=/usr/bin:/bin", "TMPDIR=" + tmp, "LANG=C.UTF-8", "PI_OFFLINE=1", "PI_TELEMETRY=0", "PI_CODING_AGENT_DIR=" + agent}
		if exclusive {
			env = append(env, "PI_MCP_CONFIG_MODE=exclusive")
		}
		cmd := exec.Command(im.node(), im.bundle(), "--mode", "rpc", "--no-session")
		cmd.Dir, cmd.Env = cwd, env
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = new(bytes.Buffer), new(bytes.Buffer)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		_, _ = stdin.Write([]byte(`{"id":"c1","type":"get_state"}` + "\n"))
		ran := func(m string) bool { _, err := os.Stat(filepath.Join(base, m)); return err == nil }
		// Eager servers start while Pi starts: wait for every marker the
		// run should leave (jiti first transpiles the adapter: no seed for
		// this path), then, in exclusive mode, a while longer for any other.
		want := []string{"daemon-ran"}
		if !exclusive {
			want = append(want, "dot-mcp-ran", "pi-mcp-ran")
		}
		deadline := time.Now().Add(120 * time.Second)
		for time.Now().Before(deadline) && !allOf(want, ran) {
			time.Sleep(100 * time.Millisecond)
		}
		if exclusive {
			time.Sleep(5 * time.Second)
		}
		stdin.Close()
		_ = cmd.Process.Kill() // what ran has run; the servers die with their pipes
		_ = cmd.Wait()
		if !ran("daemon-ran") {
			t.Fatalf("exclusive=%v: the agent dir's mcp.json server did not start, so this proves nothing; stderr: %s", exclusive, cmd.Stderr)
		}
		for _, m := range []string{"dot-mcp-ran", "pi-mcp-ran"} {
			if ran(m) == exclusive {
				t.Errorf("exclusive=%v: planted workspace server %s started: %v", exclusive, m, ran(m))
			}
		}
	}
}

func allOf(names []string, ok func(string) bool) bool {
	for _, n := range names {
		if !ok(n) {
			return false
		}
	}
	return true
}

// scrub removes what varies between runs from an error text.
func scrub(s string) string {
	return regexp.MustCompile(`/tmp/[^\s"']*`).ReplaceAllString(s, "<tmp>")
}

var sessionName = regexp.MustCompile(`[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9-]+Z_[0-9a-f-]+\.jsonl$`)

// listFiles lists a directory tree, relative, directories ending in "/",
// session file names as a pattern.
func listFiles(t *testing.T, root string) []string {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = sessionName.ReplaceAllString(rel, "<timestamp>_<id>.jsonl")
		rel = regexp.MustCompile(`--[^/]*--`).ReplaceAllString(rel, "--<cwd>--")
		if d.IsDir() {
			rel += "/"
		}
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// sessionShape reads the session file: its header's keys and the entry
// types after it, in first-seen order.
func sessionShape(t *testing.T, root string) (header, entries []string) {
	var files []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".jsonl") {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 1 {
		t.Errorf("want one session file, found %d", len(files))
		return nil, nil
	}
	f, err := os.Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 16<<20)
	for first := true; sc.Scan(); first = false {
		var e map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("session file line is not JSON: %v", err)
		}
		var typ string
		_ = json.Unmarshal(e["type"], &typ)
		if first {
			header = slices.Sorted(maps.Keys(e))
			continue
		}
		if !slices.Contains(entries, typ) {
			entries = append(entries, typ)
		}
	}
	return header, entries
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func stderrOf(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return err.Error() + ": " + string(ee.Stderr)
	}
	return err.Error()
}
