package bundle

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// indentSeeds are documents with what could trip an indenter: brackets,
// commas, colons, quotes and backslashes inside strings, escapes at a
// string's end, empty and nested-empty containers, scalars at the top.
var indentSeeds = []string{
	`{}`, `[]`, `{"a":{}}`, `{"a":[]}`, `[[],[{}],{"":[]}]`,
	`{"k":"v,{}[]:\"","e":"\\","f":"\\\"","g":"\u00e9\u2028<>&"}`,
	`{"n":-1.5e+10,"t":true,"f":false,"z":null,"s":"x"}`,
	`[1,"two",[3,[4,[5]]],{"six":{"seven":[8]}}]`,
	`"a string"`, `42`, `null`,
	`{"ports":[{"port":443,"host":"api.example.test"}],"env":["A=1","B=a:b,c"]}`,
}

// sameAsEncoding fails unless indentCompact gives json.Indent's bytes for
// the compact form of doc, with and without the Encoder's final newline.
func sameAsEncoding(t *testing.T, doc []byte) {
	t.Helper()
	var compact bytes.Buffer
	if err := json.Compact(&compact, doc); err != nil {
		return // not JSON: the encoder never writes it
	}
	for _, src := range [][]byte{compact.Bytes(), append(compact.Bytes(), '\n')} {
		var want bytes.Buffer
		if err := json.Indent(&want, src, "", "  "); err != nil {
			t.Fatal(err)
		}
		if got := indentCompact(nil, src); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("indenting %q:\ngot  %q\nwant %q", src, got, want.Bytes())
		}
	}
}

// TestIndentCompactMatchesEncoding holds Marshal's indenter to
// encoding/json's on the seeds, on every JSON file of the golden bundles (testdata/*/golden/),
// and on Marshal of a value with HTML characters (escaping is off).
func TestIndentCompactMatchesEncoding(t *testing.T) {
	for _, s := range indentSeeds {
		sameAsEncoding(t, []byte(s))
	}
	goldens, err := filepath.Glob(filepath.Join("..", "..", "testdata", "*", "golden", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(goldens) < 10 {
		t.Fatalf("found %d golden JSON files under testdata/*/golden/; the layout changed?", len(goldens))
	}
	for _, g := range goldens {
		doc, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		sameAsEncoding(t, doc)
	}
	v := map[string]any{"html": "<a href=\"x\">&</a>", "list": []any{}, "obj": map[string]any{}, "n": 1}
	var want bytes.Buffer
	enc := json.NewEncoder(&want)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	got, err := Marshal(v)
	if err != nil || !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("Marshal: %v\ngot  %q\nwant %q", err, got, want.Bytes())
	}
}

func FuzzIndentCompact(f *testing.F) {
	for _, s := range indentSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(sameAsEncoding)
}
