// Package routeproxy is the launcher's per-sandbox proxy for a private
// route: it listens on the sandbox's gateway (the veth peer, which the
// packet filter opens for exactly this port) and forwards one method, one
// path and one caller agent id to the daemon's own listener, which the
// sandbox cannot reach, and only JSON-RPC messages inside the route's MCP
// scope (scope.go). Everything else is refused without contacting the
// daemon. The daemon's bearer never enters the sandbox: the proxy adds
// the current one (Token) to every request it forwards and refuses a
// request that brings an Authorization header of its own.
//
// The model route (model.go, NewModel) is the same server for the model
// provider: the provider key added outside the sandbox, only the
// profile's requests of the provider API forwarded, over verified TLS.
package routeproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"paseo.dev/paseo-policy/policy/bundle"
)

// Limits bound what one sandbox can take of its proxy, which runs as root
// in the sandbox's holder, outside the sandbox's cgroup. Zero fields take
// DefaultLimits. Every proxy serves one sandbox, so each limit is per
// sandbox: exhausting one's own proxy never slows a neighbour's.
type Limits struct {
	// MaxConns is how many connections the proxy serves at once; further
	// ones are closed at accept and counted in Stats.RefusedConns.
	MaxConns int
	// ReadHeader bounds the request line and headers; Read the whole
	// request; Idle a kept-alive connection between requests; Write a
	// response, from the end of its request (MCP answers may stream).
	ReadHeader, Read, Idle, Write time.Duration
	// MaxHeaderBytes and MaxBody bound a request's headers and body.
	MaxHeaderBytes int
	MaxBody        int64
}

// DefaultLimits: an agent's MCP client keeps one or two connections and
// sends small JSON-RPC requests, so 32 connections, 64 KiB of headers and
// 1 MiB of body (a long prompt for a new agent fits many times) leave
// ample room while bounding a flooding sandbox to a few MiB of the
// holder's buffers (headers are buffered, bodies stream through). 10 s for headers and 30 s for a whole request cut a
// slow sender early; a minute idle is longer than any client's keep-alive
// reuse needs; 30 minutes for a response is the longest one tool call
// (waiting for another agent's turn) may stream.
var DefaultLimits = Limits{MaxConns: 32, ReadHeader: 10 * time.Second, Read: 30 * time.Second,
	Idle: time.Minute, Write: 30 * time.Minute, MaxHeaderBytes: 64 << 10, MaxBody: 1 << 20}

func (l Limits) withDefaults() Limits { return defaults(l, DefaultLimits) }

// defaults fills l's zero fields from d.
func defaults(l, d Limits) Limits {
	if l.MaxConns > 0 {
		d.MaxConns = l.MaxConns
	}
	for _, p := range []struct{ dst, src *time.Duration }{{&d.ReadHeader, &l.ReadHeader}, {&d.Read, &l.Read}, {&d.Idle, &l.Idle}, {&d.Write, &l.Write}} {
		if *p.src > 0 {
			*p.dst = *p.src
		}
	}
	if l.MaxHeaderBytes > 0 {
		d.MaxHeaderBytes = l.MaxHeaderBytes
	}
	if l.MaxBody > 0 {
		d.MaxBody = l.MaxBody
	}
	return d
}

