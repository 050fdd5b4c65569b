package routeproxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The model route (issue 24): the provider key stays outside the sandbox.
// Pi in the sandbox calls http://paseo-gateway:<port><prefix>/… with a
// placeholder key (bundle.ModelRoutePlaceholder); this proxy, outside the
// sandbox, takes the requests the route names (method and path below the
// prefix, nothing else on the provider's host), rebuilds each from what
// it checked (the path it matched, a fresh header set, the body decoded
// strictly and re-encoded), puts the current key in the API's credential
// header, and forwards over TLS verified against the provider's own name.
// Redirects are answered, never followed; answers (SSE streams included)
// pass through as they come.

// ModelLimits are DefaultLimits for a model route: a turn's request holds
// the whole conversation (32 MiB of body, as much as a long session with
// images needs), a minute to send it, and its streamed answer may take as
// long as a tool call's.
var ModelLimits = Limits{MaxConns: 32, ReadHeader: 10 * time.Second, Read: time.Minute,
	Idle: time.Minute, Write: 30 * time.Minute, MaxHeaderBytes: 64 << 10, MaxBody: 32 << 20}

// ModelOptions are what a model route needs besides its bundle entry.
type ModelOptions struct {
	// Limits: zero fields take ModelLimits.
	Limits Limits
	// Key returns the provider key now. It is called for every request,
	// so a key rotated in the secrets is used from the next request on;
	// the returned slice is cleared after use.
	Key func() ([]byte, error)
	// Dial connects to the provider's host:port. The launcher resolves the
	// name on the trusted side, refuses unsafe addresses and dials from the
	// uplink (the host's network).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Roots verify the provider's certificate; nil is the system trust
	// store. Only tests set it (a test CA for the fake model).
	Roots *x509.CertPool
	// Login, on a login route, is closed with the proxy.
	Login *Login
}

// credentialHeaders are the request headers that carry a credential to
// some provider. The sandbox may send only the API's own header, and
// only with the placeholder; any other credential is refused, not
// stripped, so a probe or a planted key shows in the counts.
var credentialHeaders = []string{"Authorization", "X-Api-Key", "Api-Key", "X-Goog-Api-Key", "Proxy-Authorization", "Cookie"}

// Of the sandbox's request headers, the provider gets Accept and the
// feature headers the route lists (bundle.Route.Headers), with listed
// values only; everything else is dropped. Content-Type, the credential,
// Host and the encoding are the proxy's own.

// featureHeader reports whether a header switches a provider feature or
// API version: from the sandbox such a header passes only with values
// the route lists, and is refused otherwise (not dropped, so a probe
// shows in the counts).
func featureHeader(name string) bool {
	l := strings.ToLower(name)
	return (strings.HasPrefix(l, "anthropic-") || strings.HasPrefix(l, "openai-")) &&
		(strings.HasSuffix(l, "-beta") || strings.HasSuffix(l, "-version"))
}

// modelRequest is what the guard decided for one request.
type modelRequest struct {
	path    string // the route's own spelling of the matched path
	query   string // and of its fixed query, if the route lists one
	key     []byte
	headers http.Header // the checked feature headers
	account string      // a Codex login's ChatGPT account id
}

type modelKey struct{}

