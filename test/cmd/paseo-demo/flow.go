package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/cli"
	"paseo.dev/paseo-policy/internal/nsutil"
	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/gitimport"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/supervisor"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

// budget bounds the whole demo; a healthy run takes well under a minute.
const budget = 110 * time.Second

// demoFile is what the turn writes in the workspace.
const demoFile = "DEMO.md"

const demoText = "Written by Pi inside gVisor, through the workspace bind mount.\n"

// The prompt the daemon sends; the fake model answers it with the script.
const prompt = "Write DEMO.md in the workspace, then try to get out."

type imageInfo struct {
	Version string `json:"version"`
	Digest  string `json:"digest"`
	Rootfs  string `json:"rootfs"`
	Erofs   []struct {
		Dir    string `json:"dir"`
		File   string `json:"file"`
		Digest string `json:"digest"`
	} `json:"erofs"`
}

// script is the model's side of the turn: one assistant message with tool
// calls that write the workspace file, write outside the workspace, call
// an allowed and a forbidden daemon tool; a bash call that reads a file
// outside, reads the model key, connects to another host and to the metadata address, and asks
// the kernel who it is; then a closing text.
func script(sc *scene, w *world) []fakemodel.Turn {
	bash := strings.Join([]string{
		// Git in the sandbox: the commit goes to the agent's store; the
		// import after the turn brings it onto the branch.
		"git add " + demoFile + " && git " + gitIdentity + " commit -q -m '" + demoCommit + "' && echo \"git commit: $(git log -1 --format=%h)\" || echo 'git commit: failed'",
		"echo \"read outside: $(cat " + sc.canary + " 2>&1)\"",
		// The provider key: the sandbox's variable and every process's
		// environment hold only the model route's stand-in.
		"echo \"model key: $FAKE_LLM_KEY; environments holding a key: $(cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c '^FAKE_LLM_KEY=sk-')\"",
		connect("other host", w.decoy.Addr.String()),
		connect("metadata", w.metadata.Addr.String()),
		rawMCP(w.mcp.port),
		"echo \"uname -v: $(uname -v)\"",
		"echo \"dmesg: $(dmesg 2>&1 | head -n 1)\"",
	}, "; ")
	mcp := func(tool string) fakemodel.ToolCall {
		return fakemodel.ToolCall{Name: "mcp", Arguments: map[string]any{"tool": "paseo_" + tool, "args": "{}"}}
	}
	return []fakemodel.Turn{
		{ToolCalls: []fakemodel.ToolCall{
			{Name: "write", Arguments: map[string]string{"path": demoFile, "content": demoText}},
			{Name: "write", Arguments: map[string]string{"path": sc.outside, "content": "escaped\n"}},
			mcp("list_agents"),
			mcp("create_agent"),
		}},
		fakemodel.Bash(bash),
		fakemodel.Text("Wrote DEMO.md. Everything else was refused."),
	}
}

// rawMCP is a bash line that posts a create_agent call, which the MCP
// scope does not allow, straight to the route proxy on the gateway (the
// proxy listens on the upstream's port).
func rawMCP(port int) string {
	body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"create_agent","arguments":{}}}`
	req := fmt.Sprintf(`POST /mcp/agents?callerAgentId=agent-7f3c HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s`,
		len(body), strings.ReplaceAll(body, `"`, `\"`))
	return fmt.Sprintf(`echo "daemon tool create_agent: $(timeout 3 bash -c 'exec 3<>/dev/tcp/paseo-gateway/%d; printf "%s" >&3; cat <&3' 2>&1 | tail -n 1)"`, port, req)
}

// connect is a bash line that tries a TCP connection for 2 s.
func connect(label, addr string) string {
	host, port, _ := strings.Cut(addr, ":")
	return fmt.Sprintf("timeout 2 bash -c 'exec 3<>/dev/tcp/%s/%s' 2>/dev/null && echo '%s %s: reached' || echo '%s %s: blocked'",
		host, port, label, addr, label, addr)
}

