// Package nativesearch answers the sandbox's read-only searches (rg) from
// the host, in a jail of their own: a deliberate widening of the trusted
// boundary that an operator turns on per deployment (docs/spec.md, "Read-only
// searches answered outside gVisor").
//
// The sandbox sends a typed request (request.go): a closed list of rg's
// options, a pattern, paths beneath the workspace; never a command line.
// The server (server.go) checks it, re-encodes it as rg's argv and runs the
// image's own rg (the same binary and version the sandbox runs) in a jail
// (jail.go): new user, mount, network, pid and ipc namespaces, a root that
// holds only the image's /usr and the workspace read-only, Landlock,
// seccomp, rlimits, the agent's uid. Anything the list does not cover is
// answered "fallback", and the sandbox's client runs its own rg: slower,
// never different.
package nativesearch

import (
	"bytes"
	"fmt"
	"path"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/bundle"
)

// Request is one search: rg's options in the order given, the positional
// pattern (unless an option gave one) and the paths, relative to Cwd,
// which is relative to the workspace's top.
type Request struct {
	Cwd     string   // "." or a relative path beneath the workspace
	Options []Option // in argv order: rg lets later options override earlier ones
	Pattern *string  // the positional pattern; nil when -e gave them
	Paths   []string // relative to Cwd, or absolute beneath the workspace
}

// Option is one of rg's options from the closed list.
type Option struct {
	Name  string // a key of Flags or Valued
	Value string // for Valued options only
}

// Flags are rg's options without a value that a request may carry, and
// Valued those with a value, each with its value's check: both from the
// one closed list the compiled client forwards (bundle.SearchOptions).
var Flags, Valued = options()

func options() (map[string]bool, map[string]func(string) bool) {
	flags, valued := map[string]bool{}, map[string]func(string) bool{}
	for k, v := range bundle.SearchOptions {
		switch v {
		case bundle.SearchFlag:
			flags[k] = true
		case bundle.SearchText:
			valued[k] = anyText
		case bundle.SearchNumber:
			valued[k] = number
		case bundle.SearchType:
			valued[k] = typeName
		default:
			panic("nativesearch: bundle.SearchOptions has a value kind this server cannot check: " + string(v))
		}
	}
	return flags, valued
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
	MaxRequest = 64 << 10
	maxFields  = 256
	magic      = "paseo-search 1"
)

// ErrRequest refuses a request; it carries diag.SearchRequest.
type ErrRequest struct{ Msg string }

func (e *ErrRequest) Error() string { return string(diag.SearchRequest) + ": " + e.Msg }

// Code is the refusal's stable code.
func (e *ErrRequest) Code() diag.Code { return diag.SearchRequest }

func refuse(format string, a ...any) error { return &ErrRequest{Msg: fmt.Sprintf(format, a...)} }

// Decode reads the wire form: NUL-terminated fields, the magic first, then
// pairs of a key and its value (cwd, opt, val, pattern, path). It checks
// everything Check does; a request it returns is one the server may run.
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
	cwd := false
	for i := 1; i < len(f); i += 2 {
		k, v := f[i], f[i+1]
		switch k {
		case "cwd":
			if cwd {
				return Request{}, refuse("cwd twice")
			}
			r.Cwd, cwd = v, true
		case "opt":
			r.Options = append(r.Options, Option{Name: v})
		case "val":
			if len(r.Options) == 0 || r.Options[len(r.Options)-1].Value != "" || Valued[r.Options[len(r.Options)-1].Name] == nil {
				return Request{}, refuse("a value without its option")
			}
			r.Options[len(r.Options)-1].Value = v
		case "pattern":
			if r.Pattern != nil {
				return Request{}, refuse("pattern twice")
			}
			r.Pattern = &v
		case "path":
			r.Paths = append(r.Paths, v)
		default:
			return Request{}, refuse("unknown field %q", k)
		}
	}
	if !cwd {
		return Request{}, refuse("no cwd")
	}
	return r, r.Check(ws)
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
	field(magic, "cwd", r.Cwd)
	for _, o := range r.Options {
		field("opt", o.Name)
		if Valued[o.Name] != nil {
			field("val", o.Value)
		}
	}
	if r.Pattern != nil {
		field("pattern", *r.Pattern)
	}
	for _, p := range r.Paths {
		field("path", p)
	}
	return b.Bytes()
}

// Check refuses what is not on the list: an option the list lacks, a value
// its check refuses, a cwd or path that is not a canonical name beneath
// the workspace ws (the workspace's path in the sandbox, which is also
// where the jail mounts it). Links are the jail's business: it holds
// nothing a link could lead to but the workspace and the image.
func (r Request) Check(ws string) error {
	if !relName(r.Cwd) {
		return refuse("cwd %q is not a canonical relative name", r.Cwd)
	}
	pats := 0
	for _, o := range r.Options {
		if Flags[o.Name] {
			if o.Value != "" {
				return refuse("option %s takes no value", o.Name)
			}
			continue
		}
		ok := Valued[o.Name]
		if ok == nil {
			return refuse("option %q is not on the list", o.Name)
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
	if pats == 0 && !r.lists() {
		return refuse("no pattern")
	}
	if len(r.Paths) > 64 {
		return refuse("more than 64 paths")
	}
	for _, p := range r.Paths {
		if p == "-" {
			return refuse("path - (stdin) is not searched outside")
		}
		if strings.HasPrefix(p, "/") {
			if code, _ := pathform.Check(p); code != "" || !pathform.Beneath(ws, p) {
				return refuse("path %q is not beneath the workspace", p)
			}
			continue
		}
		if !relName(p) {
			return refuse("path %q is not a canonical relative name", p)
		}
	}
	return nil
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

// Argv is rg's arguments for r, re-encoded from the typed request: every
// option in its long form with its value joined by "=", so no value can be
// read as an option, then "--", the pattern and the paths.
func (r Request) Argv() []string {
	a := []string{"--no-config"}
	for _, o := range r.Options {
		if Valued[o.Name] != nil {
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
