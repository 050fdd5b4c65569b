package schema

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/diag"
)

func baseFacts(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "base", "facts.json"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// refusedWith fails unless err is a diag.List holding code.
func refusedWith(t *testing.T, err error, code diag.Code) {
	t.Helper()
	var l diag.List
	if !errors.As(err, &l) {
		t.Fatalf("got %v, want a %s refusal", err, code)
	}
	for _, d := range l {
		if d.Code == code {
			return
		}
	}
	t.Fatalf("got %v, want %s", l, code)
}

func TestReadInputRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/dev/zero", "/dev/null", dir, fifo} {
		done := make(chan error, 1)
		go func() { _, err := ReadInput(p, ""); done <- err }()
		select {
		case err := <-done:
			refusedWith(t, err, diag.InputNotRegular)
		case <-time.After(10 * time.Second):
			t.Fatalf("ReadInput(%s) did not return", p)
		}
	}
}

func TestReadInputBounds(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, MaxInputBytes+1), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadInput(big, "registry")
	refusedWith(t, err, diag.InputTooLarge)

	exact := filepath.Join(dir, "exact.json")
	if err := os.WriteFile(exact, make([]byte, MaxInputBytes), 0o644); err != nil {
		t.Fatal(err)
	}
	if in, err := ReadInput(exact, ""); err != nil || len(in.Data) != MaxInputBytes {
		t.Fatalf("a file of exactly the bound: %d bytes, %v", len(in.Data), err)
	}

	// A symlink to a regular file is followed (operators keep /etc as links).
	good := filepath.Join(dir, "facts.json")
	if err := os.WriteFile(good, baseFacts(t), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	in, err := ReadInput(link, "")
	if err != nil || in.Name != "link.json" {
		t.Fatalf("symlinked input: %+v, %v", in.Name, err)
	}
	if _, err := ReadInput(filepath.Join(dir, "missing.json"), ""); err == nil || errors.As(err, new(diag.List)) {
		t.Fatalf("a missing file is an I/O error, got %v", err)
	}
}

// TestInMemoryBound: input handed in as bytes (the supervisor's request
// frames) is bounded by the loader too.
func TestInMemoryBound(t *testing.T) {
	data := append(baseFacts(t), make([]byte, MaxInputBytes)...)
	_, l := NewLoader().Facts(Input{Name: "facts.json", Data: data})
	if !hasCode(l, diag.InputTooLarge, "") {
		t.Fatalf("got %v", l)
	}
}

func hasCode(l diag.List, code diag.Code, path string) bool {
	for _, d := range l {
		if d.Code == code && d.Path == path {
			return true
		}
	}
	return false
}

func TestDuplicateJSONKeys(t *testing.T) {
	base := string(baseFacts(t))
	for _, tc := range []struct {
		name, data, path string
	}{
		{"top level", strings.Replace(base, `"kind": "Facts",`, `"kind": "Facts", "kind": "Facts",`, 1), "kind"},
		{"nested, different values", strings.Replace(base, `"id": "fake-1",`, `"id": "fake-1", "id": "fake-2",`, 1), "model.id"},
		{"inside a list", `{"a":[{"b":1},{"b":1,"b":2}]}`, "a[1].b"},
		// encoding/json compares keys exactly, as CUE does; an escaped
		// spelling of the same key is the same key.
		{"escaped spelling", `{"kind":"Facts","\u006bind":"Facts"}`, "kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, l := NewLoader().Facts(Input{Name: "facts.json", Data: []byte(tc.data)})
			if !hasCode(l, diag.InputDuplicateKey, tc.path) {
				t.Fatalf("got %v, want %s at %s", l, diag.InputDuplicateKey, tc.path)
			}
		})
	}
	if f, l := NewLoader().Facts(Input{Name: "facts.json", Data: []byte(base)}); f == nil {
		t.Fatalf("base facts refused: %v", l)
	}
}

func TestDeepJSON(t *testing.T) {
	data := `{"a":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`
	_, l := NewLoader().Facts(Input{Name: "facts.json", Data: []byte(data)})
	if len(l) == 0 || l[0].Code != diag.InputSyntax {
		t.Fatalf("got %v", l)
	}
}

