// Package routeproxy is the launcher's per-sandbox proxy for a private
// route: it listens on the sandbox's gateway (the veth peer, which the
// packet filter opens for exactly this port) and forwards one method, one
// path and one caller agent id to the daemon's own listener, which the
// sandbox cannot reach. Everything else is refused without contacting the
// daemon. The bearer header passes through unchanged: the daemon still
// authorizes every request with its per-run token.
package routeproxy

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"paseo.dev/paseo-policy/bundle"
)

// MaxBody bounds a request body; MCP tool calls are small JSON documents.
const MaxBody = 4 << 20

// forwarded are the request headers that reach the daemon; the rest
// (cookies, forwarding headers, anything the agent invents) are dropped.
var forwarded = []string{"Authorization", "Content-Type", "Accept", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-Id"}

// Stats counts what the proxy did, for the launch result and tests.
type Stats struct {
	Forwarded atomic.Int64
	Refused   atomic.Int64
}

// Proxy serves one route.
type Proxy struct {
	route    bundle.Route
	upstream *url.URL
	srv      *http.Server
	Stats    Stats
	wg       sync.WaitGroup
}

// New checks the route and prepares its proxy. The upstream must be plain
// http to a daemon listener; its path must equal the route's path.
func New(r bundle.Route) (*Proxy, error) {
	u, err := url.Parse(r.Upstream)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("route %s: upstream must be http://host:port/path without query or user information", r.Purpose)
	}
	if r.Method != http.MethodPost || r.Path == "" || u.Path != r.Path || r.CallerAgentID == "" {
		return nil, fmt.Errorf("route %s: only POST to the upstream's own path for one caller agent id is supported", r.Purpose)
	}
	p := &Proxy{route: r, upstream: u}
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
		},
		// MCP answers may stream (SSE): pass bytes on as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "upstream unavailable", http.StatusBadGateway)
		},
	}
	p.srv = &http.Server{Handler: p.guard(rp), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		// What an agent sends is not the launcher's log.
		ErrorLog: log.New(io.Discard, "", 0)}
	return p, nil
}

// guard refuses everything but the route before the reverse proxy sees it.
func (p *Proxy) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
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
		case req.Header.Get("Authorization") == "":
			refuse(http.StatusUnauthorized, "bearer token required")
		default:
			req.Body = http.MaxBytesReader(w, req.Body, MaxBody)
			p.Stats.Forwarded.Add(1)
			next.ServeHTTP(w, req)
		}
	})
}

// Serve runs the proxy on l until Close.
func (p *Proxy) Serve(l net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// Serve returns when Close shuts the server down or the listener
		// goes away with the sandbox; either way there is nothing to report.
		_ = p.srv.Serve(l)
	}()
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
	return err
}
