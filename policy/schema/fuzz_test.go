package schema

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/internal/pathform"
)

// FuzzLoadFacts: decoding never panics; what it accepts has canonical
// absolute paths and round-trips through JSON to the same facts.
func FuzzLoadFacts(f *testing.F) {
	base, err := os.ReadFile(filepath.Join("..", "..", "testdata", "base", "facts.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(base)
	f.Add([]byte(`{"apiVersion":"paseo.dev/policy/v1alpha1","kind":"Facts"}`))
	f.Add([]byte(`{"workspace":{"cwd":"/a/../b"}}`))
	f.Add([]byte(`[1,2,{"a":null}]`))
	f.Add([]byte(`{"kind":"Facts","kind":"Facts","a":{"b":1,"b":2}}`))
	f.Add([]byte(`{"a":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		facts, diags := NewLoader().Facts(Input{Name: "facts.json", Data: data})
		if facts == nil {
			if len(diags) == 0 {
				t.Fatal("refused without a diagnostic")
			}
			return
		}
		for _, p := range []string{facts.Workspace.Cwd, facts.State.AgentDir, facts.State.SessionDir, facts.Launch.Extension} {
			if code, _ := pathform.Check(p); code != "" {
				t.Fatalf("accepted bad path %q (%s)", p, code)
			}
		}
		again, err := json.Marshal(facts)
		if err != nil {
			t.Fatal(err)
		}
		facts2, diags2 := NewLoader().Facts(Input{Name: "facts.json", Data: again})
		if facts2 == nil {
			t.Fatalf("re-encoded facts refused: %v", diags2)
		}
		if a, b := mustJSON(t, facts), mustJSON(t, facts2); a != b {
			t.Fatalf("round trip changed facts:\n%s\n%s", a, b)
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzLoadCUEFacts: the CUE data check never panics, and CUE facts it
// accepts decode to the same facts as their JSON rendering.
func FuzzLoadCUEFacts(f *testing.F) {
	cue, err := os.ReadFile(filepath.Join("..", "..", "testdata", "host-pi-session-cue-input", "facts.cue"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cue)
	f.Add([]byte("a: b: 1\na: c: 2\n"))
	f.Add([]byte("#x: 1\ny: #x\nfor k in [1] {z: k}\n"))
	f.Add([]byte("{kind: \"Facts\"}\n[1, ...]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		facts, diags := NewLoader().Facts(Input{Name: "facts.cue", Data: data})
		if facts == nil {
			if len(diags) == 0 {
				t.Fatal("refused without a diagnostic")
			}
			return
		}
		again, err := json.Marshal(facts)
		if err != nil {
			t.Fatal(err)
		}
		facts2, diags2 := NewLoader().Facts(Input{Name: "facts.json", Data: again})
		if facts2 == nil {
			t.Fatalf("JSON rendering of accepted CUE facts refused: %v", diags2)
		}
		if a, b := mustJSON(t, facts), mustJSON(t, facts2); a != b {
			t.Fatalf("round trip changed facts:\n%s\n%s", a, b)
		}
	})
}