// forwarded are the request headers of the agent's that reach the daemon;
// the rest (cookies, forwarding headers, a Content-Encoding, anything the
// agent invents) are dropped. Authorization and Content-Type are the
// proxy's own: the daemon's current token, and application/json without
// parameters, since the body is the proxy's UTF-8 encoding of what it
// checked (body-parser would otherwise decode it by the agent's charset).
var forwarded = []string{"Accept", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-Id"}

// Stats counts what the proxy did, for the launch result and tests.
type Stats struct {
	Forwarded atomic.Int64
	// Refused counts requests the guard refused (route, caller, a bearer
	// sent by the sandbox, no daemon token yet, body size, scope);
	// OutOfScope the part of them whose JSON-RPC body was malformed or
	// outside the MCP scope; RefusedConns connections closed at accept
	// because the proxy already served its cap.
	Refused      atomic.Int64
	OutOfScope   atomic.Int64
	RefusedConns atomic.Int64
	// Filtered counts the tools dropped from tools/list answers because
	// they are outside the scope.
	Filtered atomic.Int64
	// Cut counts requests the server ended before the guard saw them:
	// headers too large, or too slow to arrive.
	Cut atomic.Int64
	// ByReason counts a model route's refusals of bodies and feature
	// headers by Reason (each also in Refused and OutOfScope).
	ByReason [numReasons]atomic.Int64
	// Scrubbed counts the provider key's spellings the model route
	// replaced in answers before they reached the sandbox.
	Scrubbed atomic.Int64
	// Decompressed counts the request bodies a model route decompressed
	// (Pi's zstd Codex turns) before checking them.
	Decompressed atomic.Int64
}

// Refusals are ByReason by reason name, the reasons with a count only.
func (s *Stats) Refusals() map[string]int64 {
	m := map[string]int64{}
	for _, r := range Reasons() {
		if n := s.ByReason[r].Load(); n > 0 {
			m[r.String()] = n
		}
	}
	return m
}

// Proxy serves one route.
type Proxy struct {
	route    bundle.Route
	scope    Scope
	token    *Token
	limits   Limits
	upstream *url.URL
	srv      *http.Server
	Stats    Stats
	wg       sync.WaitGroup
	// reached tracks, per connection with a request under way, whether
	// that request got to the guard (so a close before it is a cut).
	mu      sync.Mutex
	reached map[net.Conn]bool
	// closeIdle drops a model route's idle connections to the provider.
	closeIdle func()
	// A model route's body policy and its feature headers' admitted
	// values, by canonical name.
	body    *BodyPolicy
	headers map[string][]string
}

type connKey struct{}

// forwardKey carries, from the guard to the reverse proxy, what the guard
// decided for one request: the token it carries and whether it asks for
// tools/list, whose answers are filtered.
type forwardKey struct{}

type forward struct {
	token      string
	listsTools bool
}

// track follows each connection's state to count requests cut before the
// guard: a connection that read request bytes (active) and closed without
// its request reaching the guard.
func (p *Proxy) track(c net.Conn, st http.ConnState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch st {
	case http.StateActive:
		p.reached[c] = false
	case http.StateIdle:
		delete(p.reached, c)
	case http.StateClosed, http.StateHijacked:
		if got, ok := p.reached[c]; ok && !got {
			p.Stats.Cut.Add(1)
		}
		delete(p.reached, c)
	}
}

func (p *Proxy) arrived(req *http.Request) {
	c, _ := req.Context().Value(connKey{}).(net.Conn)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.reached[c]; ok {
		p.reached[c] = true
	}
}

// New checks the route and prepares its proxy. The upstream must be plain
// http to a daemon listener; its path must equal the route's path. tok is
// where the daemon's current bearer is kept; until it holds one, every
// request is refused (503).
func New(r bundle.Route, l Limits, tok *Token) (*Proxy, error) {
	u, err := url.Parse(r.Upstream)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("route %s: upstream must be http://host:port/path without query or user information", r.Purpose)
	}
	if r.Method != http.MethodPost || r.Path == "" || u.Path != r.Path || r.CallerAgentID == "" {
		return nil, fmt.Errorf("route %s: only POST to the upstream's own path for one caller agent id is supported", r.Purpose)
	}
	if tok == nil {
		return nil, fmt.Errorf("route %s: no token holder for the daemon's bearer", r.Purpose)
	}
	p := &Proxy{route: r, scope: Scope{Methods: r.Methods, Tools: r.Tools}, token: tok, upstream: u,
		limits: l.withDefaults(), reached: map[net.Conn]bool{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = u.Scheme, u.Host
			pr.Out.URL.Path, pr.Out.URL.RawPath = u.Path, ""
			pr.Out.URL.RawQuery = url.Values{"callerAgentId": {r.CallerAgentID}}.Encode()
			pr.Out.Host = u.Host
			pr.Out.Header = http.Header{}
			for _, h := range forwarded {
				if v := pr.In.Header.Values(h); len(v) > 0 {
					pr.Out.Header[http.CanonicalHeaderKey(h)] = v
				}
			}
			f, _ := pr.In.Context().Value(forwardKey{}).(*forward)
			pr.Out.Header.Set("Authorization", "Bearer "+f.token)
			pr.Out.Header.Set("Content-Type", "application/json")
		},
		ModifyResponse: func(resp *http.Response) error {
			f, _ := resp.Request.Context().Value(forwardKey{}).(*forward)
			if f == nil || !f.listsTools {
				return nil
			}
			return p.scope.filterAnswer(resp, &p.Stats.Filtered)
		},
		// MCP answers may stream (SSE): pass bytes on as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				p.Stats.Refused.Add(1)
				http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
				return
			}
			if errors.Is(err, errAnswer) {
				// Refused rather than passed on unfiltered.
				p.Stats.Refused.Add(1)
			}
			http.Error(w, "upstream unavailable", http.StatusBadGateway)
		},
	}
	lim := p.limits
	p.srv = &http.Server{Handler: p.guard(rp), ReadHeaderTimeout: lim.ReadHeader, ReadTimeout: lim.Read,
		IdleTimeout: lim.Idle, WriteTimeout: lim.Write, MaxHeaderBytes: lim.MaxHeaderBytes,
		ConnState:   p.track,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		// What an agent sends is not the launcher's log.
		ErrorLog: log.New(io.Discard, "", 0)}
	return p, nil
}

