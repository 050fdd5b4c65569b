// Package nativesearch answers the sandbox's read-only searches and name
// listings (rg, fd, find), and its cats of a batch of plain files, from
// the host, in a jail of their own: a
// deliberate widening of the trusted boundary that an operator turns on
// per deployment (docs/spec.md, "Read-only searches answered outside
// gVisor").
//
// The sandbox sends a typed request (request.go, fd.go, find.go): a closed
// list of the tool's options (for find, an expression tree of a closed
// list of tests and actions), a pattern, paths beneath the workspace;
// never a command line. The server (server.go) checks it, re-encodes it as
// the tool's argv and runs the image's own binary (the same binary and
// version the sandbox runs) in a jail (jail.go): new user, mount, network,
// pid and ipc namespaces, a root that holds only the image's /usr and the
// workspace read-only, Landlock, seccomp, rlimits, the agent's uid.
// Anything the list does not cover is answered "fallback", and the
// sandbox's client runs its own binary: slower, never different. A cat
// runs no program: the server copies its files into the spool from a
// thread with the agent's file-system credentials (catread.go), up to the
// first file the sandbox's own cat must answer.
package nativesearch

import (
	"bytes"
	"fmt"
	"io"
	"path"
	"slices"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/bundle"
)

// Tool is the program a request is for.
type Tool string

// The tools answered outside. A request without a tool is rg's (the
// wire form before fd and find).
const (
	Rg   Tool = "rg"
	Fd   Tool = "fd"
	Find Tool = "find"
	// Cat reads files: its answer is their bytes, copied by the server
	// with the agent's credentials (catread.go), no program run.
	Cat Tool = "cat"
)

// toolSpec is how the jail runs a tool: the image's binary (a path in the
// image and the jail, fixed here, never from a request) and whether it
// takes rg's and fd's --threads. cat runs no program: the server copies
// its files (catread.go).
type toolSpec struct {
	bin     string
	threads bool
}

var toolSpecs = map[Tool]toolSpec{
	Rg:   {bin: "/usr/bin/rg", threads: true},
	Fd:   {bin: "/usr/lib/cargo/bin/fd", threads: true}, // /usr/local/bin/fd -> /usr/bin/fdfind -> this
	Find: {bin: "/usr/bin/find"},
}

// answered reports whether t is a tool answered outside: one a jail runs,
// or cat.
func answered(t Tool) bool {
	_, ok := toolSpecs[t]
	return ok || t == Cat
}

// Request is one search or listing: the tool's options in the order
// given, the positional pattern (unless an option gave one) and the
// paths, relative to Cwd, which is relative to the workspace's top; for
// find, the starting points (Paths) and the expression (Expr).
type Request struct {
	Tool    Tool     // "" is rg
	Cwd     string   // "." or a relative path beneath the workspace
	Options []Option // in argv order: rg and fd let later options override earlier ones
	Pattern *string  // the positional pattern; nil when -e gave them (rg) or none was given (fd)
	Paths   []string // relative to Cwd, or absolute beneath the workspace
	Expr    *Expr    // find's expression; nil for none (find then prints every name)
	Lang    string   // find's locale (LC_ALL in the jail): "" or one of Langs
}

// Option is one of the tool's options from its closed list.
type Option struct {
	Name  string // a key of the tool's OptionList Flags or Valued
	Value string // for Valued options only
}

// OptionList is a tool's closed list of options, by long name.
type OptionList struct {
	Flags  map[string]bool
	Valued map[string]func(string) bool
	// Paths are the Valued options whose value names a file or directory
	// (fd's --search-path): checked as the request's paths are.
	Paths map[string]bool
}

// Lists are rg's and fd's option lists (find's is Primaries), each from
// the one closed list the compiled client forwards (bundle.SearchOptions,
// bundle.SearchFdOptions).
var Lists = map[Tool]OptionList{
	Rg: {Flags: Flags, Valued: Valued},
	Fd: options(bundle.SearchFdOptions),
	// cat takes no option outside: `cat [--] FILE...` only.
	Cat: {},
}

// Flags are rg's options without a value that a request may carry, and
// Valued those with a value, each with its value's check: both from the
// one closed list the compiled client forwards (bundle.SearchOptions).
var Flags, Valued = rgOptions()

