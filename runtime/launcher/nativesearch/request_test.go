package nativesearch

import (
	"bytes"
	"io"
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
		"the launcher's git":   magic + "\x00tool\x00git\x00cwd\x00.\x00pattern\x00x\x00",
		"odd fields":           magic + "\x00cwd\x00.\x00pattern\x00",
		"oversized":            magic + "\x00cwd\x00.\x00pattern\x00" + strings.Repeat("x", MaxRequest) + "\x00",
	} {
		if _, err := Decode([]byte(b), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("%s: %v, want %s", name, err, diag.SearchRequest)
		}
	}
}

// fd's and find's requests round-trip too, and re-encode as their argv:
// fd's options long with "=value" then "--"; find's starting points then
// the expression's tokens as given, each value in its test's slot (a
// value that looks like an action stays a value).
func TestRequestRoundTripFdFind(t *testing.T) {
	for _, tc := range []struct {
		r    Request
		want []string
	}{
		{Request{Tool: Fd, Cwd: ".", Pattern: pat(wsDest + "/src/**/*.go"), Paths: []string{wsDest},
			Options: []Option{{Name: "color=never"}, {Name: "hidden"}, {Name: "glob"}, {Name: "max-results", Value: "1001"}, {Name: "full-path"}, {Name: "ignore-case"}}},
			[]string{"--color=never", "--hidden", "--glob", "--max-results=1001", "--full-path", "--ignore-case", "--", wsDest + "/src/**/*.go", wsDest}},
		{Request{Tool: Fd, Cwd: "sub", Options: []Option{{Name: "extension", Value: "-x"}, {Name: "type", Value: "f"}, {Name: "search-path", Value: "deep"}}},
			[]string{"--extension=-x", "--type=f", "--search-path=deep", "--"}},
		{Request{Tool: Find, Cwd: ".", Paths: []string{".", "sub"}, Lang: "C.UTF-8",
			Expr: mustFind(t, "(", "-name", "-delete", "-o", "!", "-iname", "*.GO", ")", "-a", "-type", "f,d", "-not", "-empty", "-print0")},
			[]string{".", "sub", "(", "-name", "-delete", "-o", "!", "-iname", "*.GO", ")", "-a", "-type", "f,d", "-not", "-empty", "-print0"}},
		{Request{Tool: Find, Cwd: ".", Expr: mustFind(t, "-maxdepth", "2", "-path", "./.git", "-prune", "-or", "-newer", "a.go", "-size", "+2k", "-print")},
			[]string{"-maxdepth", "2", "-path", "./.git", "-prune", "-or", "-newer", "a.go", "-size", "+2k", "-print"}},
		{Request{Tool: Find, Cwd: "."}, nil},
	} {
		got, err := Decode(tc.r.Encode(), wsDest)
		if err != nil {
			t.Errorf("%v: %v", tc.want, err)
			continue
		}
		if a := got.Argv(); !slices.Equal(a, tc.want) {
			t.Errorf("argv %q, want %q", a, tc.want)
		}
		if got.Lang != tc.r.Lang || got.tool() != tc.r.Tool {
			t.Errorf("%v: tool %q lang %q", tc.want, got.Tool, got.Lang)
		}
	}
}

