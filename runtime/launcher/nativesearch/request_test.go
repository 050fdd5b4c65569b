package nativesearch

import (
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
)

// Encode and Decode round-trip a request on the list, and Argv re-encodes
// it as rg's arguments: long options with "=value", then "--".
func TestRequestRoundTrip(t *testing.T) {
	r := Request{Cwd: "sub/dir", Pattern: pat("-e looks like a flag"), Paths: []string{"./a/", wsDest + "/b.go", "--pre"},
		Options: []Option{{Name: "ignore-case"}, {Name: "glob", Value: "--pre=x"}, {Name: "context", Value: "2"}, {Name: "color=never"}}}
	got, err := Decode(r.Encode(), wsDest)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--no-config", "--ignore-case", "--glob=--pre=x", "--context=2", "--color=never", "--", "-e looks like a flag", "./a/", wsDest + "/b.go", "--pre"}
	if a := got.Argv(); !slices.Equal(a, want) {
		t.Errorf("argv %q, want %q", a, want)
	}
}

// Everything off the list is refused with PP-SEARCH-REQUEST.
func TestRequestRefusals(t *testing.T) {
	ok := func() Request { return Request{Cwd: ".", Pattern: pat("x")} }
	for name, r := range map[string]Request{
		"cwd ..":           {Cwd: "..", Pattern: pat("x")},
		"cwd absolute":     {Cwd: "/etc", Pattern: pat("x")},
		"cwd a/../b":       {Cwd: "a/../b", Pattern: pat("x")},
		"path ..":          func() Request { r := ok(); r.Paths = []string{"../x"}; return r }(),
		"path a/../../x":   func() Request { r := ok(); r.Paths = []string{"a/../../x"}; return r }(),
		"path outside":     func() Request { r := ok(); r.Paths = []string{"/etc/passwd"}; return r }(),
		"path ws prefix":   func() Request { r := ok(); r.Paths = []string{wsDest + "x/y"}; return r }(),
		"path stdin":       func() Request { r := ok(); r.Paths = []string{"-"}; return r }(),
		"path control":     func() Request { r := ok(); r.Paths = []string{"a\nb"}; return r }(),
		"pre":              {Cwd: ".", Pattern: pat("x"), Options: []Option{{Name: "pre", Value: "./evil"}}},
		"follow":           {Cwd: ".", Pattern: pat("x"), Options: []Option{{Name: "follow"}}},
		"search-zip":       {Cwd: ".", Pattern: pat("x"), Options: []Option{{Name: "search-zip"}}},
		"color=always":     {Cwd: ".", Pattern: pat("x"), Options: []Option{{Name: "color=always"}}},
		"context 1e3":      {Cwd: ".", Pattern: pat("x"), Options: []Option{{Name: "context", Value: "1e3"}}},
		"context -1":       {Cwd: ".", Pattern: pat("x"), Options: []Option{{Name: "context", Value: "-1"}}},
		"type with a glob": {Cwd: ".", Pattern: pat("x"), Options: []Option{{Name: "type", Value: "go:*.go"}}},
		"no pattern":       {Cwd: "."},
	} {
		if _, err := Decode(r.Encode(), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("%s: %v, want %s", name, err, diag.SearchRequest)
		}
	}
	for name, b := range map[string]string{
		"empty":                "",
		"no NUL at the end":    magic + "\x00cwd\x00.",
		"another magic":        "paseo-search 2\x00cwd\x00.\x00pattern\x00x\x00",
		"no cwd":               magic + "\x00pattern\x00x\x00",
		"cwd twice":            magic + "\x00cwd\x00.\x00cwd\x00a\x00pattern\x00x\x00",
		"value without option": magic + "\x00cwd\x00.\x00val\x00x\x00pattern\x00x\x00",
		"value of a flag":      magic + "\x00cwd\x00.\x00opt\x00count\x00val\x00x\x00pattern\x00x\x00",
		"unknown field":        magic + "\x00cwd\x00.\x00exec\x00sh\x00pattern\x00x\x00",
		"odd fields":           magic + "\x00cwd\x00.\x00pattern\x00",
		"oversized":            magic + "\x00cwd\x00.\x00pattern\x00" + strings.Repeat("x", MaxRequest) + "\x00",
	} {
		if _, err := Decode([]byte(b), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("%s: %v, want %s", name, err, diag.SearchRequest)
		}
	}
}
