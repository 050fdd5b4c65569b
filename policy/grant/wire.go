package grant

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"paseo.dev/paseo-policy/diag"
)

// Encoded is one grant as manifest.json holds it, a tagged union: "kind"
// (with "subject" for kinds that hold several types) picks the Go type,
// and only that type's fields may appear. "access" is derived from the payload and
// is written for readers; a decoded grant whose access disagrees is
// refused. docs/grants.md lists the fields per kind.
type Encoded struct {
	Kind    Kind   `json:"kind"`
	Subject string `json:"subject"`
	Access  Access `json:"access"`
	// Value is the kind's one value, typed: a string (env, cwd, hostname,
	// network mode, capabilities "none"), a number (ids, rlimits, cgroup
	// bounds, CPUs, limits) or a boolean (process and runtime flags).
	Value any      `json:"value,omitempty"`
	Args  []string `json:"args,omitempty"` // argv words

	// rootfs and mount
	Source   string   `json:"source,omitempty"`
	ReadOnly *bool    `json:"readonly,omitempty"`
	Version  string   `json:"version,omitempty"`
	Type     string   `json:"type,omitempty"`
	Options  []string `json:"options,omitempty"`
	Digest   string   `json:"digest,omitempty"`

	// egress and route
	Proto         string   `json:"proto,omitempty"`
	Port          int      `json:"port,omitempty"`
	Purpose       string   `json:"purpose,omitempty"`
	Method        string   `json:"method,omitempty"`
	Path          string   `json:"path,omitempty"`
	Upstream      string   `json:"upstream,omitempty"`
	CallerAgentID string   `json:"callerAgentId,omitempty"`
	TokenRef      string   `json:"tokenRef,omitempty"`
	Methods       []string `json:"methods,omitempty"`
	Tools         []string `json:"tools,omitempty"`
	API           string   `json:"api,omitempty"`
	Credential    string   `json:"credential,omitempty"`
	Requests      []string `json:"requests,omitempty"`
	Model         string   `json:"model,omitempty"`
	Headers       []string `json:"headers,omitempty"`
	HostedTools   []string `json:"hostedTools,omitempty"`
	LoginFile     string   `json:"loginFile,omitempty"`
	LoginEntry    string   `json:"loginEntry,omitempty"`
	LoginRefresh  string   `json:"loginRefresh,omitempty"`

	Reason string `json:"reason"`
	Fact   string `json:"fact"`
}

func head(g Grant) Encoded {
	p := g.Why()
	return Encoded{Kind: g.Kind(), Subject: g.Subject(), Access: g.Access(), Reason: p.Reason, Fact: p.Fact}
}

func ptr[T any](v T) *T { return &v }

func (g Rootfs) encode() Encoded {
	w := head(g)
	w.Source, w.ReadOnly, w.Version, w.Digest = g.Path, ptr(g.ReadOnly), g.Version, g.Digest
	return w
}
func (g Mount) encode() Encoded {
	w := head(g)
	w.Type, w.Source, w.Options, w.Digest = g.Type, g.Source, g.Options, g.Digest
	return w
}
func (g Argv) encode() Encoded            { w := head(g); w.Args = g.Words; return w }
func (g Cwd) encode() Encoded             { w := head(g); w.Value = g.Dir; return w }
func (g NoNewPrivileges) encode() Encoded { w := head(g); w.Value = g.On; return w }
func (g Terminal) encode() Encoded        { w := head(g); w.Value = g.On; return w }
func (g Capabilities) encode() Encoded    { w := head(g); w.Value = "none"; return w }
func (g Identity) encode() Encoded        { w := head(g); w.Value = g.ID; return w }
func (g Env) encode() Encoded             { w := head(g); w.Value = g.Value; return w }
func (g Hostname) encode() Encoded        { w := head(g); w.Value = g.Name; return w }
func (g Namespace) encode() Encoded       { return head(g) }
func (g Rlimit) encode() Encoded          { w := head(g); w.Value = g.Max; return w }
func (g CgroupMax) encode() Encoded       { w := head(g); w.Value = g.Max; return w }
func (g CPUQuota) encode() Encoded        { w := head(g); w.Value = g.CPUs; return w }
func (g OutputLimit) encode() Encoded     { w := head(g); w.Value = g.Bytes; return w }
func (g WallLimit) encode() Encoded       { w := head(g); w.Value = int64(g.Wall / time.Second); return w }
func (g NetworkMode) encode() Encoded     { w := head(g); w.Value = g.Mode; return w }
func (g DirectFS) encode() Encoded        { w := head(g); w.Value = g.On; return w }
func (g Egress) encode() Encoded {
	w := head(g)
	w.Proto, w.Port, w.Purpose = g.Proto, g.Port, g.Purpose
	return w
}
func (g Route) encode() Encoded {
	w := head(g)
	w.Proto, w.Port, w.Method, w.Path, w.Upstream = g.Proto, g.Port, g.Method, g.Path, g.Upstream
	w.CallerAgentID, w.TokenRef, w.Methods, w.Tools = g.CallerAgentID, g.TokenRef, g.Methods, g.Tools
	w.API, w.Credential, w.Requests = g.API, g.Credential, g.Requests
	w.Model, w.Headers, w.HostedTools = g.Model, g.Headers, g.HostedTools
	w.LoginFile, w.LoginEntry, w.LoginRefresh = g.LoginFile, g.LoginEntry, g.LoginRefresh
	return w
}