// NewModel checks a model route and prepares its proxy.
func NewModel(r bundle.Route, o ModelOptions) (*Proxy, error) {
	u, err := url.Parse(r.Upstream)
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.RawPath != "":
		return nil, fmt.Errorf("route %s: upstream must be https://host:port/path without query, user information or escapes", r.Purpose)
	case r.Purpose != grant.RouteModel || u.Path != r.Path || strings.HasSuffix(r.Path, "/"):
		return nil, fmt.Errorf("route %s: a model route serves the upstream's own path prefix", r.Purpose)
	case o.Key == nil || o.Dial == nil:
		return nil, fmt.Errorf("route %s: no key source or dialer", r.Purpose)
	case r.LoginFile != "" && (BodyPolicies[r.API] == nil || grant.ModelLoginAPIs[r.API] == "" || r.Credential != grant.ModelLoginCredential || r.TokenRef != ""):
		return nil, fmt.Errorf("route %s: provider API %q has no subscription login this proxy brokers", r.Purpose, r.API)
	case r.LoginFile == "" && (BodyPolicies[r.API] == nil || !slices.Contains([]string{"authorization-bearer", "x-api-key", "x-goog-api-key", "api-key"}, r.Credential) || grant.ModelCredentials[r.API] != r.Credential):
		return nil, fmt.Errorf("route %s: provider API %q or credential header %q is not one this proxy speaks", r.Purpose, r.API, r.Credential)
	case len(r.Requests) == 0:
		return nil, fmt.Errorf("route %s: forwards no request", r.Purpose)
	case r.Model == "":
		return nil, fmt.Errorf("route %s: names no model", r.Purpose)
	}
	for _, h := range r.HostedTools {
		if grant.ModelHostedTools[h] == "" {
			return nil, fmt.Errorf("route %s: hosted tool %q is not one this proxy knows", r.Purpose, h)
		}
	}
	allowed := map[string][]string{}
	for _, h := range r.Headers {
		name, v, ok := strings.Cut(h, ": ")
		if !ok || !featureHeader(name) || v == "" || strings.ContainsAny(v, ", ") {
			return nil, fmt.Errorf("route %s: header %q is not \"<feature header>: <one value>\"", r.Purpose, h)
		}
		allowed[http.CanonicalHeaderKey(name)] = append(allowed[http.CanonicalHeaderKey(name)], v)
	}
	for _, rq := range r.Requests {
		_, path, _, ok := grant.ModelRequest(rq)
		if !ok {
			return nil, fmt.Errorf("route %s: request %q is not \"GET|POST /path\" with at most one fixed name=value query", r.Purpose, rq)
		}
		if strings.Contains(path, grant.ModelInPath) && !grant.PathSafeModel(r.Model) {
			return nil, fmt.Errorf("route %s: request %q names the model in its path, and model %q is not one plain path segment", r.Purpose, rq, r.Model)
		}
	}
	lim := defaults(o.Limits, ModelLimits)
	p := &Proxy{route: r, limits: lim, upstream: u, reached: map[net.Conn]bool{}, body: BodyPolicies[r.API], headers: allowed}
	host := u.Hostname()
	tr := &http.Transport{
		// Never a proxy from the environment: the provider's own host only.
		Proxy:       nil,
		DialContext: o.Dial,
		TLSClientConfig: &tls.Config{RootCAs: o.Roots, ServerName: host, MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"}},
		TLSHandshakeTimeout: 15 * time.Second,
		// A long prompt may take minutes to its first token.
		ResponseHeaderTimeout: 10 * time.Minute,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			d, _ := pr.In.Context().Value(modelKey{}).(*modelRequest)
			pr.Out.URL = &url.URL{Scheme: "https", Host: u.Host, Path: d.path, RawQuery: d.query}
			pr.Out.Host = u.Host
			pr.Out.Header = d.headers.Clone()
			if v := pr.In.Header.Values("Accept"); len(v) > 0 {
				pr.Out.Header["Accept"] = v
			}
			if pr.In.Method == http.MethodPost {
				pr.Out.Header.Set("Content-Type", "application/json")
			}
			// Uncompressed, so a stream reaches Pi event by event.
			pr.Out.Header.Set("Accept-Encoding", "identity")
			pr.Out.Header.Set("User-Agent", "paseo-policy-model-route")
			switch r.Credential {
			case grant.ModelLoginCredential:
				loginIdentity(r.API, pr.In.Header, pr.Out.Header)
				pr.Out.Header.Set("Authorization", "Bearer "+string(d.key))
				if r.API == codexAPI {
					pr.Out.Header.Set("Chatgpt-Account-Id", d.account)
				}
			case "authorization-bearer":
				pr.Out.Header.Set("Authorization", "Bearer "+string(d.key))
			case "x-api-key":
				pr.Out.Header.Set("X-Api-Key", string(d.key))
			case "x-goog-api-key":
				pr.Out.Header.Set("X-Goog-Api-Key", string(d.key))
			case "api-key":
				pr.Out.Header.Set("Api-Key", string(d.key))
			}
		},
		Transport: tr,
		ModifyResponse: func(resp *http.Response) error {
			// Nothing of the provider's session state reaches the sandbox.
			resp.Header.Del("Set-Cookie")
			// Nor the key, if the provider or a gateway echoes it: in an
			// encoded body the masking could not see it, so only identity
			// (what the route asked for) passes.
			if ce := resp.Header.Values("Content-Encoding"); len(ce) > 1 || (len(ce) == 1 && !strings.EqualFold(ce[0], "identity")) {
				resp.Body.Close()
				return errEncodedAnswer
			}
			d, _ := resp.Request.Context().Value(modelKey{}).(*modelRequest)
			scrubResponse(resp, d.key, &p.Stats.Scrubbed)
			return nil
		},
		// SSE: pass bytes on as they come.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				p.Stats.Refused.Add(1)
				http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
				return
			}
			// The cause (a name, a certificate) is the operator's, not the agent's.
			http.Error(w, "model provider unavailable", http.StatusBadGateway)
		},
	}
	p.srv = &http.Server{Handler: p.modelGuard(rp, o.Key), ReadHeaderTimeout: lim.ReadHeader, ReadTimeout: lim.Read,
		IdleTimeout: lim.Idle, WriteTimeout: lim.Write, MaxHeaderBytes: lim.MaxHeaderBytes,
		ConnState:   p.track,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		ErrorLog:    log.New(io.Discard, "", 0)}
	p.closeIdle = tr.CloseIdleConnections
	if o.Login != nil {
		p.closeIdle = func() { tr.CloseIdleConnections(); o.Login.Close() }
	}
	return p, nil
}

