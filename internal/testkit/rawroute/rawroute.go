// Package rawroute is the control of the route proxy's differential tests
// (issue 18): a reverse proxy that guards the route as the product does
// (its path, its one caller agent id, no bearer from the sandbox, an
// application/json body within the size limit, a scope check it is given)
// but then forwards the agent's own bytes and the headers the proxy used to
// pass on, its Content-Type and charset included, with the daemon's bearer
// added. The product instead forwards a canonical re-encoding of what it
// checked under its own Content-Type. Given the product's Scope.Check, the
// control lacks only that re-encoding; given Lenient, the proxy's check
// before issue 18, it lacks the strict decoding too. Whatever a control
// lets run at the daemon that the product does not is what the missing
// protection is for.
package rawroute

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"testing"
	"time"
)

// Route is the control's route.
type Route struct {
	// Path and CallerAgentID are what a request must name; Upstream is the
	// daemon's endpoint (http://host:port/path).
	Path, CallerAgentID, Upstream string
	// Token is the daemon's bearer, added to every forwarded request.
	Token string
	// Check is the product's scope check; a non-nil error refuses the body.
	Check func(body []byte) error
}

// MaxBody is the product's default body limit.
const MaxBody = 1 << 20

// forwarded are the request headers the proxy passed on before it wrote
// its own Content-Type.
var forwarded = []string{"Content-Type", "Accept", "Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-Id"}

// Handler is the control proxy.
func (r Route) Handler() (http.Handler, error) {
	up, err := url.Parse(r.Upstream)
	if err != nil || up.Scheme != "http" || up.Host == "" {
		return nil, errors.New("rawroute: the upstream must be http://host:port/path")
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = up.Scheme, up.Host
			pr.Out.URL.Path, pr.Out.URL.RawPath = up.Path, ""
			pr.Out.URL.RawQuery = url.Values{"callerAgentId": {r.CallerAgentID}}.Encode()
			pr.Out.Host = up.Host
			pr.Out.Header = http.Header{}
			for _, h := range forwarded {
				if v := pr.In.Header.Values(h); len(v) > 0 {
					pr.Out.Header[http.CanonicalHeaderKey(h)] = v
				}
			}
			pr.Out.Header.Set("Authorization", "Bearer "+r.Token)
		},
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		switch {
		case req.URL.Path != r.Path || req.Method != http.MethodPost:
			http.Error(w, "not the route", http.StatusNotFound)
			return
		case len(q) != 1 || len(q["callerAgentId"]) != 1 || q.Get("callerAgentId") != r.CallerAgentID:
			http.Error(w, "another caller", http.StatusForbidden)
			return
		case len(req.Header.Values("Authorization")) > 0:
			http.Error(w, "a bearer from the sandbox", http.StatusForbidden)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, MaxBody))
		if err != nil {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		if mt, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type")); mt != "application/json" {
			http.Error(w, "JSON-RPC bodies are application/json", http.StatusUnsupportedMediaType)
			return
		}
		if err := r.Check(body); err != nil {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"refused by the scope"}}`)
			return
		}
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		rp.ServeHTTP(w, req)
	}), nil
}

// Serve runs h on l until the test ends.
func Serve(t testing.TB, l net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// Lenient is the proxy's scope check as it was before issue 18, for the
// control that shows what strict decoding protects: encoding/json's
// reading, whose struct fields match keys case-insensitively (the last
// match wins) and whose duplicate check compares keys exactly.
func Lenient(methods, tools []string) func(body []byte) error {
	return func(body []byte) error {
		if !json.Valid(body) {
			return errors.New("not JSON")
		}
		if err := exactDuplicates(body); err != nil {
			return err
		}
		var msgs []json.RawMessage
		if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
			if err := json.Unmarshal(body, &msgs); err != nil || len(msgs) == 0 || len(msgs) > 32 {
				return errors.New("a batch of 1-32 messages")
			}
		} else {
			msgs = []json.RawMessage{body}
		}
		for _, raw := range msgs {
			var m struct {
				JSONRPC string          `json:"jsonrpc"`
				ID      json.RawMessage `json:"id"`
				Method  *string         `json:"method"`
				Params  json.RawMessage `json:"params"`
			}
			if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
				return errors.New("a message is an object")
			}
			if json.Unmarshal(raw, &m) != nil || m.JSONRPC != "2.0" || m.Method == nil || !slices.Contains(methods, *m.Method) {
				return errors.New("outside the methods")
			}
			if *m.Method == "tools/call" {
				var p struct {
					Name *string `json:"name"`
				}
				if json.Unmarshal(m.Params, &p) != nil || p.Name == nil || !slices.Contains(tools, *p.Name) {
					return errors.New("outside the tools")
				}
			}
		}
		return nil
	}
}

// exactDuplicates refuses an object that names a key twice, keys compared
// after unescaping, exactly.
func exactDuplicates(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				if key, _ := k.(string); seen[key] {
					return errors.New("a key twice")
				} else {
					seen[key] = true
				}
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	return walk()
}