func mustFind(t *testing.T, tokens ...string) *Expr {
	t.Helper()
	e, err := ParseFind(tokens)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// ParseFind reads find's grammar: -o below the implicit and, ! and ( )
// binding tightest, and Tokens gives back the tokens it was given.
func TestParseFind(t *testing.T) {
	e := mustFind(t, "-name", "a", "-type", "f", "-o", "!", "-name", "b")
	if e.Op != OpOr || e.X.Op != OpAnd || e.X.Spell != "" || e.Y.Op != OpNot || *e.Y.X.Arg != "b" {
		t.Errorf("tree %+v", e)
	}
	for _, toks := range [][]string{
		{"-name", "a"}, {"(", "(", "-true", ")", ")"}, {"!", "!", "-false"}, {"-name", "(", "-o", "-name", ")"},
		{"-path", "./x", "-prune", "-o", "-type", "f", "-print"}, {"-not", "-empty", "-and", "-mmin", "-5"},
	} {
		if got := mustFind(t, toks...).Tokens(); !slices.Equal(got, toks) {
			t.Errorf("tokens %q, want %q", got, toks)
		}
	}
}

// fd's and find's options off the list, and their shapes find would read
// otherwise, are refused with PP-SEARCH-REQUEST.
func TestRequestRefusalsFdFind(t *testing.T) {
	fd := func(opts ...Option) Request { return Request{Tool: Fd, Cwd: ".", Options: opts} }
	for name, r := range map[string]Request{
		"fd -x":              fd(Option{Name: "exec", Value: "sh"}),
		"fd -X":              fd(Option{Name: "exec-batch", Value: "sh"}),
		"fd -L":              fd(Option{Name: "follow"}),
		"fd -l":              fd(Option{Name: "list-details"}),
		"fd --ignore-file":   fd(Option{Name: "ignore-file", Value: "/etc/x"}),
		"fd --owner":         fd(Option{Name: "owner", Value: "root"}),
		"fd --base-dir":      fd(Option{Name: "base-directory", Value: "sub"}),
		"fd --threads":       fd(Option{Name: "threads", Value: "64"}),
		"fd one-fs":          fd(Option{Name: "one-file-system"}),
		"fd --color=always":  fd(Option{Name: "color=always"}),
		"fd type x;y":        fd(Option{Name: "type", Value: "f;x"}),
		"fd size 1e9":        fd(Option{Name: "size", Value: "1e9"}),
		"fd search-path out": fd(Option{Name: "search-path", Value: "/etc"}),
		"fd search-path ..":  fd(Option{Name: "search-path", Value: "../x"}),
		"fd paths, no pat":   {Tool: Fd, Cwd: ".", Paths: []string{"sub"}},
		"fd path outside":    {Tool: Fd, Cwd: ".", Pattern: pat("x"), Paths: []string{"/etc"}},
		"find option":        {Tool: Find, Cwd: ".", Options: []Option{{Name: "hidden"}}},
		"find pattern":       {Tool: Find, Cwd: ".", Pattern: pat("x")},
		"find path -x":       {Tool: Find, Cwd: ".", Paths: []string{"-exec"}},
		"find path (":        {Tool: Find, Cwd: ".", Paths: []string{"("}},
		"find path outside":  {Tool: Find, Cwd: ".", Paths: []string{"/"}},
		"find locale":        {Tool: Find, Cwd: ".", Lang: "de_DE.UTF-8"},
		"rg locale":          {Cwd: ".", Pattern: pat("x"), Lang: "C"},
		"rg expression":      {Cwd: ".", Pattern: pat("x"), Expr: &Expr{Op: OpPrimary, Name: "-true"}},
		"find -exec tree":    {Tool: Find, Cwd: ".", Expr: &Expr{Op: OpPrimary, Name: "-exec", Arg: pat("sh")}},
		"find -and spelled":  {Tool: Find, Cwd: ".", Expr: &Expr{Op: OpAnd, Spell: "-exec", X: &Expr{Name: "-true"}, Y: &Expr{Name: "-true"}}},
		"find -newer out":    {Tool: Find, Cwd: ".", Expr: &Expr{Op: OpPrimary, Name: "-newer", Arg: pat("/etc/passwd")}},
		"other tool":         {Tool: "sh", Cwd: "."},
	} {
		if _, err := Decode(r.Encode(), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("%s: %v, want %s", name, err, diag.SearchRequest)
		}
	}
	for _, toks := range [][]string{
		{"-exec", "rm", "{}", ";"}, {"-execdir", "sh", ";"}, {"-ok", "rm", ";"}, {"-okdir", "rm", ";"}, {"-delete"},
		{"-fprint", "/tmp/x"}, {"-fprint0", "/tmp/x"}, {"-fprintf", "/tmp/x", "%p"}, {"-fls", "/tmp/x"},
		{"-printf", "%u"}, {"-ls"}, {"-L"}, {"-H"}, {"-follow"}, {"-xtype", "f"}, {"-files0-from", "x"},
		{"-regex", ".*"}, {"-user", "root"}, {"-uid", "0"}, {"-inum", "1"}, {"-xdev"},
		{"-name", "a", ",", "-name", "b"}, {"(", "-name", "a"}, {"-name", "a", ")"}, {"-name"}, {"!"},
		{"-o", "-name", "a"}, {"-type", "x"}, {"-maxdepth", "-1"}, {"-size", "1T"}, {"-mmin", "1.5"},
		{"-name", "a", "-exec", "sh", ";"}, {"-name", "a\x00b"},
	} {
		r := Request{Tool: Find, Cwd: "."}
		enc := string(r.Encode())
		for _, tok := range toks {
			enc += "expr\x00" + tok + "\x00"
		}
		if _, err := Decode([]byte(enc), wsDest); !isCode(err, diag.SearchRequest) {
			t.Errorf("find %q: %v, want %s", toks, err, diag.SearchRequest)
		}
	}
	deep := make([]string, 0, 2*maxExprDepth+4)
	for i := 0; i <= maxExprDepth+1; i++ {
		deep = append(deep, "!")
	}
	if _, err := ParseFind(append(deep, "-true")); !isCode(err, diag.SearchRequest) {
		t.Errorf("nested past %d: %v", maxExprDepth, err)
	}
	if _, err := Decode([]byte(magic+"\x00cwd\x00.\x00tool\x00fd\x00"), wsDest); !isCode(err, diag.SearchRequest) {
		t.Errorf("the tool after the cwd: %v", err)
	}
}

// TestReadWire: a request ends at the client's half-close, or at an empty
// key with the client's side still open (then open is reported and the
// empty key is not part of it); an empty value is not an empty key;
// bytes after the empty key are refused, and a request past MaxRequest is
// cut for Decode to refuse.
func TestReadWire(t *testing.T) {
	req := Request{Tool: Cat, Cwd: ".", Paths: []string{"a", "b"}}.Encode()
	withEmpty := []byte(magic + "\x00cwd\x00\x00tool\x00cat\x00")
	for _, tc := range []struct {
		name string
		in   io.Reader
		want []byte
		open bool
		err  bool
	}{
		{"half-closed", bytes.NewReader(req), req, false, false},
		{"an empty key, the side open", &stalls{data: append(append([]byte{}, req...), 0)}, req, true, false},
		{"in pieces", &stalls{data: append(append([]byte{}, req...), 0), piece: 3}, req, true, false},
		{"an empty value", bytes.NewReader(withEmpty), withEmpty, false, false},
		{"bytes after the end", bytes.NewReader(append(append(append([]byte{}, req...), 0), 'x')), nil, false, true},
		{"too long", bytes.NewReader(bytes.Repeat([]byte("x"), MaxRequest+10)), nil, false, false},
	} {
		got, open, err := readWire(tc.in)
		if tc.name == "too long" {
			if len(got) != MaxRequest+1 || err != nil {
				t.Errorf("%s: %d bytes, %v; want MaxRequest+1, for Decode to refuse", tc.name, len(got), err)
			}
			continue
		}
		if (err != nil) != tc.err || !bytes.Equal(got, tc.want) || open != tc.open {
			t.Errorf("%s: %q open %v, %v", tc.name, got, open, err)
		}
	}
}

// stalls gives its data in pieces, then io.EOF: a reader that does not
// stop at the empty key reaches it and reports the request not open.
type stalls struct {
	data  []byte
	piece int
}

func (s *stalls) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := len(s.data)
	if s.piece > 0 {
		n = min(n, s.piece)
	}
	n = copy(p, s.data[:n])
	s.data = s.data[n:]
	return n, nil
}
