package launcher

import (
	"context"
	"fmt"
	"net/url"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// startRoute runs the proxy of one private route on the sandbox's gateway.
func startRoute(n *sandboxnet.Network, r bundle.Route, tok *routeproxy.Token) (*routeproxy.Proxy, error) {
	proxy, err := routeproxy.New(r, routeproxy.Limits{}, tok)
	if err != nil {
		return nil, err
	}
	l, err := n.ListenGateway(r.Port)
	if err != nil {
		return nil, fmt.Errorf("route %s: listening on the gateway: %w", r.Purpose, err)
	}
	proxy.Serve(l)
	return proxy, nil
}

// startModelRoute runs the model route's proxy on the gateway. The key
// must be there at launch, as a missing credential always refused one;
// after that a request the key source cannot serve gets 503.
func (l *launch) startModelRoute(n *sandboxnet.Network, r bundle.Route) (*routeproxy.Proxy, error) {
	var key func() ([]byte, error)
	var login *routeproxy.Login
	switch {
	case r.LoginFile != "":
		// A subscription login (oauth-broker): the route reads it from the
		// deployment's auth.json and refreshes it there; no key is handed.
		var err error
		if login, err = routeproxy.OpenLogin(r, n.Dialer(l.opts.Resolve), l.opts.ModelRoots); err != nil {
			return nil, refused(diag.LaunchSecret, "secret", err)
		}
		key = login.Key()
	case l.opts.ModelKey != nil:
		key = l.opts.ModelKey
	case l.opts.Secrets != nil:
		secrets, deployment, ref := l.opts.Secrets, l.m.Deployment, r.TokenRef
		key = func() ([]byte, error) { return secrets(deployment, ref) }
	default:
		return nil, refused(diag.LaunchSecret, "secret", fmt.Errorf("route %s: secret %s (the provider key): no secret source", r.Purpose, r.TokenRef))
	}
	fail := func(err error) (*routeproxy.Proxy, error) {
		if login != nil {
			login.Close()
		}
		return nil, err
	}
	v, err := key()
	valid := err == nil && routeproxy.ValidToken(v)
	clear(v)
	if !valid {
		if err == nil {
			err = routeproxy.ErrBadToken
		}
		if login != nil {
			return fail(refused(diag.LaunchSecret, "secret", fmt.Errorf("route %s: the subscription login %s of %s: %w", r.Purpose, r.LoginEntry, r.LoginFile, err)))
		}
		return nil, refused(diag.LaunchSecret, "secret", fmt.Errorf("route %s: secret %s (the provider key): %w", r.Purpose, r.TokenRef, err))
	}
	// The provider's name must resolve, to addresses egress could have, at
	// launch, as an egress rule's must; each connection resolves again.
	u, err := url.Parse(r.Upstream)
	if err != nil {
		return fail(fmt.Errorf("route %s: upstream: %w", r.Purpose, err))
	}
	if err := n.CheckHost(context.Background(), l.opts.Resolve, u.Hostname()); err != nil {
		return fail(fmt.Errorf("route %s: the provider host: %w", r.Purpose, err))
	}
	proxy, err := routeproxy.NewModel(r, routeproxy.ModelOptions{Key: key, Dial: n.Dialer(l.opts.Resolve), Roots: l.opts.ModelRoots, Login: login})
	if err != nil {
		return fail(err)
	}
	ln, err := n.ListenGateway(r.Port)
	if err != nil {
		proxy.Close()
		return nil, fmt.Errorf("route %s: listening on the gateway: %w", r.Purpose, err)
	}
	proxy.Serve(ln)
	return proxy, nil
}

// routeToken is where the route's proxy finds the daemon's bearer: the
// caller's holder, or (none given) a holder filled once from the secrets
// under the route's tokenRef. The value stays in this process. Without
// the generated MCP config nothing in the sandbox is set up to use the
// route, so a token that cannot be found leaves the holder empty (the
// route answers 503); with it, the launch is refused, as a missing
// credential is, rather than start an agent whose Paseo tools all fail.
func routeToken(opts Options, files bundle.Files, deployment string, r bundle.Route) (*routeproxy.Token, error) {
	if opts.MCPToken != nil {
		return opts.MCPToken, nil
	}
	_, configured := files[bundle.MCPConfigFile]
	if r.TokenRef == "" || opts.Secrets == nil {
		if !configured {
			return &routeproxy.Token{}, nil
		}
		return nil, refused(diag.LaunchSecret, "secret", fmt.Errorf("route %s: no daemon token was handed over and no secret source holds its tokenRef", r.Purpose))
	}
	v, err := opts.Secrets(deployment, r.TokenRef)
	if err != nil {
		if !configured {
			return &routeproxy.Token{}, nil
		}
		return nil, refused(diag.LaunchSecret, "secret", fmt.Errorf("route %s: %w", r.Purpose, err))
	}
	defer clear(v)
	tok := &routeproxy.Token{}
	if err := tok.Set(v); err != nil {
		return nil, refused(diag.LaunchSecret, "secret", fmt.Errorf("route %s: secret %s: %w", r.Purpose, r.TokenRef, err))
	}
	return tok, nil
}

// recordRoute puts a closed proxy's counters into the result.
func (l *launch) recordRoute(purpose string, proxy *routeproxy.Proxy) {
	if l.res.Routes == nil {
		l.res.Routes = map[string]RouteStats{}
	}
	s := &proxy.Stats
	l.res.Routes[purpose] = RouteStats{Forwarded: s.Forwarded.Load(), Refused: s.Refused.Load(),
		OutOfScope: s.OutOfScope.Load(), Filtered: s.Filtered.Load(),
		RefusedConns: s.RefusedConns.Load(), Cut: s.Cut.Load(), Scrubbed: s.Scrubbed.Load(),
		Decompressed: s.Decompressed.Load()}
	if m := s.Refusals(); len(m) > 0 {
		rs := l.res.Routes[purpose]
		rs.ByReason = m
		l.res.Routes[purpose] = rs
	}
}
