package supervisor

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// A refused createSandbox carries every diagnostic the compiler gave, as
// data (PP-* code, fact path, message), the same list a compile of the
// same facts gives, sorted; the secret-looking value in the facts is in
// none of it, and nothing was made.
func TestRefusedDiagnosticsAsData(t *testing.T) {
	f := newFixture(t, 200)
	const secret = "sk-live-Abcdefghijklmnop1234"
	facts, err := testtree.MergePatch(f.sc.Facts, []byte(`{"workspace":{"cwd":"relative/path"},"model":{"baseURL":"http://127.0.0.1:9/v1"},"credential":{"secretRef":"`+secret+`"},"extra":true}`))
	if err != nil {
		t.Fatal(err)
	}
	_, want := compiler.Compile(compiler.Inputs{Facts: schema.Input{Name: "facts.json", Data: facts}, Registry: f.cfg.Registry}, compiler.Options{})
	if len(want) < 3 {
		t.Fatalf("the facts should be refused several times over: %v", want)
	}
	c := f.dial(t)
	err = c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: facts}, nil)
	var e *Error
	if !asError(err, &e) || e.Code != rpcerr.Refused {
		t.Fatalf("createSandbox: %v, want refused", err)
	}
	if diff := cmp.Diff([]byte(mustJSON(t, want.Sorted())), []byte(mustJSON(t, e.Diagnostics))); diff != "" {
		t.Errorf("diagnostics over the socket (-compiler +wire):\n%s", diff)
	}
	for _, d := range e.Diagnostics {
		if !strings.HasPrefix(string(d.Code), "PP-") || d.Message == "" {
			t.Errorf("diagnostic without a PP-* code or message: %+v", d)
		}
	}
	if bytes.Contains([]byte(mustJSON(t, e)), []byte(secret)) || strings.Contains(e.Error(), secret) {
		t.Error("the refusal echoes the secret-looking value")
	}
	var list []Info
	if err := c.Call(tctx(t), Request{Op: "list"}, &list); err != nil || len(list) != 0 {
		t.Errorf("after the refusal: %v %v", list, err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// A createSandbox the launcher's preflight refuses answers unavailable with
// each failed check as data: its PP-PREFLIGHT-* code at preflight.<check>,
// carried from the launcher through the holder's ready pipe, never
// remapped. Here runsc's digest file records another digest; nothing is
// made.
func TestPreflightRefusalCodesAsData(t *testing.T) {
	f := newFixture(t, 200)
	f.stop()
	dir := t.TempDir()
	runsc := filepath.Join(dir, "runsc")
	if err := os.Symlink(f.sc.Runsc, runsc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(runsc+".sha256", []byte(strings.Repeat("0", 64)+"  runsc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.cfg.RunscPath = runsc
	f.start(t)
	c := f.dial(t)
	err := c.Call(tctx(t), Request{Op: "createSandbox", Deployment: "host-alice", Facts: f.sc.Facts}, nil)
	var e *Error
	if !asError(err, &e) || e.Code != rpcerr.Unavailable {
		t.Fatalf("createSandbox: %v, want unavailable", err)
	}
	if len(e.Diagnostics) != 1 || e.Diagnostics[0].Code != diag.PreflightRunscDigest || e.Diagnostics[0].Path != "preflight.runsc-digest" || e.Diagnostics[0].Message == "" {
		t.Errorf("diagnostics %+v, want one %s at preflight.runsc-digest", e.Diagnostics, diag.PreflightRunscDigest)
	}
	var list []Info
	if err := c.Call(tctx(t), Request{Op: "list"}, &list); err != nil || len(list) != 0 {
		t.Errorf("after the refusal: %v %v", list, err)
	}
	// Nothing of the sandbox is left; the holder's log stays, as for any
	// launch a holder reported refused.
	entries, err := inventory.Inventory{StateRoot: f.sc.State, RunscPath: f.sc.Runsc}.PS()
	if err != nil || len(entries) != 0 {
		t.Errorf("left after the refusal: %+v %v", entries, err)
	}
	for _, d := range []string{"run", "records", "bundles"} {
		if ents, _ := os.ReadDir(filepath.Join(f.sc.State, d)); len(ents) > 0 {
			t.Errorf("%s left: %v", d, ents)
		}
	}
}

// A wake the launcher's preflight refuses answers sandbox-unavailable with
// startFresh and each failed check as data, as a create does: here runsc's
// digest file was changed while the sandbox was hibernated.
func TestWakePreflightRefusalCodesAsData(t *testing.T) {
	f := newFixture(t, 200)
	f.stop()
	dir := t.TempDir()
	runsc := filepath.Join(dir, "runsc")
	if err := os.Symlink(f.sc.Runsc, runsc); err != nil {
		t.Fatal(err)
	}
	digests := mustReadFile(t, f.sc.Runsc+".sha256")
	if err := os.WriteFile(runsc+".sha256", digests, 0o644); err != nil {
		t.Fatal(err)
	}
	f.cfg.RunscPath = runsc
	f.start(t)
	c := f.dial(t)
	in := f.create(t, c)
	h := &hibernateSession{t: t, id: in.Sandbox, tr: &transcript{}}
	if err := h.attach(c); err != nil {
		t.Fatal(err)
	}
	h.turn()
	h.hibernate()
	if err := os.WriteFile(runsc+".sha256", []byte(strings.Repeat("0", 64)+"  runsc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := c.Call(tctx(t), Request{Op: "wake", Sandbox: in.Sandbox}, nil)
	var e *Error
	if !asError(err, &e) || e.Code != rpcerr.SandboxUnavailable || !e.StartFresh {
		t.Fatalf("wake: %v, want sandbox-unavailable with startFresh", err)
	}
	if len(e.Diagnostics) != 1 || e.Diagnostics[0].Code != diag.PreflightRunscDigest || e.Diagnostics[0].Path != "preflight.runsc-digest" {
		t.Errorf("diagnostics %+v, want one %s at preflight.runsc-digest", e.Diagnostics, diag.PreflightRunscDigest)
	}
	if err := c.Call(tctx(t), Request{Op: "delete", Sandbox: in.Sandbox}, nil); err != nil {
		t.Fatal(err)
	}
	f.assertNothingLeft(t)
}

func mustReadFile(t *testing.T, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
