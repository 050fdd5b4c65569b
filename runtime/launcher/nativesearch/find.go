package nativesearch

import (
	"strings"

	"paseo.dev/paseo-policy/policy/bundle"
)

// find's closed list is bundle.SearchFindPrimaries (what is on it and why
// the rest is not is written there, beside the client, which splits
// find's words by it); its locales are bundle.SearchFindLangs. Here is
// find's grammar: the request carries the expression as a tree (Expr),
// parsed from find's own tokens, and the server re-encodes it token for
// token: a test's value sits in its argument slot, where find reads a
// value whatever it looks like. The client does not parse the grammar
// (it only splits the words by which primaries take a value), so the
// grammar has one home, the server's, and a word the client splits
// differently is refused here (PP-SEARCH-REQUEST) and run in the sandbox.

// Primary is one of find's tests, actions or options on the list.
type Primary struct {
	Arg  func(string) bool // the value's check; nil for none
	Path bool              // the value names a file (checked as a path)
}

// Primaries are find's tests, actions and positional options a request
// may carry: bundle.SearchFindPrimaries with each value's check.
var Primaries = primaries()

func primaries() map[string]Primary {
	m := map[string]Primary{}
	for k, v := range bundle.SearchFindPrimaries {
		p := Primary{Path: v == bundle.SearchPath}
		if v != bundle.SearchFlag {
			p.Arg = check(v)
		}
		m[k] = p
	}
	return m
}

// Langs are the locales find may run with in the jail (LC_ALL):
// bundle.SearchFindLangs.
var Langs = langs()

func langs() map[string]bool {
	m := map[string]bool{}
	for _, l := range bundle.SearchFindLangs {
		m[l] = true
	}
	return m
}

// Expr is a node of find's expression: a primary with its value, or an
// operator over nodes. Spell keeps the operator as given ("!" or "-not";
// "-a", "-and" or "" for the implicit and; "-o" or "-or"), so the tokens
// find reads are the ones the agent wrote.
type Expr struct {
	Op    ExprOp
	Spell string
	Name  string  // OpPrimary: a key of Primaries
	Arg   *string // OpPrimary: its value, when it takes one
	X, Y  *Expr   // OpNot, OpParen: X; OpAnd, OpOr: X and Y
}

// ExprOp is an Expr's kind.
type ExprOp int

// The kinds of node.
const (
	OpPrimary ExprOp = iota
	OpNot
	OpAnd
	OpOr
	OpParen
)

const maxExprDepth = 64

// ParseFind parses find's expression tokens by find's grammar (or, then
// and, then not and parentheses), refusing a primary off the list, a
// value its check refuses, a missing value, "," and unbalanced
// parentheses.
func ParseFind(tokens []string) (*Expr, error) {
	p := &findParser{t: tokens}
	if len(tokens) == 0 {
		return nil, nil
	}
	e, err := p.or(0)
	if err != nil {
		return nil, err
	}
	if p.i != len(p.t) {
		return nil, refuse("find: %q unexpected", p.t[p.i])
	}
	return e, nil
}

type findParser struct {
	t []string
	i int
}

func (p *findParser) peek() string {
	if p.i < len(p.t) {
		return p.t[p.i]
	}
	return ""
}

func (p *findParser) or(d int) (*Expr, error) {
	x, err := p.and(d)
	if err != nil {
		return nil, err
	}
	for s := p.peek(); p.i < len(p.t) && (s == "-o" || s == "-or"); s = p.peek() {
		p.i++
		y, err := p.and(d)
		if err != nil {
			return nil, err
		}
		x = &Expr{Op: OpOr, Spell: s, X: x, Y: y}
	}
	return x, nil
}

func (p *findParser) and(d int) (*Expr, error) {
	x, err := p.unary(d)
	if err != nil {
		return nil, err
	}
	for p.i < len(p.t) {
		s := p.peek()
		if s == "-o" || s == "-or" || s == ")" {
			break
		}
		spell := ""
		if s == "-a" || s == "-and" {
			spell = s
			p.i++
		}
		y, err := p.unary(d)
		if err != nil {
			return nil, err
		}
		x = &Expr{Op: OpAnd, Spell: spell, X: x, Y: y}
	}
	return x, nil
}

