// Package gateway serves a verified bundle's private routes outside the
// agent's sandbox for a cluster launch: the agent's Pod has no launcher
// beside it, so the route proxies the launcher runs on a sandbox's
// gateway address (runtime/launcher/routeproxy) run here, unchanged, as a
// workload of their own (`paseo-policy gateway`, docs/kubernetes.md "The
// cluster gateway"). One gateway serves one bundle: the scope (the MCP
// route's caller, methods and tools; the model route's requests, model
// and headers) is that plan's, one listener per route port, as the
// launcher binds them.
//
// The credentials are read once at start from files (what a kubelet
// mounts from a Secret), checked on the descriptor they were read from,
// and kept in the proxies' holders only: no error, log or answer carries
// them. Every refusal has a code (diag.Gateway*), and nothing listens
// unless every check passed.
package gateway

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// Options are what a gateway serves and with what.
type Options struct {
	// Bundle is the compiled bundle's directory, read once and verified
	// (launchplan.Load: ocicheck on the bytes read).
	Bundle string
	// Listen is the address every route's port is listened on (in a Pod,
	// 0.0.0.0: the Pod's own address; the Service forwards each route
	// port to it).
	Listen netip.Addr
	// ModelKeyFile holds the provider key of the bundle's model route;
	// MCPTokenFile the daemon's bearer of its MCP route. Each is required
	// when the bundle has the route and refused when it has not.
	ModelKeyFile string
	MCPTokenFile string
	// ModelRoots verify the provider's certificate; nil is the system
	// trust store (a private model gateway's CA: --model-ca).
	ModelRoots *x509.CertPool
	// Resolve resolves the provider's name (nil: the system's resolver).
	Resolve sandboxnet.Resolver
	// Dial, in tests only, replaces the dialer to the provider (nil:
	// sandboxnet.SafeDialer(Resolve), which refuses unsafe addresses
	// such as loopback, where the tests' fake model listens). With it the
	// start's provider check is the test's too.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Error is a refusal at start with its stable code and the option or
// bundle path it is about. Its text never holds a credential.
type Error struct {
	Code diag.Code
	Path string
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }

func (e *Error) Unwrap() error { return e.Err }

// Is matches the refusal's code: errors.Is(err, diag.GatewaySecret).
func (e *Error) Is(target error) bool { c, ok := target.(diag.Code); return ok && c == e.Code }

// Diagnostic is the refusal as the command line prints it.
func (e *Error) Diagnostic() diag.Diagnostic {
	return diag.Diagnostic{Code: e.Code, Path: e.Path, Message: e.Err.Error()}
}

func refuse(code diag.Code, path string, format string, args ...any) *Error {
	return &Error{Code: code, Path: path, Err: fmt.Errorf(format, args...)}
}

// Route is one served route: its bundle entry, where it listens and its
// proxy (whose Stats count what it forwarded and refused).
type Route struct {
	Route bundle.Route
	Addr  netip.AddrPort
	Proxy *routeproxy.Proxy
}

// Gateway is a bundle's routes being served.
type Gateway struct {
	Routes []Route
}

// isModel is the one place the gateway tells a model route from the MCP
// route (36-5 types a route's purpose; this is where that type goes).
func isModel(r bundle.Route) bool { return routeproxy.IsModel(r) }

// Start reads and verifies the bundle, reads the credentials its routes
// need, and serves every route; on any refusal nothing is left listening.
func Start(o Options) (*Gateway, error) {
	routes, err := planRoutes(o.Bundle)
	if err != nil {
		return nil, err
	}
	if !o.Listen.IsValid() {
		return nil, refuse(diag.GatewayListen, "options.listen", "the listen address must be an IP address")
	}
	var model, mcp *bundle.Route
	for i := range routes {
		if isModel(routes[i]) {
			model = &routes[i]
		} else {
			mcp = &routes[i]
		}
	}
	modelKey, err := credential(model, o.ModelKeyFile, "options.modelKeyFile", "--model-key-file", "the provider key")
	if err != nil {
		return nil, err
	}
	mcpToken, err := credential(mcp, o.MCPTokenFile, "options.mcpTokenFile", "--mcp-token-file", "the daemon's MCP bearer")
	if err != nil {
		return nil, err
	}
	dial := o.Dial
	if dial == nil {
		dial = sandboxnet.SafeDialer(o.Resolve)
		if model != nil {
			// As the launcher checks the provider's name at launch: one
			// that cannot be reached safely refuses the start, not the
			// agent's first turn.
			u, err := url.Parse(model.Upstream)
			if err != nil {
				return nil, refuse(diag.GatewayBundle, "egress.routes.model.upstream", "the model route's upstream is not a URL")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = sandboxnet.CheckSafeHost(ctx, o.Resolve, u.Hostname())
			cancel()
			if err != nil {
				return nil, &Error{Code: diag.GatewayResolve, Path: "egress.routes.model.upstream", Err: fmt.Errorf("route model: the provider host: %w", err)}
			}
		}
	}
	// Every proxy is built, then every port taken, and only then does any
	// route serve: a refusal at any step leaves nothing answering.
	g := &Gateway{}
	for _, r := range routes {
		var p *routeproxy.Proxy
		var err error
		if isModel(r) {
			p, err = routeproxy.NewModel(r, routeproxy.ModelOptions{Key: modelKey.Source(), Dial: dial, Roots: o.ModelRoots})
		} else {
			p, err = routeproxy.New(r, routeproxy.Limits{}, mcpToken)
		}
		if err != nil {
			g.Close()
			return nil, &Error{Code: diag.GatewayBundle, Path: "egress.routes." + r.Purpose, Err: err}
		}
		g.Routes = append(g.Routes, Route{Route: r, Addr: netip.AddrPortFrom(o.Listen, uint16(r.Port)), Proxy: p})
	}
	lns := make([]net.Listener, 0, len(g.Routes))
	for _, r := range g.Routes {
		ln, err := net.Listen("tcp", r.Addr.String())
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			g.Close()
			return nil, &Error{Code: diag.GatewayListen, Path: "egress.routes." + r.Route.Purpose + ".port", Err: fmt.Errorf("route %s: listening on %s: %w", r.Route.Purpose, r.Addr, err)}
		}
		lns = append(lns, ln)
	}
	for i, r := range g.Routes {
		r.Proxy.Serve(lns[i])
	}
	return g, nil
}

// planRoutes reads the bundle once, refuses it unless ocicheck finds
// nothing, and returns its routes, each one the gateway can serve.
func planRoutes(dir string) ([]bundle.Route, error) {
	plan, err := launchplan.Load(dir)
	if err != nil {
		return nil, &Error{Code: diag.GatewayBundle, Path: "bundle", Err: fmt.Errorf("reading the bundle: %w", err)}
	}
	if !plan.Verdict.OK() {
		var checks []string
		for _, f := range plan.Verdict.Findings {
			checks = append(checks, f.Check+": "+f.Detail)
		}
		return nil, refuse(diag.GatewayBundle, "bundle", "the bundle fails verification: %s", strings.Join(checks, "; "))
	}
	if len(plan.Routes) == 0 {
		return nil, refuse(diag.GatewayBundle, "egress.routes", "the bundle has no private route to serve (network mode %q)", plan.Network)
	}
	seen := map[string]bool{}
	for i, r := range plan.Routes {
		path := "egress.routes[" + strconv.Itoa(i) + "]"
		switch {
		case r.Listen != "gateway":
			return nil, refuse(diag.GatewayBundle, path, "route %s listens on %q; the gateway serves routes on the sandbox's gateway only", r.Purpose, r.Listen)
		case isModel(r) && r.LoginFile != "":
			// A login route reads and refreshes the deployment's auth.json
			// on the launcher's host; the gateway has no such file.
			return nil, refuse(diag.GatewayBundle, path, "route %s brokers a subscription login (its auth.json lives on the launcher's host); the gateway serves api-key model routes", r.Purpose)
		case seen[kind(r)]:
			return nil, refuse(diag.GatewayBundle, path, "a second %s route; a bundle has one of each", kind(r))
		}
		seen[kind(r)] = true
	}
	return plan.Routes, nil
}

func kind(r bundle.Route) string {
	if isModel(r) {
		return "model"
	}
	return "mcp"
}

// credential reads a route's credential file into a holder: required
// when the route exists, refused when it does not (a key handed to a
// gateway that serves no route for it is an operator's mistake, and a
// key in a place nothing needs it).
func credential(r *bundle.Route, file, path, flag, what string) (*routeproxy.Token, error) {
	switch {
	case r == nil && file == "":
		return nil, nil
	case r == nil:
		return nil, refuse(diag.GatewaySecret, path, "%s given, but the bundle has no route that uses %s", flag, what)
	case file == "":
		return nil, refuse(diag.GatewaySecret, path, "route %s needs %s: give %s", r.Purpose, what, flag)
	}
	v, err := readSecretFile(file)
	if err != nil {
		return nil, &Error{Code: diag.GatewaySecret, Path: path, Err: fmt.Errorf("route %s: %s (%s): %w", r.Purpose, what, flag, err)}
	}
	defer clear(v)
	tok := &routeproxy.Token{}
	if err := tok.Set(v); err != nil {
		return nil, &Error{Code: diag.GatewaySecret, Path: path, Err: fmt.Errorf("route %s: %s (%s): %w", r.Purpose, what, flag, err)}
	}
	return tok, nil
}

// Close stops every route; each proxy is closed whatever the others
// return, and every failure is returned.
func (g *Gateway) Close() error {
	var errs []error
	for i := len(g.Routes) - 1; i >= 0; i-- {
		if err := g.Routes[i].Proxy.Close(); err != nil {
			errs = append(errs, fmt.Errorf("route %s: %w", g.Routes[i].Route.Purpose, err))
		}
	}
	g.Routes = nil
	return errors.Join(errs...)
}
