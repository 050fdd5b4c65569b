package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// moduleProbe is what testdata/module-probe.mjs reports.
type moduleProbe struct {
	Links   map[string]bool `json:"links"`
	Anchor  string          `json:"anchor"`
	Scripts map[string]struct {
		Functions int            `json:"functions"`
		From      map[string]int `json:"from"`
	} `json:"scripts"`
	Control struct {
		File       string `json:"file"`
		Script     string `json:"script"`
		InstanceOf bool   `json:"sessionManager instanceof its SessionManager"`
	} `json:"control"`
	Error string `json:"error"`
}

// probedSpecifiers are the specifiers Pi's loader resolves for extensions
// (its alias table, the same keys as its VIRTUAL_MODULES) that the probe
// imports: each must come out of the bundle Pi runs.
var probedSpecifiers = []string{
	"@earendil-works/pi-coding-agent", "@earendil-works/pi-agent-core", "@earendil-works/pi-tui",
	"@earendil-works/pi-ai", "@earendil-works/pi-ai/compat", "@earendil-works/pi-ai/oauth",
	"@earendil-works/pi-ai/providers/all", "typebox", "typebox/compile", "typebox/value",
	"@mariozechner/pi-ai", "@mariozechner/pi-coding-agent",
}

// An extension loaded by the bundled Pi gets the module instances the
// bundle runs, not second copies: the probe (as the integration extension,
// in the same sandbox and scene as every other test) finds Pi's own
// SessionManager and ModelRegistry to be instances of the classes it
// imported, links the other namespaces to those, and finds every function
// each namespace exports compiled from the bundle's files (pi.bundle.js and
// its chunks), where Pi's SessionManager comes from too. The control, the package's unbundled
// index.js imported by its path, must come out as a second copy, so a
// probe that could not tell would fail here. pi-mcp-adapter, loaded by the
// same loader, still lists its commands.
func TestPiExtensionSharesPiModules(t *testing.T) {
	e := newEnv(t)
	if e.image.Bundle.File == "" {
		t.Fatal("image.json names no Pi bundle: rebuild the image with `make image`")
	}
	sc := e.scene(t, "pi-session", "")
	probe, err := os.ReadFile("testdata/module-probe.mjs")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(sc.Host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"), string(probe))
	report := filepath.Join(sc.Workspace(), ".module-probe.json")

	p := e.launch(t, sc)
	c := ctx(t)
	p.call(t, c, map[string]any{"type": "get_state"})
	cmds := p.call(t, c, map[string]any{"type": "get_commands"})
	if !strings.Contains(string(cmds.Data), `"name":"mcp"`) {
		t.Errorf("get_commands does not list pi-mcp-adapter's mcp: %s", cmds.Data)
	}
	var data []byte
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if data, err = os.ReadFile(report); err == nil || !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("the probe extension wrote no report (%v)\nstderr: %s", err, p.stderr.String())
	}
	p.stop(t)
	var r moduleProbe
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
	if r.Error != "" {
		t.Fatalf("the probe failed: %s", r.Error)
	}
	t.Logf("probe report: %s", data)

	bundle := "file://" + e.image.Bundle.File
	// The bundle's own files: the entry and its chunks beside it.
	ofBundle := func(script string) bool {
		dir, name := path.Split(strings.TrimPrefix(script, "file://"))
		return "file://"+dir+name == script && dir == path.Dir(e.image.Bundle.File)+"/" &&
			(name == path.Base(e.image.Bundle.File) || strings.HasPrefix(name, "pi.chunk-") && strings.HasSuffix(name, ".js"))
	}
	if !ofBundle(r.Anchor) {
		t.Errorf("Pi's SessionManager comes from %s, not the bundle %s or its chunks", r.Anchor, bundle)
	}
	// Eight links for Pi 0.x; seven for 1.x, whose pi-agent-core re-exports
	// nothing of pi-ai (the probe checks where its functions come from).
	if len(r.Links) < 7 {
		t.Errorf("the probe checked %d links, want at least 7", len(r.Links))
	}
	for name, ok := range r.Links {
		if !ok {
			t.Errorf("second copy: %s is false", name)
		}
	}
	total := 0
	for _, spec := range probedSpecifiers {
		s, ok := r.Scripts[spec]
		if !ok {
			t.Errorf("%s: not probed", spec)
			continue
		}
		total += s.Functions
		for script, n := range s.From {
			if !ofBundle(script) {
				t.Errorf("second copy: %d of %s's functions come from %s, not the bundle", n, spec, script)
			}
		}
	}
	if total < 100 {
		t.Errorf("the probe located %d functions in all, too few to tell", total)
	}
	if r.Control.Script == "" || ofBundle(r.Control.Script) || r.Control.InstanceOf {
		t.Errorf("the control (%s, a second copy on purpose) was not seen as one: script %q, instanceof %v",
			r.Control.File, r.Control.Script, r.Control.InstanceOf)
	}
}