func runDemo(ctx context.Context, t *demoT, o options, rep *report) {
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	var img imageInfo
	rep.step("prerequisites", func() {
		img = loadImage(t, o.image)
		rep.Image = imageReport{Version: img.Version, Digest: img.Digest}
		rep.Runsc = runscDigest(t, o.runsc)
	})
	rep.step("old run", func() { t.check(removeOldRun(o), "the old "+o.work) })
	// Searchable, not listable, by others: the daemon user's host git
	// reaches the repository beneath host/ as on a real host (git.go).
	t.check(os.MkdirAll(o.work, 0o711), "work dir")
	t.check(os.Chmod(o.work, 0o711), "work dir")
	t.check(os.WriteFile(filepath.Join(o.work, workMarker), nil, 0o600), "work dir")
	t.Cleanup(func() { os.RemoveAll(o.work) })
	apiKey, marker := "sk-demo-"+randomHex(12), "canary-"+randomHex(8)
	rep.apiKey, rep.marker = apiKey, marker
	sc := layout(o.work)
	var w *world
	rep.step("network", func() {
		w = newWorld(t)
		// A killed demo cannot unpin these namespaces; the next one will.
		t.check(os.WriteFile(filepath.Join(o.work, worldFile), []byte(filepath.Dir(w.net.Uplink)), 0o600), "work dir")
		t.check(w.reachable(), "demo network")
		w.serveModel(t, script(sc, w), apiKey)
	})
	rep.step("facts", func() {
		t.check(sc.build(o.repo, img, w.modelURL(), w.mcp.port, marker), "demo host tree")
	})
	bundleDir := filepath.Join(o.work, "bundle")
	rep.step("compile+explain", func() { compileAndExplain(t, sc, bundleDir, rep) })

	stateRoot := filepath.Join(o.work, "state")
	secrets := map[string][]byte{"alice/fake-llm": []byte(apiKey), "paseo/mcp-token": []byte(w.mcp.token)}
	var s *session
	rep.step("supervisor", func() { s = supervise(t, sc, w, stateRoot, o.runsc, secrets) })
	rep.sockDir = s.dir
	// The branch's value before the agent runs: the import's base.
	var base string
	rep.step("git base", func() {
		branch, value, err := gitimport.Head(ctx, sc.gitdir(), sc.repo(), "", sc.cred())
		t.check(err, "the worktree's branch")
		if branch != demoBranch || value == "" {
			t.fail("the worktree's branch is %q at %q, want %s", branch, value, demoBranch)
		}
		base = value
	})
	rep.step("create sandbox", func() { s.create(ctx, sc.facts, w.mcp.token) })
	rep.Sandbox = s.id
	// What the turn did is reported even when a later step fails.
	defer func() {
		if o.raw != "" {
			_ = os.WriteFile(o.raw, s.tr.Stdout.Bytes(), 0o644)
		}
		if s.tr.Stdout.Len() > 0 {
			rep.observe(sc, w, s.tr.Stdout.String())
		}
	}()
	rep.step("get_state", func() {
		s.send(ctx, map[string]any{"id": "s1", "type": "get_state"})
		s.until(ctx, `"id":"s1"`)
	})
	rep.step("turn", func() {
		s.send(ctx, map[string]any{"id": "p1", "type": "prompt", "message": prompt})
		s.until(ctx, `"type":"agent_settled"`)
	})
	rep.step("git import", func() {
		g, err := importGit(ctx, sc, base)
		t.check(err, "git import")
		rep.Git = g
	})
	rep.step("exit", func() {
		in := s.finish(ctx)
		rep.Exit = in.ExitCode
		rep.Packets, rep.Routes = in.Packets, in.Routes
	})
	rep.step("delete", func() {
		s.delete(ctx)
		rep.Left = append(rep.Left, sandboxLeftovers(t, w, stateRoot, o.runsc, s.id)...)
	})
}

// workMarker marks a work dir as the demo's, so that only a dir the demo
// made is ever removed.
const workMarker = ".paseo-demo"

// removeOldRun removes what a demo that was killed (SIGKILL: no cleanup
// ran) left in the work dir. Its sandboxes live on in their holders, as
// they outlive any supervisor; a supervisor over its state root adopts
// them and Shutdown deletes them, before the dir goes.
func removeOldRun(o options) error {
	if _, err := os.Stat(o.work); os.IsNotExist(err) {
		return nil
	}
	// The checkout's .demo is the demo's (and ignored by Git) even
	// without the marker, which an older compile-only demo did not write.
	if _, err := os.Stat(filepath.Join(o.work, workMarker)); err != nil && o.work != filepath.Join(o.repo, ".demo") {
		return fmt.Errorf("%s exists but is not a demo's work dir (no %s); remove it or pick another --work", o.work, workMarker)
	}
	state := filepath.Join(o.work, "state")
	if reg, err := os.ReadFile(filepath.Join(o.work, "registry.json")); err == nil {
		if _, err := os.Stat(state); err == nil {
			srv, err := supervisor.New(supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: reg},
				Socket: filepath.Join(o.work, "unused.sock"), StateRoot: state, RunscPath: o.runsc})
			if err != nil {
				return err
			}
			srv.Shutdown()
		}
	}
	if dir, err := os.ReadFile(filepath.Join(o.work, worldFile)); err == nil {
		if err := removeWorld(string(dir)); err != nil {
			return err
		}
	}
	return os.RemoveAll(o.work)
}

// worldFile names the run's test network dir (testnet pins its
// namespaces there).
const worldFile = "world"

