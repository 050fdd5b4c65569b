package main

import (
	"strings"
	"testing"

	"paseo.dev/paseo-policy/runtime/gitimport"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// A report passes only when everything held; each way the turn could go
// wrong fails the verdict on its own.
func TestVerdictFailsClosed(t *testing.T) {
	exit := 0
	good := func() *report {
		return &report{
			GVisor:    gvisorReport{Confirmed: true},
			Workspace: fileReport{Content: demoText, Owner: "1000:1000"},
			Blocked:   []attempt{{Attempt: "metadata", Contained: true}},
			Packets:   map[string]uint64{"drop-egress": 4},
			Routes:    map[string]launcher.RouteStats{"mcp": {Forwarded: 3}, "model": {Forwarded: 2}},
			Exit:      &exit, apiKey: "sk-demo-1", marker: "canary-1",
			Git: &gitReport{Base: "b0", Updated: []gitimport.RefUpdate{{Ref: demoBranch, Old: "b0", New: "c1"}},
				Log: []string{"c1 " + demoCommit, "b0 the repository before the agent"}},
		}
	}
	if fails := good().verdict(); len(fails) != 0 {
		t.Fatalf("a good report fails: %v", fails)
	}
	one := 1
	cases := map[string]func(*report){
		"gVisor":          func(r *report) { r.GVisor.Confirmed = false },
		"not contained":   func(r *report) { r.Blocked[0].Contained = false },
		"nothing dropped": func(r *report) { r.Packets["drop-egress"] = 0 },
		"model unused":    func(r *report) { r.Routes["model"] = launcher.RouteStats{} },
		"route unused":    func(r *report) { r.Routes = nil },
		"file owner":      func(r *report) { r.Workspace.Owner = "0:0" },
		"exit":            func(r *report) { r.Exit = &one },
		"no exit":         func(r *report) { r.Exit = nil },
		"secret in json":  func(r *report) { r.Transcript = []string{"key sk-demo-1"} },
		"canary in json":  func(r *report) { r.Blocked[0].Evidence = "read canary-1" },
		"no import":       func(r *report) { r.Git = nil },
		"import refused":  func(r *report) { r.Git.Refused = []string{"PP-GIT-IMPORT-MOVED"} },
		"commit missing":  func(r *report) { r.Git.Log = r.Git.Log[1:] },
	}
	for name, edit := range cases {
		r := good()
		edit(r)
		if fails := r.verdict(); len(fails) == 0 {
			t.Errorf("%s: the verdict passed", name)
		}
	}
}

// The transcript pairs each tool call with its result, whatever order
// Pi's parallel calls end in, and keeps the assistant's text.
func TestTranscript(t *testing.T) {
	stdout := strings.Join([]string{
		`{"type":"tool_execution_start","toolCallId":"a","toolName":"write","args":{"path":"x"}}`,
		`{"type":"tool_execution_start","toolCallId":"b","toolName":"bash","args":{"command":"id"}}`,
		`{"type":"tool_execution_end","toolCallId":"b","toolName":"bash","result":{"content":[{"type":"text","text":"uid=1000"}]},"isError":false}`,
		`{"type":"tool_execution_end","toolCallId":"a","toolName":"write","result":{"content":[{"type":"text","text":"EACCES"}]},"isError":true}`,
		`{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"do"}}`,
		`{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"ne"}}`,
		`{"type":"message_end"}`,
	}, "\n")
	got := strings.Join(transcript("go", stdout), "\n")
	want := strings.Join([]string{"> go",
		"  tool bash id", "    = ok: uid=1000",
		"  tool write x", "    = error: EACCES",
		"< done"}, "\n")
	if got != want {
		t.Errorf("transcript:\n%s\nwant:\n%s", got, want)
	}
}

func TestWrap(t *testing.T) {
	got := wrap(strings.Repeat("word ", 30), "  ", "    ")
	for _, l := range strings.Split(strings.TrimSuffix(got, "\n"), "\n") {
		if len(l) > width || !strings.HasPrefix(l, "  ") {
			t.Errorf("line %q", l)
		}
	}
	if strings.Count(got, "word") != 30 {
		t.Errorf("words lost: %q", got)
	}
}

// Every line the demo prints of its own fits an ordinary terminal, however
// long the transcript's commands, the digests and the evidence are.
func TestPrintFits(t *testing.T) {
	long := strings.Repeat("x", 150)
	exit := 0
	r := &report{
		Sandbox:    "pp-0123456789abcdef",
		Image:      imageReport{Version: "pi-0.84.2-2", Digest: "sha256:" + strings.Repeat("a", 64)},
		Runsc:      runscReport{Digest: "sha256:" + strings.Repeat("b", 64)},
		Transcript: []string{"> " + long, "  tool bash " + long, "    = ok: " + long, "      " + long},
		GVisor:     gvisorReport{Confirmed: true, Evidence: []string{"uname -v in the sandbox: " + strings.Repeat("word ", 30)}},
		Workspace:  fileReport{Path: "/w/DEMO.md", Content: demoText, Owner: "1000:1000"},
		Blocked:    []attempt{{Attempt: "metadata " + strings.Repeat("y ", 60), Contained: true, Evidence: strings.Repeat("z ", 80)}},
		Exit:       &exit,
	}
	var b strings.Builder
	r.print(&b)
	for _, l := range strings.Split(b.String(), "\n") {
		if len(l) > width {
			t.Errorf("%d columns: %q", len(l), l)
		}
	}
}
