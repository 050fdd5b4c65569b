package schema

import (
	"strconv"
	"strings"

	"cuelang.org/go/cue/ast"
	"cuelang.org/go/cue/token"

	"paseo.dev/paseo-policy/diag"
)

// cueData refuses CUE input that is more than data: only fields with
// plain or quoted names, whose values are literals, structs and lists,
// each field given once per struct. Definitions, references, aliases,
// comprehensions, let clauses, interpolations, constraints, defaults,
// disjunctions, optional/required markers and attributes all make what a
// reviewer reads differ from what the compiler gets (or depend on the
// schema it is unified with), so facts and registry stay JSON in CUE
// syntax. Imports are refused before this runs.
func cueData(f *ast.File, l *diag.List) bool {
	w := dataWalk{l: l, ok: true}
	seen := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.Package, *ast.CommentGroup:
		case *ast.Field:
			w.field(d, "", seen, 0)
		case *ast.EmbedDecl:
			// A JSON document in a .cue file is one embedded struct.
			if st, isStruct := d.Expr.(*ast.StructLit); isStruct {
				w.fields(st, "", seen, 0)
				continue
			}
			w.refuse("", d.Expr)
		default:
			w.refuse("", d)
		}
	}
	return w.ok
}

type dataWalk struct {
	l  *diag.List
	ok bool
}

func (w *dataWalk) refuse(path string, n ast.Node) {
	w.ok = false
	w.l.Addf(diag.InputNotData, path, "%s is not data; CUE inputs hold only fields, literals, structs and lists", construct(n))
}

func (w *dataWalk) field(f *ast.Field, parent string, seen map[string]bool, depth int) {
	name, ok := dataLabel(f.Label)
	path := joinPath(parent, name)
	if !ok {
		w.refuse(parent, f.Label)
		return
	}
	switch {
	case f.Alias != nil:
		w.refuse(path, f.Alias)
		return
	case f.Constraint != token.ILLEGAL:
		w.ok = false
		w.l.Addf(diag.InputNotData, path, "an optional (?) or required (!) marker is a constraint, not data")
		return
	case len(f.Attrs) > 0:
		w.refuse(path, f.Attrs[0])
		return
	}
	if seen[name] {
		w.ok = false
		w.l.Addf(diag.InputDuplicateKey, path, "field appears twice in one struct; CUE would merge the two, so give each field once")
	}
	seen[name] = true
	w.value(f.Value, path, depth+1)
}

func (w *dataWalk) value(e ast.Expr, path string, depth int) {
	if depth > maxInputDepth {
		w.ok = false
		w.l.Addf(diag.InputSyntax, path, "nested deeper than %d levels", maxInputDepth)
		return
	}
	switch x := e.(type) {
	case *ast.BasicLit:
		return
	case *ast.UnaryExpr:
		if lit, isLit := x.X.(*ast.BasicLit); isLit && x.Op == token.SUB && (lit.Kind == token.INT || lit.Kind == token.FLOAT) {
			return // a negative number
		}
	case *ast.StructLit:
		w.fields(x, path, map[string]bool{}, depth)
		return
	case *ast.ListLit:
		for i, el := range x.Elts {
			w.value(el, path+"["+strconv.Itoa(i)+"]", depth+1)
		}
		return
	}
	w.refuse(path, e)
}

func (w *dataWalk) fields(st *ast.StructLit, path string, seen map[string]bool, depth int) {
	for _, el := range st.Elts {
		switch el := el.(type) {
		case *ast.Field:
			w.field(el, path, seen, depth)
		case *ast.CommentGroup:
		default:
			w.refuse(path, el)
		}
	}
}

// dataLabel returns a field's name when it is a plain identifier (not a
// definition #x or hidden _x) or a quoted string without interpolation.
func dataLabel(lb ast.Label) (string, bool) {
	switch x := lb.(type) {
	case *ast.Ident:
		if strings.HasPrefix(x.Name, "#") || strings.HasPrefix(x.Name, "_") {
			return "", false
		}
		return x.Name, true
	case *ast.BasicLit:
		if x.Kind != token.STRING {
			return "", false
		}
		name, _, err := ast.LabelName(x)
		return name, err == nil
	}
	return "", false
}

// construct names a refused node for the message; it never quotes input.
func construct(n ast.Node) string {
	switch x := n.(type) {
	case *ast.Ident:
		if strings.HasPrefix(x.Name, "#") {
			return "a definition"
		}
		if strings.HasPrefix(x.Name, "_") {
			return "a hidden field"
		}
		return "a reference"
	case *ast.Comprehension:
		return "a comprehension"
	case *ast.LetClause:
		return "a let clause"
	case *ast.Interpolation:
		return "an interpolation"
	case *ast.BinaryExpr:
		return "an expression (disjunction, unification or arithmetic)"
	case *ast.UnaryExpr:
		return "a constraint or default"
	case *ast.Attribute:
		return "an attribute"
	case *ast.EmbedDecl:
		return "an embedding"
	case *ast.Ellipsis:
		return "an open list or struct (...)"
	case *ast.PostfixAlias, *ast.Alias:
		return "an alias"
	case *ast.SelectorExpr, *ast.IndexExpr, *ast.SliceExpr:
		return "a reference"
	case *ast.CallExpr:
		return "a function call"
	case *ast.ListLit:
		return "a pattern label"
	case *ast.ParenExpr:
		return "a parenthesised expression"
	case *ast.BottomLit:
		return "bottom (_|_)"
	case *ast.BasicLit:
		return "a non-string label"
	}
	return "this construct"
}