func (p *findParser) unary(d int) (*Expr, error) {
	if d > maxExprDepth {
		return nil, refuse("find: expression nested over %d deep", maxExprDepth)
	}
	if p.i >= len(p.t) {
		return nil, refuse("find: expression ends where a test was expected")
	}
	s := p.t[p.i]
	p.i++
	switch s {
	case "!", "-not":
		x, err := p.unary(d + 1)
		if err != nil {
			return nil, err
		}
		return &Expr{Op: OpNot, Spell: s, X: x}, nil
	case "(":
		x, err := p.or(d + 1)
		if err != nil {
			return nil, err
		}
		if p.peek() != ")" || p.i >= len(p.t) {
			return nil, refuse("find: ( without )")
		}
		p.i++
		return &Expr{Op: OpParen, X: x}, nil
	}
	pr, ok := Primaries[s]
	if !ok {
		return nil, refuse("find: %q is not on the list", s)
	}
	e := &Expr{Op: OpPrimary, Name: s}
	if pr.Arg != nil {
		if p.i >= len(p.t) {
			return nil, refuse("find: %s without its value", s)
		}
		v := p.t[p.i]
		p.i++
		if !pr.Arg(v) {
			return nil, refuse("find: %s: value %q refused", s, v)
		}
		e.Arg = &v
	}
	return e, nil
}

// Tokens are e's tokens as find reads them: the inverse of ParseFind.
func (e *Expr) Tokens() []string {
	if e == nil {
		return nil
	}
	switch e.Op {
	case OpPrimary:
		if e.Arg != nil {
			return []string{e.Name, *e.Arg}
		}
		return []string{e.Name}
	case OpNot:
		return append([]string{e.Spell}, e.X.Tokens()...)
	case OpParen:
		return append(append([]string{"("}, e.X.Tokens()...), ")")
	default: // OpAnd, OpOr
		t := e.X.Tokens()
		if e.Spell != "" {
			t = append(t, e.Spell)
		}
		return append(t, e.Y.Tokens()...)
	}
}

// check refuses a tree ParseFind would not have made (a request built in
// Go rather than decoded).
func (e *Expr) check(d int) error {
	if e == nil {
		return refuse("find: an empty node")
	}
	if d > maxExprDepth {
		return refuse("find: expression nested over %d deep", maxExprDepth)
	}
	switch e.Op {
	case OpPrimary:
		pr, ok := Primaries[e.Name]
		if !ok {
			return refuse("find: %q is not on the list", e.Name)
		}
		if (pr.Arg == nil) != (e.Arg == nil) || pr.Arg != nil && !pr.Arg(*e.Arg) {
			return refuse("find: %s: value refused", e.Name)
		}
		return nil
	case OpNot:
		if e.Spell != "!" && e.Spell != "-not" {
			return refuse("find: not spelled %q", e.Spell)
		}
		return e.X.check(d + 1)
	case OpParen:
		return e.X.check(d + 1)
	case OpAnd, OpOr:
		ok := e.Op == OpAnd && (e.Spell == "" || e.Spell == "-a" || e.Spell == "-and") ||
			e.Op == OpOr && (e.Spell == "-o" || e.Spell == "-or")
		if !ok {
			return refuse("find: operator spelled %q", e.Spell)
		}
		// As ParseFind counts: nesting is ! and (, not a chain's length.
		if err := e.X.check(d); err != nil {
			return err
		}
		return e.Y.check(d)
	}
	return refuse("find: unknown node")
}

// names are the files e's primaries name (-newer's).
func (e *Expr) names() []string {
	if e == nil {
		return nil
	}
	if e.Op == OpPrimary {
		if Primaries[e.Name].Path && e.Arg != nil {
			return []string{*e.Arg}
		}
		return nil
	}
	return append(e.X.names(), e.Y.names()...)
}

// checkFind is find's part of Check: no options or pattern, starting
// points find reads as such (not an expression's token), a tree on the
// list, a locale on the list.
func (r Request) checkFind() error {
	if len(r.Options) > 0 || r.Pattern != nil {
		return refuse("find takes no options or pattern here")
	}
	for _, p := range r.Paths {
		if strings.HasPrefix(p, "-") || p == "(" || p == ")" || p == "!" || p == "," {
			return refuse("find: starting point %q reads as an expression", p)
		}
	}
	if r.Expr != nil {
		if err := r.Expr.check(0); err != nil {
			return err
		}
	}
	if r.Lang != "" && !Langs[r.Lang] {
		return refuse("find: locale %q is not on the list", r.Lang)
	}
	return nil
}