// Encode returns the list as manifest.json writes it; never nil.
func (l List) Encode() []Encoded {
	ws := make([]Encoded, len(l))
	for i, g := range l {
		ws[i] = g.encode()
	}
	return ws
}

// MarshalJSON writes the list as tagged unions.
func (l List) MarshalJSON() ([]byte, error) { return marshal(l.Encode()) }

// marshal is json.Marshal without HTML escaping, as bundle.Marshal writes
// documents: an encoder does not undo a Marshaler's escapes.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Error is a grant refused by the decoder or by its own Validate, with its
// index in the list and a stable code (diag.GrantUnknownKind or
// diag.GrantInvalid).
type Error struct {
	Code  diag.Code
	Index int
	Err   error
}

func (e *Error) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("%s grants: %v", e.Code, e.Err)
	}
	return fmt.Sprintf("%s grants[%d]: %v", e.Code, e.Index, e.Err)
}
func (e *Error) Unwrap() error { return e.Err }

// UnmarshalJSON decodes a list strictly: every element must name a known
// kind, hold only that kind's fields in their canonical types, and pass
// the type's Validate.
func (l *List) UnmarshalJSON(data []byte) error {
	var raws []json.RawMessage
	if err := json.Unmarshal(data, &raws); err != nil {
		return &Error{Code: diag.GrantInvalid, Index: -1, Err: err}
	}
	out := make(List, 0, len(raws))
	for i, raw := range raws {
		g, code, err := decodeOne(raw)
		if err != nil {
			return &Error{Code: code, Index: i, Err: err}
		}
		out = append(out, g)
	}
	*l = out
	return nil
}

func decodeOne(raw []byte) (Grant, diag.Code, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	var w Encoded
	if err := dec.Decode(&w); err != nil {
		return nil, diag.GrantInvalid, err
	}
	if dec.More() {
		return nil, diag.GrantInvalid, errors.New("trailing data")
	}
	g, err := typed(w)
	if err != nil {
		return nil, diag.GrantUnknownKind, err
	}
	if g == nil {
		return nil, diag.GrantInvalid, fmt.Errorf("%s %s: value has the wrong type", w.Kind, w.Subject)
	}
	// The typed grant written back must be the element read: this refuses
	// fields of other kinds, a wrong access and non-canonical numbers.
	if !sameEncoding(w, g.encode()) {
		return nil, diag.GrantInvalid, fmt.Errorf("%s %s: fields, access or values do not match the kind", w.Kind, w.Subject)
	}
	if err := g.Validate(); err != nil {
		return nil, diag.GrantInvalid, fmt.Errorf("%s %s: %w", w.Kind, w.Subject, err)
	}
	return g, "", nil
}