func rgOptions() (map[string]bool, map[string]func(string) bool) {
	l := options(bundle.SearchOptions)
	if len(l.Paths) > 0 {
		panic("nativesearch: bundle.SearchOptions names a path option, which rg's request does not check")
	}
	return l.Flags, l.Valued
}

// options is a list from policy/bundle with each value's check by its
// kind.
func options(list map[string]bundle.SearchValue) OptionList {
	l := OptionList{Flags: map[string]bool{}, Valued: map[string]func(string) bool{}, Paths: map[string]bool{}}
	for k, v := range list {
		if v == bundle.SearchFlag {
			l.Flags[k] = true
			continue
		}
		l.Valued[k] = check(v)
		if v == bundle.SearchPath {
			l.Paths[k] = true
		}
	}
	return l
}

// check is the check for a value of kind v; it panics on a kind it does
// not know, so a list this server cannot check never serves.
func check(v bundle.SearchValue) func(string) bool {
	switch v {
	case bundle.SearchText, bundle.SearchPath:
		return anyText
	case bundle.SearchNumber:
		return number
	case bundle.SearchType:
		return typeName
	case bundle.SearchFdType:
		return fdType
	case bundle.SearchFdSize:
		return fdSize
	case bundle.SearchTime:
		return timeSpec
	case bundle.SearchFindType:
		return findType
	case bundle.SearchFindSize:
		return findSize
	case bundle.SearchSigned:
		return signed
	}
	panic("nativesearch: policy/bundle has a value kind this server cannot check: " + string(v))
}

func anyText(s string) bool { return len(s) <= 4096 && !strings.ContainsRune(s, 0) }

func number(s string) bool {
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && strconv.FormatUint(n, 10) == s
}

func typeName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '+') {
			return false
		}
	}
	return true
}

// Bounds on a request.
const (
	MaxRequest = 256 << 10
	// maxPaths bounds a search's paths, maxCatFiles a cat's files (xargs
	// gives cat up to about 128 KiB of names a call).
	maxPaths    = 64
	maxCatFiles = 8192
	maxFields   = 2*maxCatFiles + 16
	magic       = "paseo-search 1"
)

// ErrRequest refuses a request; it carries diag.SearchRequest.
type ErrRequest struct{ Msg string }

func (e *ErrRequest) Error() string { return string(diag.SearchRequest) + ": " + e.Msg }

// Code is the refusal's stable code.
func (e *ErrRequest) Code() diag.Code { return diag.SearchRequest }

func refuse(format string, a ...any) error { return &ErrRequest{Msg: fmt.Sprintf(format, a...)} }

// Decode reads the wire form: NUL-terminated fields, the magic first, then
// pairs of a key and its value (tool, cwd, opt, val, pattern, path, and
// find's expr tokens and lang). It checks everything Check does; a request
// it returns is one the server may run.
func Decode(b []byte, ws string) (Request, error) {
	if len(b) > MaxRequest {
		return Request{}, refuse("request over %d bytes", MaxRequest)
	}
	if len(b) == 0 || b[len(b)-1] != 0 {
		return Request{}, refuse("request does not end with NUL")
	}
	f := strings.Split(string(b[:len(b)-1]), "\x00")
	if len(f) > maxFields || len(f)%2 != 1 || f[0] != magic {
		return Request{}, refuse("malformed request")
	}
	var r Request
	var expr []string
	seen := map[string]bool{}
	for i := 1; i < len(f); i += 2 {
		k, v := f[i], f[i+1]
		switch k {
		case "tool", "cwd", "pattern", "lang":
			if seen[k] {
				return Request{}, refuse("%s twice", k)
			}
			seen[k] = true
		}
		switch k {
		case "tool":
			if i != 1 {
				return Request{}, refuse("the tool after other fields")
			}
			if !answered(Tool(v)) {
				return Request{}, refuse("tool %q is not answered outside", v)
			}
			r.Tool = Tool(v)
		case "cwd":
			r.Cwd = v
		case "opt":
			r.Options = append(r.Options, Option{Name: v})
		case "val":
			if len(r.Options) == 0 || r.Options[len(r.Options)-1].Value != "" || r.list().Valued[r.Options[len(r.Options)-1].Name] == nil {
				return Request{}, refuse("a value without its option")
			}
			r.Options[len(r.Options)-1].Value = v
		case "pattern":
			r.Pattern = &v
		case "path":
			r.Paths = append(r.Paths, v)
		case "expr":
			expr = append(expr, v)
		case "lang":
			r.Lang = v
		default:
			return Request{}, refuse("unknown field %q", k)
		}
	}
	if !seen["cwd"] {
		return Request{}, refuse("no cwd")
	}
	if len(expr) > 0 {
		if r.tool() != Find {
			return Request{}, refuse("an expression is find's only")
		}
		e, err := ParseFind(expr)
		if err != nil {
			return Request{}, err
		}
		r.Expr = e
	}
	return r, r.Check(ws)
}