// match returns the route's spelling of the request's path and query
// when its method, path and query are one of the route's requests: a
// query only as a request lists it, byte for byte.
func (p *Proxy) match(req *http.Request) (string, string, int) {
	if req.URL.RawPath != "" || req.URL.ForceQuery || !strings.HasPrefix(req.URL.Path, p.route.Path+"/") {
		return "", "", http.StatusNotFound
	}
	rest := strings.TrimPrefix(req.URL.Path, p.route.Path)
	methodOK := false
	for _, rq := range p.route.Requests {
		m, path, query, _ := grant.ModelRequest(rq)
		path = grant.ModelPath(path, p.route.Model)
		if path != rest || query != req.URL.RawQuery {
			continue
		}
		if m == req.Method {
			return p.route.Path + path, query, 0
		}
		methodOK = true
	}
	if methodOK {
		return "", "", http.StatusMethodNotAllowed
	}
	return "", "", http.StatusNotFound
}

// otherModelInPath reports whether the request's path is one of the
// route's with another model where the route's stands (ModelInPath).
func (p *Proxy) otherModelInPath(req *http.Request) bool {
	rest, ok := strings.CutPrefix(req.URL.Path, p.route.Path)
	if !ok || req.URL.RawPath != "" {
		return false
	}
	for _, rq := range p.route.Requests {
		m, path, query, _ := grant.ModelRequest(rq)
		pre, post, has := strings.Cut(path, grant.ModelInPath)
		if !has || m != req.Method || query != req.URL.RawQuery || len(rest) <= len(pre)+len(post) {
			continue
		}
		if mid, ok := strings.CutPrefix(rest, pre); ok && strings.HasSuffix(mid, post) && !strings.Contains(strings.TrimSuffix(mid, post), "/") {
			return true
		}
	}
	return false
}

// ownCredential reports whether the request carries a credential other
// than the placeholder in the API's own header.
func (p *Proxy) ownCredential(h http.Header) bool {
	for _, name := range credentialHeaders {
		v := h.Values(name)
		if len(v) == 0 {
			continue
		}
		switch {
		case len(v) == 1 && name == "Authorization" && p.route.Credential == "authorization-bearer" && v[0] == "Bearer "+bundle.ModelRoutePlaceholder:
		case len(v) == 1 && name == "Authorization" && p.route.Credential == grant.ModelLoginCredential && v[0] == "Bearer "+bundle.LoginPlaceholder(p.route.API):
		case len(v) == 1 && name == "X-Api-Key" && p.route.Credential == "x-api-key" && v[0] == bundle.ModelRoutePlaceholder:
		case len(v) == 1 && name == "X-Goog-Api-Key" && p.route.Credential == "x-goog-api-key" && v[0] == bundle.ModelRoutePlaceholder:
		case len(v) == 1 && name == "Api-Key" && p.route.Credential == "api-key" && v[0] == bundle.ModelRoutePlaceholder:
		default:
			return true
		}
	}
	return false
}

