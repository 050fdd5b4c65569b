package compiler

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
)

// compileSettings compiles the reference launch with the daemon's
// settings.json replaced by settings.
func compileSettings(t *testing.T, settings string) diag.List {
	t.Helper()
	_, in, res := caseInputs(t, "host-pi-session-api-key")
	p := filepath.Join(res.Base, "srv/paseo/state/pi-agent/settings.json")
	if err := os.WriteFile(p, []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	_, diags := Compile(in, Options{Resolver: res})
	return diags
}

// Every inert key, and the checked keys naming only the image, a private
// tmpfs or patterns, compile.
func TestSettingsAccepted(t *testing.T) {
	all := map[string]any{}
	for k, s := range settingKeys {
		if s.kind == inert {
			all[k] = true
		}
	}
	inertJSON, err := json.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	for name, settings := range map[string]string{
		"empty":  `{}`,
		"inert":  string(inertJSON),
		"nested": `{"retry":{"provider":{"timeoutMs":1,"other":2}},"terminal":{"showImages":false}}`,
		"shell":  `{"shellPath":"/bin/bash"}`,
		"trust":  `{"defaultProjectTrust":"never"}`,
		"resources": `{"extensions":["extensions/x.ts","~/ext","/opt/pi/ext"," /opt/pi/ext2","/tmp/jiti/x.js"],` +
			// Patterns only filter what plain entries found.
			`"skills":["!/srv/paseo/workspace/**","+/srv/paseo/workspace/proj-feature/SKILL.md","-/tmp/jiti/x","*.md"],` +
			`"prompts":null,"themes":[]}`,
		"packages": `{"packages":["/opt/pi/node_modules/pi-mcp-adapter","npm:pi-skills","npm:@scope/pkg@1.2.3",` +
			`"git:github.com/a/b@v1","https://github.com/a/b","../pi-agent/extensions/p",` +
			`{"source":"/opt/pi/node_modules/x","autoload":false,"extensions":["../../../srv/paseo/workspace/x.ts"],"skills":[],"prompts":[],"themes":[]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			if diags := compileSettings(t, settings); len(diags) > 0 {
				t.Fatalf("refused:\n%v", diags)
			}
		})
	}
}

// Each key Pi runs or loads something from is refused when it names what a
// sandbox could write, or always when no check can bound it; so is every
// key off the list. One diagnostic each, at the settings file.
func TestSettingsRefused(t *testing.T) {
	for name, settings := range map[string]string{
		"not an object":       `[]`,
		"null":                `null`,
		"unknown key":         `{"mcpServers":{}}`,
		"unknown package key": `{"packages":[{"source":"/opt/pi/x","run":"sh"}]}`,

		"shell prefix":    `{"shellCommandPrefix":"shopt -s expand_aliases"}`,
		"npm command":     `{"npmCommand":["npm"]}`,
		"external editor": `{"externalEditor":"nano"}`,
		"session dir":     `{"sessionDir":"/srv/paseo/state/pi-sessions/agent-7f3c"}`,
		"api keys":        `{"apiKeys":{"fake":"!echo sk-not-a-real-key"}}`,

		"shell in workspace": `{"shellPath":"/srv/paseo/workspace/proj-feature/bash"}`,
		"shell in tmp":       `{"shellPath":"/tmp/bash"}`,
		"shell in cache":     `{"shellPath":"/tmp/jiti/bash"}`,
		"shell in home":      `{"shellPath":"~/bash"}`,
		"shell in agent dir": `{"shellPath":"/srv/paseo/state/pi-agent/bash"}`,
		"shell relative":     `{"shellPath":"bin/bash"}`,
		"shell dotdot":       `{"shellPath":"/bin/../tmp/bash"}`,
		"shell url":          `{"shellPath":"file:///bin/bash"}`,
		"shell empty":        `{"shellPath":""}`,
		"shell not string":   `{"shellPath":1}`,

		"trust always":  `{"defaultProjectTrust":"always"}`,
		"trust unknown": `{"defaultProjectTrust":"yes"}`,

		"extension in workspace":    `{"extensions":["/srv/paseo/workspace/proj-feature/.pi/x.ts"]}`,
		"extension trimmed":         `{"extensions":["\u00a0/srv/paseo/workspace/proj-feature/x.ts\n"]}`,
		"extension relative escape": `{"extensions":["../pi-sessions/agent-7f3c/x.ts"]}`,
		"extension read-only bind":  `{"extensions":["/srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"]}`,
		"extension holds binds":     `{"extensions":["/"]}`,
		"extension agent dir":       `{"extensions":["."]}`,
		"extension url":             `{"extensions":["file:///opt/pi/x.ts"]}`,
		"extensions not a list":     `{"extensions":"/opt/pi/x.ts"}`,
		"skills legacy object":      `{"skills":{"customDirectories":["/opt/pi/skills"]}}`,
		"prompt in session dir":     `{"prompts":["~/../../../srv/paseo/state/pi-sessions/agent-7f3c"]}`,
		"theme in git dir":          `{"themes":["/srv/paseo/repos/proj/.git/t.json"]}`,

		"package npm dotdot":     `{"packages":["npm:../../../../srv/paseo/workspace/proj-feature/x"]}`,
		"package npm path":       `{"packages":["npm:a/b/c"]}`,
		"package relative":       `{"packages":["../pi-sessions/agent-7f3c/pkg"]}`,
		"package git fallback":   `{"packages":["git:x/../../pi-sessions/agent-7f3c"]}`,
		"package object":         `{"packages":[{"source":"/srv/paseo/workspace/proj-feature/pkg"}]}`,
		"package no source":      `{"packages":[{"extensions":[]}]}`,
		"package not a source":   `{"packages":[1]}`,
		"packages not a list":    `{"packages":{"source":"/opt/pi/x"}}`,
		"package url":            `{"packages":["file:///opt/pi/x"]}`,
		"package read-only file": `{"packages":["/srv/paseo/state/pi-agent/models.json"]}`,
	} {
		t.Run(name, func(t *testing.T) {
			diags := compileSettings(t, settings)
			if diff := cmp.Diff([]diag.Code{diag.StateSettings}, codes(diags)); diff != "" {
				t.Fatalf("codes (-want +got):\n%s\n%v", diff, diags)
			}
			if diags[0].Path != settingsFact {
				t.Errorf("path %q, want %q", diags[0].Path, settingsFact)
			}
		})
	}
}

// Every refusal of a list is reported, in a stable order, and no value
// reaches a message (apiKeys holds secrets).
func TestSettingsAllReportedNoValues(t *testing.T) {
	const settings = `{"zz":1,"apiKeys":{"fake":"!echo sk-not-a-real-key"},"npmCommand":["/srv/secret-wrapper"],` +
		`"extensions":["/srv/paseo/workspace/proj-feature/a.ts","/srv/paseo/workspace/proj-feature/b.ts"],"aa":2}`
	diags := compileSettings(t, settings)
	if len(diags) != 6 {
		t.Fatalf("want 6 diagnostics (two unknown keys, two refused keys, two extensions), got:\n%v", diags)
	}
	for _, s := range []string{"sk-not-a-real-key", "secret-wrapper", "a.ts", "b.ts"} {
		if strings.Contains(diags.Error(), s) {
			t.Errorf("a diagnostic carries the value %q:\n%v", s, diags)
		}
	}
	if diff := cmp.Diff(diags, compileSettings(t, settings)); diff != "" {
		t.Errorf("a second compile changed the diagnostics (-first +second):\n%s", diff)
	}
}

// Every refused key says why.
func TestSettingKeysRefusedSayWhy(t *testing.T) {
	for k, s := range settingKeys {
		if (s.kind == refused) != (s.why != "") {
			t.Errorf("%s: a refused key needs a reason, and only a refused key has one", k)
		}
	}
}

// piPath resolves as Node's path.resolve does after Pi's "~" expansion.
func TestPiPath(t *testing.T) {
	const base = "/srv/paseo/state/pi-agent"
	for _, c := range []struct{ in, want string }{
		{"", base},
		{".", base},
		{"x", base + "/x"},
		{"../x", "/srv/paseo/state/x"},
		{"git:..", base + "/git:.."},
		{"~", sandboxHome},
		{"~/a/../b", sandboxHome + "/b"},
		{"~x", base + "/~x"},
		{"/a//b/", "/a/b"},
		{"/../a", "/a"},
		{"file:x", base + "/file:x"},
	} {
		got, ok := piPath(c.in, base)
		if !ok || got != c.want {
			t.Errorf("piPath(%q) = %q, %v; want %q", c.in, got, ok, c.want)
		}
	}
	if _, ok := piPath("file:///a", base); ok {
		t.Error("a file:// URL must not resolve")
	}
}