// guard refuses everything but the route before the reverse proxy sees it.
func (p *Proxy) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p.arrived(req)
		refuse := func(code int, why string) {
			p.Stats.Refused.Add(1)
			http.Error(w, why, code)
		}
		switch q := req.URL.Query(); {
		case req.URL.Path != p.route.Path || req.URL.RawPath != "":
			refuse(http.StatusNotFound, "not a route")
		case req.Method != p.route.Method:
			refuse(http.StatusMethodNotAllowed, "method not allowed on this route")
		case len(q) != 1 || len(q["callerAgentId"]) != 1 || q.Get("callerAgentId") != p.route.CallerAgentID:
			refuse(http.StatusForbidden, "this sandbox may only call as its own agent")
		case len(req.Header.Values("Authorization")) > 0:
			// Refused, not stripped: the generated MCP config sends none,
			// so a bearer from the sandbox is a stale or planted config or a
			// probe, and the count shows it.
			refuse(http.StatusForbidden, "this route adds the daemon's bearer itself; the sandbox sends none")
		case req.ContentLength > p.limits.MaxBody:
			refuse(http.StatusRequestEntityTooLarge, "request body too large")
		default:
			tok, ok := p.token.current()
			if !ok {
				refuse(http.StatusServiceUnavailable, "the daemon's MCP token is not known yet")
				return
			}
			// A chunked body is cut at the limit while it is read.
			body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, p.limits.MaxBody))
			if err != nil {
				if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
					refuse(http.StatusRequestEntityTooLarge, "request body too large")
				} else {
					refuse(http.StatusBadRequest, "request body unreadable")
				}
				return
			}
			if why := plainJSON(req.Header); why != "" {
				p.Stats.OutOfScope.Add(1)
				refuse(http.StatusUnsupportedMediaType, why)
				return
			}
			c, err := p.scope.Check(body)
			if err != nil {
				rerr, _ := errors.AsType[*RPCError](err)
				p.Stats.Refused.Add(1)
				p.Stats.OutOfScope.Add(1)
				status := http.StatusOK // a JSON-RPC error answers each request
				if len(rerr.IDs) == 0 {
					status = http.StatusBadRequest // nothing the client can match it to
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(status)
				_, _ = w.Write(refusal(rerr))
				return
			}
			// The checked value, re-encoded, is the body from here on.
			req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(c.Body)), int64(len(c.Body))
			req = req.WithContext(context.WithValue(req.Context(), forwardKey{}, &forward{token: tok, listsTools: c.ListsTools}))
			p.Stats.Forwarded.Add(1)
			next.ServeHTTP(w, req)
		}
	})
}

// plainJSON says why a request's headers do not declare a body the proxy
// reads as the daemon would ("" if they do): application/json, in UTF-8
// (the only charset parameter accepted, and no other), not compressed.
// A body declared in another charset would be judged as UTF-8 here while
// its sender meant something else; refusing it keeps the two the same.
func plainJSON(h http.Header) string {
	mt, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mt != "application/json" || len(h.Values("Content-Type")) != 1 {
		return "JSON-RPC bodies are application/json"
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return "JSON-RPC bodies are application/json in UTF-8, with no other parameter"
		}
	}
	if ce := h.Values("Content-Encoding"); len(ce) > 0 && (len(ce) != 1 || !strings.EqualFold(ce[0], "identity")) {
		return "JSON-RPC bodies are sent uncompressed"
	}
	return ""
}

// Serve runs the proxy on l until Close.
func (p *Proxy) Serve(l net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// Serve returns when Close shuts the server down or the listener
		// goes away with the sandbox; either way there is nothing to report.
		_ = p.srv.Serve(&capped{Listener: l, slots: make(chan struct{}, p.limits.MaxConns), refused: &p.Stats.RefusedConns})
	}()
}

// capped closes connections past its slots at accept: the refused client
// learns at once, and the kernel's backlog never fills with a flood that
// would otherwise wait there for a slot.
type capped struct {
	net.Listener
	slots   chan struct{}
	refused *atomic.Int64
}

func (c *capped) Accept() (net.Conn, error) {
	for {
		conn, err := c.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case c.slots <- struct{}{}:
			return &slotConn{Conn: conn, free: func() { <-c.slots }}, nil
		default:
			c.refused.Add(1)
			conn.Close()
		}
	}
}

// slotConn gives its slot back once, when closed: before the close, so a
// client that saw this connection end and reconnects finds the slot free.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (s *slotConn) Close() error {
	s.once.Do(s.free)
	return s.Conn.Close()
}

// Close stops the proxy and waits for it.
func (p *Proxy) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	if err != nil {
		err = p.srv.Close()
	}
	p.wg.Wait()
	if p.closeIdle != nil {
		p.closeIdle()
	}
	return err
}
