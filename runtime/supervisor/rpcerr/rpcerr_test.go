package rpcerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
)

// TestCodesDocumented holds three lists to one another: the Code constants
// declared in rpcerr.go, All, and the table under "### Error codes" in
// docs/supervisor.md (same codes, same order).
func TestCodesDocumented(t *testing.T) {
	fs := token.NewFileSet()
	f, err := parser.ParseFile(fs, "rpcerr.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []Code
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			for _, v := range s.(*ast.ValueSpec).Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					declared = append(declared, Code(s))
				}
			}
		}
	}
	if diff := cmp.Diff(declared, All); diff != "" {
		t.Errorf("All is not the declared codes in order (-declared +All):\n%s", diff)
	}
	if diff := cmp.Diff(All, Documented(t)); diff != "" {
		t.Errorf("docs/supervisor.md's error code table differs (-code +docs):\n%s", diff)
	}
}

// Documented is the code column of docs/supervisor.md's "### Error codes"
// table.
func Documented(t *testing.T) []Code {
	data, err := os.ReadFile("../../../docs/supervisor.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "\n### Error codes\n")
	if !ok {
		t.Fatal(`docs/supervisor.md has no "### Error codes" section`)
	}
	row := regexp.MustCompile("^\\| `([a-z-]+)` \\|")
	var docs []Code
	inTable := false
	for _, line := range strings.Split(after, "\n") {
		if strings.HasPrefix(line, "|") {
			inTable = true
			if m := row.FindStringSubmatch(line); m != nil {
				docs = append(docs, Code(m[1]))
			}
			continue
		}
		if inTable {
			break
		}
	}
	return docs
}

func TestErrorWire(t *testing.T) {
	e := &Error{Code: Refused, Message: "2 diagnostics", Diagnostics: []diag.Diagnostic{
		{Code: "PP-PATH-SYMLINK", Path: "workspace.cwd", Message: "a symlink"},
		{Code: "PP-DEST-LOOPBACK", Path: "model.baseURL", Message: "loopback"}}}
	data, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"code":"refused","message":"2 diagnostics","diagnostics":[{"code":"PP-PATH-SYMLINK","path":"workspace.cwd","message":"a symlink"},{"code":"PP-DEST-LOOPBACK","path":"model.baseURL","message":"loopback"}]}`
	if string(data) != want {
		t.Errorf("wire form:\n got %s\nwant %s", data, want)
	}
	var back Error
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*e, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if data, _ := json.Marshal(New(State, "gone")); string(data) != `{"code":"state","message":"gone"}` {
		t.Errorf("an error without diagnostics: %s", data)
	}
	wrapped := fmt.Errorf("call: %w", e)
	if !errors.Is(wrapped, &Error{Code: Refused}) || errors.Is(wrapped, &Error{Code: State}) {
		t.Error("errors.Is by code")
	}
	if !slices.Contains(All, e.Code) {
		t.Error("Refused not in All")
	}
}