// TestCUEStaysData: every CUE construct beyond fields, literals, structs
// and lists is refused, each with its code; the data forms are accepted.
func TestCUEStaysData(t *testing.T) {
	const head = "apiVersion: \"paseo.dev/policy/v1alpha1\"\nkind: \"Facts\"\n"
	for _, tc := range []struct {
		name, src string
		code      diag.Code
		path      string
	}{
		{"import", "import \"strings\"\n" + head, diag.InputSyntax, ""},
		{"definition", head + "#D: {id: \"x\"}\n", diag.InputNotData, ""},
		{"hidden field", head + "_h: 1\n", diag.InputNotData, ""},
		{"reference", head + "x: \"a\"\nagent: {id: x}\n", diag.InputNotData, "agent.id"},
		{"comprehension", head + "agent: {for k in [1] {id: \"x\"}}\n", diag.InputNotData, "agent"},
		{"top-level comprehension", head + "for k in [1] {a: 1}\n", diag.InputNotData, ""},
		{"let", head + "let y = 1\n", diag.InputNotData, ""},
		{"interpolation", head + "agent: {id: \"a\\(1)\"}\n", diag.InputNotData, "agent.id"},
		{"disjunction", head + "agent: {id: \"a\" | \"b\"}\n", diag.InputNotData, "agent.id"},
		{"default", head + "agent: {id: *\"a\" | \"b\"}\n", diag.InputNotData, "agent.id"},
		{"unification", head + "agent: {id: string & \"a\"}\n", diag.InputNotData, "agent.id"},
		{"bound", head + "n: >0\n", diag.InputNotData, "n"},
		{"type", head + "agent: {id: string}\n", diag.InputNotData, "agent.id"},
		{"optional", head + "agent?: {id: \"a\"}\n", diag.InputNotData, "agent"},
		{"required", head + "agent!: {id: \"a\"}\n", diag.InputNotData, "agent"},
		{"attribute", head + "agent: {id: \"a\" @tag(id)}\n", diag.InputNotData, "agent.id"},
		{"embedded list", head + "[1]\n", diag.InputNotData, ""},
		{"embedded reference", head + "agent\n", diag.InputNotData, ""},
		{"duplicate across an embedded struct", head + "{kind: \"Facts\"}\n", diag.InputDuplicateKey, "kind"},
		{"embedding inside a struct", head + "agent: {{id: \"a\"}}\n", diag.InputNotData, "agent"},
		{"pattern", head + "agent: {[string]: \"a\"}\n", diag.InputNotData, "agent"},
		{"dynamic label", head + "agent: {(\"i\" + \"d\"): \"a\"}\n", diag.InputNotData, "agent"},
		{"open list", head + "a: [1, ...]\n", diag.InputNotData, "a[1]"},
		{"alias", head + "X=agent: {id: \"a\"}\n", diag.InputNotData, ""},
		{"selector", head + "a: {b: 1}\nc: a.b\n", diag.InputNotData, "c"},
		{"call", head + "a: len([1])\n", diag.InputNotData, "a"},
		{"duplicate field", head + "agent: {id: \"a\"}\nagent: {profile: \"pi-session\"}\n", diag.InputDuplicateKey, "agent"},
		{"duplicate by shorthand", head + "deployment: id: \"a\"\ndeployment: id: \"a\"\n", diag.InputDuplicateKey, "deployment"},
		{"duplicate quoted", head + "agent: {id: \"a\", \"id\": \"a\"}\n", diag.InputDuplicateKey, "agent.id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, l := NewLoader().Facts(Input{Name: "facts.cue", Data: []byte(tc.src)})
			if !hasCode(l, tc.code, tc.path) {
				t.Fatalf("got %v, want %s at %q", l, tc.code, tc.path)
			}
		})
	}
	// Data forms: comments, a package clause, quoted labels, shorthand,
	// negative numbers, multi-line strings. They get past the data check
	// (the schema may still have its say).
	ok := "package facts\n// a comment\n" + head + "\"quoted\": 1\na: b: -1.5\nc: [1, {d: null}, true]\ne: \"\"\"\n\tx\n\t\"\"\"\n"
	_, l := NewLoader().Facts(Input{Name: "facts.cue", Data: []byte(ok)})
	for _, d := range l {
		if d.Code == diag.InputNotData || d.Code == diag.InputDuplicateKey || d.Code == diag.InputSyntax {
			t.Fatalf("data forms refused: %v", l)
		}
	}
}
