// Package diag holds the typed diagnostics every stage of paseo-policy reports.
//
// A diagnostic names a stable code (tests and callers match on it, never on
// the message) and the fact path that caused it. Messages never carry input
// values that could be secrets; they describe what is wrong and what to do.
package diag

import (
	"fmt"
	"sort"
	"strings"
)

// Code is a stable identifier such as PP-PATH-SYMLINK.
type Code string

// Error makes a code a target for errors.Is: an error type that carries a
// code matches it by an Is method (errors.Is(err, diag.PathSymlink)), as
// containerd's errdefs kinds are matched, never by message text.
func (c Code) Error() string { return string(c) }

// Diagnostic is one refused piece of input.
type Diagnostic struct {
	Code    Code   `json:"code"`
	Path    string `json:"path"` // fact path, e.g. workspace.git.commondir
	Message string `json:"message"`
}

func (d Diagnostic) String() string {
	if d.Path == "" {
		return fmt.Sprintf("%s: %s", d.Code, d.Message)
	}
	return fmt.Sprintf("%s %s: %s", d.Code, d.Path, d.Message)
}

// List collects diagnostics; stages append to it rather than stopping at the
// first problem, so one run shows the caller everything that must change.
type List []Diagnostic

// Addf appends a diagnostic.
func (l *List) Addf(code Code, path, format string, args ...any) {
	*l = append(*l, Diagnostic{Code: code, Path: path, Message: fmt.Sprintf(format, args...)})
}

// Has reports whether any diagnostic sits at path or below it.
func (l List) Has(path string) bool {
	for _, d := range l {
		if d.Path == path || strings.HasPrefix(d.Path, path+".") || strings.HasPrefix(d.Path, path+"[") {
			return true
		}
	}
	return false
}

// Sorted returns the list ordered by path, then code, then message, with
// exact duplicates removed, so output does not depend on check order.
func (l List) Sorted() List {
	out := append(List(nil), l...)
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		if a.Code != b.Code {
			return a.Code < b.Code
		}
		return a.Message < b.Message
	})
	dedup := out[:0]
	for i, d := range out {
		if i > 0 && d == out[i-1] {
			continue
		}
		dedup = append(dedup, d)
	}
	return dedup
}

// Error makes a non-empty List usable as an error.
func (l List) Error() string {
	var b strings.Builder
	for i, d := range l.Sorted() {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(d.String())
	}
	return b.String()
}

// Err returns nil for an empty list and the sorted list otherwise.
func (l List) Err() error {
	if len(l) == 0 {
		return nil
	}
	return l.Sorted()
}