// readWire reads a request: up to the client's half-close (io.EOF), or
// up to an empty key (a NUL where a key begins), which a client that
// keeps its side open sends last (cat's: it closes when it is done
// reading the spool). open reports the latter; the request returned
// never holds the empty key. Past MaxRequest bytes it stops, and Decode
// refuses what it read.
func readWire(r io.Reader) (req []byte, open bool, err error) {
	buf := make([]byte, 0, 4<<10)
	tokens, start := 0, 0 // the fields complete so far; where the current one begins
	for len(buf) <= MaxRequest {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, rerr := r.Read(buf[len(buf):min(cap(buf), MaxRequest+1)])
		scan := len(buf)
		buf = buf[:len(buf)+n]
		for i := scan; i < len(buf); i++ {
			if buf[i] != 0 {
				continue
			}
			if tokens%2 == 1 && i == start {
				if i+1 != len(buf) {
					return nil, false, refuse("bytes after the request's end")
				}
				return buf[:start], true, nil
			}
			tokens++
			start = i + 1
		}
		if rerr == io.EOF {
			return buf, false, nil
		}
		if rerr != nil {
			return nil, false, rerr
		}
	}
	return buf, false, nil
}

// Encode is the wire form of r (what the sandbox's client sends).
func (r Request) Encode() []byte {
	var b bytes.Buffer
	field := func(s ...string) {
		for _, x := range s {
			b.WriteString(x)
			b.WriteByte(0)
		}
	}
	field(magic)
	if r.Tool != "" {
		field("tool", string(r.Tool))
	}
	field("cwd", r.Cwd)
	for _, o := range r.Options {
		field("opt", o.Name)
		if r.list().Valued[o.Name] != nil {
			field("val", o.Value)
		}
	}
	if r.Pattern != nil {
		field("pattern", *r.Pattern)
	}
	for _, p := range r.Paths {
		field("path", p)
	}
	for _, t := range r.Expr.Tokens() {
		field("expr", t)
	}
	if r.Lang != "" {
		field("lang", r.Lang)
	}
	return b.Bytes()
}

func (r Request) tool() Tool {
	if r.Tool == "" {
		return Rg
	}
	return r.Tool
}

func (r Request) list() OptionList { return Lists[r.tool()] }

// Check refuses what is not on the list: a tool the server does not run,
// an option the tool's list lacks, a value its check refuses, a cwd or
// path that is not a canonical name beneath the workspace ws (the
// workspace's path in the sandbox, which is also where the jail mounts
// it). Links are the jail's business: it holds nothing a link could lead
// to but the workspace and the image.
func (r Request) Check(ws string) error {
	if !answered(r.tool()) {
		return refuse("tool %q is not answered outside", r.Tool)
	}
	if !relName(r.Cwd) {
		return refuse("cwd %q is not a canonical relative name", r.Cwd)
	}
	if r.tool() == Find {
		if err := r.checkFind(); err != nil {
			return err
		}
	} else if r.Expr != nil || r.Lang != "" {
		return refuse("an expression and a locale are find's only")
	}
	if r.tool() == Cat {
		return r.checkCat(ws)
	}
	pats := 0
	l := r.list()
	for _, o := range r.Options {
		if l.Flags[o.Name] {
			if o.Value != "" {
				return refuse("option %s takes no value", o.Name)
			}
			continue
		}
		ok := l.Valued[o.Name]
		if ok == nil {
			return refuse("option %q is not on %s's list", o.Name, r.tool())
		}
		if !ok(o.Value) {
			return refuse("option %s: value %q refused", o.Name, o.Value)
		}
		if o.Name == "regexp" {
			pats++
		}
	}
	if r.Pattern != nil {
		pats++
		if !anyText(*r.Pattern) {
			return refuse("pattern refused")
		}
	}
	switch r.tool() {
	case Rg:
		if pats == 0 && !r.lists() {
			return refuse("no pattern")
		}
	case Fd:
		// fd reads its first positional as the pattern: paths need one.
		if r.Pattern == nil && len(r.Paths) > 0 {
			return refuse("fd paths without a pattern")
		}
	}
	if len(r.Paths) > maxPaths {
		return refuse("more than %d paths", maxPaths)
	}
	for _, p := range r.names() {
		if err := checkPath(p, ws); err != nil {
			return err
		}
	}
	return nil
}