// modelGuard refuses everything but the route's requests before the
// reverse proxy sees them, and hands it the checked path, body and key.
func (p *Proxy) modelGuard(next http.Handler, key func() ([]byte, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p.arrived(req)
		refuse := func(code int, why string, scope bool) {
			p.Stats.Refused.Add(1)
			if scope {
				p.Stats.OutOfScope.Add(1)
			}
			http.Error(w, why, code)
		}
		path, query, status := p.match(req)
		switch {
		case status == http.StatusNotFound && p.otherModelInPath(req):
			p.refuseModel(w, refuseAt(ReasonForeignModel, "path", "this route serves the model %q only", p.route.Model))
			return
		case len(req.Header.Values("Upgrade")) > 0 || req.Method == http.MethodConnect:
			// A WebSocket (Pi's Codex client tries one first) would carry
			// the turn in frames the route never reads. Refused before
			// anything else: Pi then sends the turn as a request.
			refuse(http.StatusForbidden, "the model route does not upgrade a connection; send the request over HTTP", true)
			return
		case status == http.StatusNotFound:
			refuse(status, "not a request this model route forwards", true)
			return
		case status != 0:
			refuse(status, "method not allowed on this path of the model route", true)
			return
		case p.ownCredential(req.Header):
			refuse(http.StatusForbidden, "this route adds the provider key itself; a credential from the sandbox is refused", false)
			return
		case req.ContentLength > p.limits.MaxBody:
			refuse(http.StatusRequestEntityTooLarge, "request body too large", false)
			return
		}
		headers, rf := p.featureHeaders(req.Header)
		if rf != nil {
			p.refuseModel(w, rf)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, p.limits.MaxBody))
		if err != nil {
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				refuse(http.StatusRequestEntityTooLarge, "request body too large", false)
			} else {
				refuse(http.StatusBadRequest, "request body unreadable", false)
			}
			return
		}
		switch req.Method {
		case http.MethodGet:
			if len(body) > 0 {
				refuse(http.StatusBadRequest, "a GET of the model route has no body", true)
				return
			}
			req.Body, req.ContentLength = http.NoBody, 0
		default:
			h := req.Header
			if ce := h.Values("Content-Encoding"); p.route.API == codexAPI && len(ce) == 1 && strings.EqualFold(ce[0], "zstd") {
				// Pi's Codex client compresses its body (see codex.go).
				plain, err := unzstd(body, p.limits.MaxBody)
				clear(body)
				switch {
				case errors.Is(err, errZstdTooLarge):
					refuse(http.StatusRequestEntityTooLarge, "request body too large once decompressed", false)
					return
				case err != nil:
					refuse(http.StatusBadRequest, "request body is not one zstd frame", true)
					return
				}
				body = plain
				p.Stats.Decompressed.Add(1)
				h = h.Clone()
				h.Del("Content-Encoding")
			}
			if why := plainJSON(h); why != "" {
				refuse(http.StatusUnsupportedMediaType, why, true)
				return
			}
			n, err := decodeStrict(body)
			if err != nil || n.kind != kindObject {
				refuse(http.StatusBadRequest, "the model route forwards one strict JSON object", true)
				return
			}
			if rf := p.body.Check(n, p.route.Model, p.route.HostedTools...); rf != nil {
				p.refuseModel(w, rf)
				return
			}
			// The checked value, re-encoded, is the body from here on.
			c := n.bytes()
			req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(c)), int64(len(c))
		}
		k, err := key()
		if err != nil || !ValidToken(k) {
			clear(k)
			if errors.Is(err, ErrLoginRevoked) {
				p.refuseLogin(w)
				return
			}
			refuse(http.StatusServiceUnavailable, "the provider key is not available to the route", false)
			return
		}
		defer clear(k)
		account := ""
		if p.route.Credential == grant.ModelLoginCredential && p.route.API == codexAPI {
			if account = codexAccount(k); account == "" {
				refuse(http.StatusServiceUnavailable, "the subscription login's access token names no ChatGPT account", false)
				return
			}
		}
		req = req.WithContext(context.WithValue(req.Context(), modelKey{}, &modelRequest{path: path, query: query, key: k, headers: headers, account: account}))
		p.Stats.Forwarded.Add(1)
		next.ServeHTTP(w, req)
	})
}