func sameEncoding(a, b Encoded) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// typed picks the type for kind and subject. It returns an error for an
// unknown kind or subject, and a nil grant for a value of the wrong type.
func typed(w Encoded) (Grant, error) {
	// An empty list decodes as nil: the encoder omits an empty list, so a
	// decoded grant re-encodes to bytes that decode to the same grant.
	for _, l := range []*[]string{&w.Args, &w.Options, &w.Methods, &w.Tools, &w.Requests, &w.Headers, &w.HostedTools} {
		if len(*l) == 0 {
			*l = nil
		}
	}
	p := Provenance{Reason: w.Reason, Fact: w.Fact}
	str := func() (string, bool) { s, ok := w.Value.(string); return s, ok }
	boolean := func() (bool, bool) { b, ok := w.Value.(bool); return b, ok }
	num := func() (json.Number, bool) { n, ok := w.Value.(json.Number); return n, ok }
	i64 := func() (int64, bool) {
		n, ok := num()
		if !ok {
			return 0, false
		}
		v, err := n.Int64()
		return v, err == nil
	}
	var g Grant
	ok := true
	switch w.Kind {
	case KindRootfs:
		ro := w.ReadOnly != nil && *w.ReadOnly
		g = Rootfs{Path: w.Source, ReadOnly: ro, Version: w.Version, Digest: w.Digest, Provenance: p}
	case KindMount:
		g = Mount{Destination: w.Subject, Type: w.Type, Source: w.Source, Options: w.Options, Digest: w.Digest, Provenance: p}
	case KindProcess:
		switch w.Subject {
		case "argv":
			g = Argv{Words: w.Args, Provenance: p}
		case "cwd":
			var s string
			s, ok = str()
			g = Cwd{Dir: s, Provenance: p}
		case "noNewPrivileges":
			var b bool
			b, ok = boolean()
			g = NoNewPrivileges{On: b, Provenance: p}
		case "terminal":
			var b bool
			b, ok = boolean()
			g = Terminal{On: b, Provenance: p}
		case "capabilities":
			g = Capabilities{Provenance: p}
		default:
			return nil, fmt.Errorf("process subject %q is not one this decoder knows", w.Subject)
		}
	case KindIdentity:
		var n int64
		n, ok = i64()
		ok = ok && n >= 0 && n <= 1<<32-1
		g = Identity{Field: w.Subject, ID: uint32(n), Provenance: p}
	case KindEnv:
		var s string
		s, ok = str()
		g = Env{Name: w.Subject, Value: s, Provenance: p}
	case KindHostname:
		var s string
		s, ok = str()
		g = Hostname{Name: s, Provenance: p}
	case KindNamespace:
		g = Namespace{Type: w.Subject, Provenance: p}
	case KindRlimit:
		var n json.Number
		n, ok = num()
		var v uint64
		if ok {
			var err error
			v, err = strconv.ParseUint(n.String(), 10, 64)
			ok = err == nil
		}
		g = Rlimit{Type: w.Subject, Max: v, Provenance: p}
	case KindCgroup:
		if w.Subject == "cpu" {
			var n json.Number
			n, ok = num()
			var f float64
			if ok {
				var err error
				f, err = n.Float64()
				ok = err == nil
			}
			g = CPUQuota{CPUs: f, Provenance: p}
		} else {
			var n int64
			n, ok = i64()
			g = CgroupMax{Resource: w.Subject, Max: n, Provenance: p}
		}
	case KindLimit:
		var n int64
		n, ok = i64()
		switch w.Subject {
		case "outputBytes":
			g = OutputLimit{Bytes: n, Provenance: p}
		case "wallSeconds":
			ok = ok && n <= int64(1<<63-1)/int64(time.Second)
			g = WallLimit{Wall: time.Duration(n) * time.Second, Provenance: p}
		default:
			return nil, fmt.Errorf("limit %q is not one this decoder knows", w.Subject)
		}
	case KindRuntime:
		switch w.Subject {
		case "network":
			var s string
			s, ok = str()
			g = NetworkMode{Mode: s, Provenance: p}
		case "directfs":
			var b bool
			b, ok = boolean()
			g = DirectFS{On: b, Provenance: p}
		default:
			return nil, fmt.Errorf("runtime flag %q is not one this decoder knows", w.Subject)
		}
	case KindFSMonitor:
		if w.Subject != "workspace" {
			return nil, fmt.Errorf("fsmonitor subject %q is not one this decoder knows", w.Subject)
		}
		var b bool
		b, ok = boolean()
		g = FSMonitor{On: b, Port: w.Port, Path: w.Path, Provenance: p}
	case KindSearch:
		if w.Subject != "workspace" {
			return nil, fmt.Errorf("search subject %q is not one this decoder knows", w.Subject)
		}
		var b bool
		b, ok = boolean()
		g = Search{On: b, Port: w.Port, Path: w.Path, Provenance: p}
	case KindEgress:
		g = Egress{Host: w.Subject, Proto: w.Proto, Port: w.Port, Purpose: w.Purpose, Provenance: p}
	case KindRoute:
		g = Route{Purpose: w.Subject, Proto: w.Proto, Port: w.Port, Method: w.Method, Path: w.Path, Upstream: w.Upstream,
			CallerAgentID: w.CallerAgentID, TokenRef: w.TokenRef, Methods: w.Methods, Tools: w.Tools,
			API: w.API, Credential: w.Credential, Requests: w.Requests, Model: w.Model, Headers: w.Headers, HostedTools: w.HostedTools,
			LoginFile: w.LoginFile, LoginEntry: w.LoginEntry, LoginRefresh: w.LoginRefresh, Provenance: p}
	default:
		return nil, fmt.Errorf("kind %q is not one this decoder knows", w.Kind)
	}
	if !ok {
		return nil, nil
	}
	return g, nil
}

// sameAuthority compares two grants ignoring their provenance: reasons and
// fact paths are explanation, not authority.
func sameAuthority(a, b Grant) bool {
	if reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	wa, wb := a.encode(), b.encode()
	wa.Reason, wa.Fact, wb.Reason, wb.Fact = "", "", "", ""
	return sameEncoding(wa, wb)
}