// checkCat is cat's rule: files only (no option, pattern or expression),
// one to maxCatFiles of them, each a path by checkPath's rule without a
// trailing "/" (which cat reads as "a directory": the sandbox's cat says
// so).
func (r Request) checkCat(ws string) error {
	if len(r.Options) > 0 || r.Pattern != nil || r.Expr != nil || r.Lang != "" {
		return refuse("cat takes files only")
	}
	if len(r.Paths) == 0 || len(r.Paths) > maxCatFiles {
		return refuse("cat of %d files: 1 to %d are read outside", len(r.Paths), maxCatFiles)
	}
	for _, p := range r.Paths {
		if strings.HasSuffix(p, "/") {
			return refuse("cat of %q: a name ending in /", p)
		}
		if err := checkPath(p, ws); err != nil {
			return err
		}
	}
	return nil
}

// checkPath is a path's rule: a canonical name beneath the cwd, or
// absolute beneath the workspace; not "-" (stdin for rg).
func checkPath(p, ws string) error {
	if p == "-" {
		return refuse("path - (stdin) is not searched outside")
	}
	if strings.HasPrefix(p, "/") {
		if code, _ := pathform.Check(p); code != "" || !pathform.Beneath(ws, p) {
			return refuse("path %q is not beneath the workspace", p)
		}
		return nil
	}
	if !relName(p) {
		return refuse("path %q is not a canonical relative name", p)
	}
	return nil
}

// names are the paths r makes the tool open or stat by name: its paths
// and the values of path options (fd --search-path, find -newer).
func (r Request) names() []string {
	n := slices.Clone(r.Paths)
	for _, o := range r.Options {
		if r.list().Paths[o.Name] {
			n = append(n, o.Value)
		}
	}
	return append(n, r.Expr.names()...)
}

// lists reports whether r lists files (--files) rather than searching.
func (r Request) lists() bool {
	for _, o := range r.Options {
		if o.Name == "files" {
			return true
		}
	}
	return false
}

// Argv is the tool's arguments for r, re-encoded from the typed request.
// rg and fd: every option in its long form with its value joined by "=",
// so no value can be read as an option, then "--", the pattern and the
// paths (rg's --no-config first). find: the starting points, then the
// expression's tokens from its tree, each value in its test's argument
// slot.
func (r Request) Argv() []string {
	var a []string
	switch r.tool() {
	case Find:
		return append(slices.Clone(r.Paths), r.Expr.Tokens()...)
	case Cat:
		return append([]string{"--"}, r.Paths...)
	case Rg:
		a = []string{"--no-config"}
	}
	for _, o := range r.Options {
		if r.list().Valued[o.Name] != nil {
			a = append(a, "--"+o.Name+"="+o.Value)
		} else {
			a = append(a, "--"+o.Name)
		}
	}
	a = append(a, "--")
	if r.Pattern != nil {
		a = append(a, *r.Pattern)
	}
	return append(a, r.Paths...)
}

// relName reports whether p is "." or a canonical relative name without
// ".." or control characters (pathform's rules), allowing the leading
// "./" and the trailing "/" people type (rg prints names as given).
func relName(p string) bool {
	for strings.HasPrefix(p, "./") {
		p = p[2:]
	}
	if q := strings.TrimSuffix(p, "/"); q != "" {
		p = q
	}
	if p == "." {
		return true
	}
	if p == "" || strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return false
	}
	code, _ := pathform.Check("/" + p)
	return code == ""
}