// refuseLogin answers a request whose subscription login is gone (the
// token endpoint refused the refresh token, or the entry is missing) with
// a 401 in the API's own shape that Pi shows: only a new login on the
// host helps, and the route uses it from the next request on.
func (p *Proxy) refuseLogin(w http.ResponseWriter) {
	p.Stats.Refused.Add(1)
	msg := fmt.Sprintf("the subscription login %q the model route holds for this sandbox was refused by the provider's token endpoint or is missing: log in again on the host (pi, /login %s); the sandbox need not restart, the next request uses the new login", p.route.LoginEntry, p.route.LoginEntry)
	doc := map[string]any{"type": "error", "error": map[string]any{"type": "authentication_error", "message": msg}}
	b, _ := json.Marshal(doc)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write(b)
}

// errEncodedAnswer refuses an answer the route cannot read to mask the key.
var errEncodedAnswer = errors.New("the provider answered with a content encoding the route did not ask for")

// featureHeaders checks the request's feature headers against the
// route's list and returns them rebuilt from the checked values: each
// comma-separated value must be listed for its header.
func (p *Proxy) featureHeaders(h http.Header) (http.Header, *Refusal) {
	out := http.Header{}
	for name, vals := range h {
		if !featureHeader(name) {
			continue
		}
		allowed, ok := p.headers[name]
		if !ok {
			return nil, refuseAt(ReasonFeatureHeader, strings.ToLower(name), "this route passes on no %s header", strings.ToLower(name))
		}
		var got []string
		for _, v := range vals {
			for item := range strings.SplitSeq(v, ",") {
				item = strings.TrimSpace(item)
				if !slices.Contains(allowed, item) {
					return nil, refuseAt(ReasonFeatureHeader, strings.ToLower(name), "the value %q is not one this route's profile lists", item)
				}
				if !slices.Contains(got, item) {
					got = append(got, item)
				}
			}
		}
		out.Set(name, strings.Join(got, ","))
	}
	return out, nil
}

// refuseModel answers a refused request with an error in the API's own
// shape, so Pi's client shows the reason, and counts it.
func (p *Proxy) refuseModel(w http.ResponseWriter, rf *Refusal) {
	p.Stats.Refused.Add(1)
	p.Stats.OutOfScope.Add(1)
	p.Stats.ByReason[rf.Reason].Add(1)
	// 400 for what Pi could have sent differently (a client that falls
	// back without a field, as Pi 1.6.0 does for Anthropic's thread,
	// reads 400); 403 for what the route never forwards.
	status, typ := http.StatusForbidden, "permission_error"
	if rf.Reason == ReasonShape || rf.Reason == ReasonUnknownMember || rf.Reason == ReasonProviderState {
		status, typ = http.StatusBadRequest, "invalid_request_error"
	}
	var doc any
	switch p.route.API {
	case "anthropic-messages":
		doc = map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": rf.Error()}}
	case "google-generative-ai":
		// Google's error shape (google.rpc.Status), which @google/genai
		// reads into the message Pi shows.
		gs := "PERMISSION_DENIED"
		if status == http.StatusBadRequest {
			gs = "INVALID_ARGUMENT"
		}
		doc = map[string]any{"error": map[string]any{"code": status, "message": rf.Error(), "status": gs}}
	default:
		doc = map[string]any{"error": map[string]any{"message": rf.Error(), "type": typ, "param": rf.Path,
			"code": "paseo_route_" + strings.ReplaceAll(rf.Reason.String(), "-", "_")}}
	}
	b, _ := json.Marshal(doc)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