// removeWorld unpins and removes a killed run's test network namespaces,
// as testnet's own cleanup would have.
func removeWorld(dir string) error {
	if !strings.HasPrefix(filepath.Base(dir), "paseo-testnet-") {
		return fmt.Errorf("%s does not name a test network dir", dir)
	}
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := nsutil.Remove(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return os.Remove(dir)
}

func loadImage(t *demoT, dir string) imageInfo {
	data, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		t.fail("the Pi image is missing (%v): run `make image` as root", err)
	}
	var im imageInfo
	t.check(json.Unmarshal(data, &im), "image.json")
	real, err := filepath.EvalSymlinks(dir)
	t.check(err, "image dir")
	im.Rootfs = filepath.Join(real, "rootfs")
	if len(im.Erofs) == 0 {
		t.fail("%s lists no EROFS files: rebuild the image with `make image`", dir)
	}
	for i := range im.Erofs {
		im.Erofs[i].File = filepath.Join(real, "erofs", filepath.Base(im.Erofs[i].File))
	}
	return im
}

// runscDigest is the pinned runsc's sha256, checked against the digest
// its build recorded (the launcher's preflight checks it again).
func runscDigest(t *demoT, path string) runscReport {
	f, err := os.Open(path)
	if err != nil {
		t.fail("the pinned runsc is missing (%v): run `make runsc`", err)
	}
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	t.check(err, "reading runsc")
	got := hex.EncodeToString(h.Sum(nil))
	rec, err := os.ReadFile(path + ".sha256")
	t.check(err, "runsc's recorded digest")
	if want, _, _ := strings.Cut(string(rec), " "); want != got {
		t.fail("%s is not the runsc its build recorded (%s.sha256): run `make runsc`", path, path)
	}
	return runscReport{Path: path, Digest: "sha256:" + got}
}

// compileAndExplain compiles the facts with the CLI, as a user would, and
// keeps explain's text (whatever form the CLI gives it) and its grants.
func compileAndExplain(t *demoT, sc *scene, dir string, rep *report) {
	var out, errs bytes.Buffer
	if cli.Main([]string{"compile", "--facts", sc.factsFile, "--registry", sc.regFile, "--out", dir}, &out, &errs) != 0 {
		t.fail("compile: %s%s", out.String(), errs.String())
	}
	out.Reset()
	if cli.Main([]string{"explain", dir}, &out, &errs) != 0 {
		t.fail("explain: %s", errs.String())
	}
	rep.explain = out.String()
	files, err := bundle.Read(dir)
	t.check(err, "reading the bundle")
	m, err := files.Manifest()
	t.check(err, "the bundle's manifest")
	for _, g := range m.Grants {
		rep.Granted = append(rep.Granted, grantReport{Kind: string(g.Kind()), Access: string(g.Access()), Subject: g.Subject(), Fact: g.Why().Fact})
	}
}

// sandboxLeftovers names what of the sandbox outlived its delete: a
// launch record, a holder socket, its network in the uplink.
func sandboxLeftovers(t *demoT, w *world, stateRoot, runsc, id string) []string {
	var left []string
	// PS lists every launch record and every container in runsc's root.
	entries, err := inventory.Inventory{StateRoot: stateRoot, RunscPath: runsc}.PS()
	t.check(err, "launcher inventory")
	for _, e := range entries {
		left = append(left, fmt.Sprintf("sandbox %s (runsc %s, launcher %s)", e.ID, e.Status, e.Launcher))
	}
	if _, err := os.Stat(holder.Socket(stateRoot, id)); err == nil {
		left = append(left, "holder socket of "+id)
	}
	if _, err := os.Stat(sandboxnet.NetnsPath(filepath.Join(stateRoot, "net"), id)); err == nil {
		left = append(left, "netns of "+id)
	}
	// The launcher's cgroups live in paseo-sandbox/<id> of each hierarchy
	// (cgroup v1 and v2; runtime/launcher/inventory.go).
	cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/paseo-sandbox", id))
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/paseo-sandbox", id)); err == nil {
		cgs = append(cgs, filepath.Join("/sys/fs/cgroup/paseo-sandbox", id))
	}
	for _, c := range cgs {
		left = append(left, "cgroup "+c)
	}
	peer, _, table := sandboxnet.Names(id)
	return append(left, testnet.Leftovers(t, w.net.Uplink, peer, table)...)
}

// leftovers names what the demo left on the host once it ended: its work
// dir, or its supervisor's socket dir.
func leftovers(dirs ...string) []string {
	var left []string
	for _, d := range dirs {
		if _, err := os.Stat(d); d != "" && err == nil {
			left = append(left, d)
		}
	}
	return left
}

// hostUname is the host kernel's version string, to tell it from the
// sandbox's.
func hostUname() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Version[:])
}
