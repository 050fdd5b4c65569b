package kubernetes

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

var gwOpts = func() Options {
	o := opts
	o.GatewayImage = "paseo.test/paseo-policy@sha256:" + string(bytes.Repeat([]byte("b"), 64))
	o.GatewaySecret = "gw-credentials"
	return o
}()

func mcpRoute(upstream string) grant.Route {
	return grant.Route{Purpose: grant.RouteMCP, Proto: "tcp", Port: 6767, Method: "POST", Path: "/mcp/agents", Upstream: upstream, Provenance: why("mcp.agentsURL")}
}

func modelRoute(login bool) grant.Route {
	if login {
		return grant.Route{Purpose: grant.RouteModel, Proto: "tcp", Port: 18080, Path: "/backend-api", Upstream: "https://chatgpt.com:443/backend-api",
			API: "openai-codex-responses", Credential: "oauth-bearer", Requests: []string{"POST /codex/responses"}, Model: "m",
			LoginFile: "/srv/auth.json", LoginEntry: "openai-codex", LoginRefresh: "https://auth.openai.com/oauth/token", Provenance: why("credential.authFile")}
	}
	return grant.Route{Purpose: grant.RouteModel, Proto: "tcp", Port: 18080, Path: "/v1", Upstream: "https://llm.example.test:8443/v1", TokenRef: "alice/key",
		API: "openai-completions", Credential: "authorization-bearer", Requests: []string{"POST /chat/completions"}, Model: "m", Provenance: why("model.baseURL")}
}

func gatewayBundle(t *testing.T, routes ...grant.Route) bundle.Files {
	t.Helper()
	eg, err := bundle.Marshal(&bundle.Egress{APIVersion: bundle.APIVersion, Kind: "Egress", Mode: "sandbox", Default: "deny",
		Rules: []bundle.EgressRule{}, Gateway: &bundle.Gateway{Name: bundle.GatewayName}, Routes: []bundle.Route{}})
	if err != nil {
		t.Fatal(err)
	}
	g := base()
	for _, r := range routes {
		g = append(g, r)
	}
	return bundleOf(t, g, nil, bundle.Files{bundle.EgressFile: eg})
}

// TestGatewayRefusals: the gateway's options, and the routes a gateway Pod
// cannot serve, are refused with PP-KUBE-RENDER and the option or fact,
// and nothing is rendered.
func TestGatewayRefusals(t *testing.T) {
	daemon := mcpRoute("http://198.51.100.20:6767/mcp/agents")
	with := func(f func(*Options)) Options { o := gwOpts; f(&o); return o }
	cases := []struct {
		name   string
		routes []grant.Route
		opt    Options
		facts  []string
	}{
		{"a Secret without the image", []grant.Route{daemon}, with(func(o *Options) { o.GatewayImage = "" }), []string{"options.gatewayImage"}},
		{"the image by tag", []grant.Route{daemon}, with(func(o *Options) { o.GatewayImage = "paseo.test/paseo-policy:latest" }), []string{"options.gatewayImage"}},
		{"the image without a Secret", []grant.Route{daemon}, with(func(o *Options) { o.GatewaySecret = "" }), []string{"options.gatewaySecret"}},
		{"a Secret name that is none", []grant.Route{daemon}, with(func(o *Options) { o.GatewaySecret = "Bad_Name" }), []string{"options.gatewaySecret"}},
		{"no route to serve", nil, gwOpts, []string{"options.gatewayImage"}},
		{"an MCP upstream on loopback", []grant.Route{mcpRoute("http://127.0.0.1:6767/mcp/agents")}, gwOpts, []string{"mcp.agentsURL"}},
		{"an MCP upstream on IPv6 loopback", []grant.Route{mcpRoute("http://[::1]:6767/mcp/agents")}, gwOpts, []string{"mcp.agentsURL"}},
		{"an MCP upstream at localhost", []grant.Route{mcpRoute("http://localhost:6767/mcp/agents")}, gwOpts, []string{"mcp.agentsURL"}},
		{"a subscription login", []grant.Route{daemon, modelRoute(true)}, gwOpts, []string{"credential.authFile"}},
		{"all at once", []grant.Route{mcpRoute("http://127.0.0.1:6767/mcp/agents"), modelRoute(true)}, with(func(o *Options) { o.GatewayImage = "x" }),
			[]string{"credential.authFile", "mcp.agentsURL", "options.gatewayImage"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Render(gatewayBundle(t, c.routes...), c.opt)
			var dl diag.List
			if !errors.As(err, &dl) || r != nil {
				t.Fatalf("want diagnostics and no rendering, got %v, %v", r, err)
			}
			var facts []string
			for _, d := range dl {
				if d.Code != diag.KubeRender {
					t.Errorf("code %s, want %s", d.Code, diag.KubeRender)
				}
				facts = append(facts, d.Path)
			}
			slices.Sort(facts)
			if diff := cmp.Diff(c.facts, facts); diff != "" {
				t.Errorf("facts (-want +got):\n%s", diff)
			}
		})
	}
	// The control: the same plans, with a daemon the gateway's Pod can
	// reach and an api-key model route, render the gateway; without the
	// gateway options the loopback daemon and the login render as before
	// (the gateway is then the operator's).
	r, err := Render(gatewayBundle(t, daemon, modelRoute(false)), gwOpts)
	if err != nil || r.Gateway == nil {
		t.Fatalf("the control did not render the gateway: %v", err)
	}
	r, err = Render(gatewayBundle(t, mcpRoute("http://127.0.0.1:6767/mcp/agents"), modelRoute(true)), opts)
	if err != nil || r.Gateway != nil {
		t.Fatalf("without the gateway options: %v, gateway %v", err, r.Gateway)
	}
}

// TestGatewayRendered: the gateway's objects for a plan with both routes:
// its args name each route's credential file, one port per route on the
// container and the Service (at the gateway address), the Secret by name
// with only the routes' keys, each bundle file by subPath, an address
// upstream as an IP block and a named one in the Cilium policy only; and
// every new field is traced.
func TestGatewayRendered(t *testing.T) {
	files := gatewayBundle(t, mcpRoute("http://198.51.100.20:6767/mcp/agents"), modelRoute(false))
	r, err := Render(files, gwOpts)
	if err != nil {
		t.Fatal(err)
	}
	g := r.Gateway
	ctr := g.Deployment.Spec.Template.Spec.Containers[0]
	if got, want := strings.Join(ctr.Args, " "), "gateway --listen 0.0.0.0 --mcp-token-file /run/paseo/mcp-token --model-key-file /run/paseo/model-key /bundle"; got != want {
		t.Errorf("args %q, want %q", got, want)
	}
	if g.Service.Spec.ClusterIP != gwOpts.GatewayIP || len(g.Service.Spec.Ports) != 2 || len(ctr.Ports) != 2 {
		t.Errorf("service %+v, container ports %+v", g.Service.Spec, ctr.Ports)
	}
	sec := g.Deployment.Spec.Template.Spec.Volumes[1].Secret
	if sec.SecretName != "gw-credentials" || *sec.DefaultMode != 0o440 || len(sec.Items) != 2 {
		t.Errorf("secret volume %+v", sec)
	}
	mounted := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		if m.SubPath == "" || !m.ReadOnly {
			t.Errorf("mount %+v not read-only by subPath", m)
		}
		mounted[m.MountPath] = m.SubPath
	}
	for name := range files {
		if name == bundle.PinsFile {
			if _, ok := mounted[GatewayBundleDir+"/"+name]; ok {
				t.Error("pins.json, the agent's node's state, is in the gateway's bundle")
			}
			continue
		}
		if key := mounted[GatewayBundleDir+"/"+name]; key == "" || g.Bundle.Data[key] != string(files[name]) {
			t.Errorf("bundle file %s not mounted from its own bytes (key %q)", name, key)
		}
	}
	if len(g.NetworkPolicy.Spec.Egress) != 1 || g.NetworkPolicy.Spec.Egress[0].To[0].IPBlock.CIDR != "198.51.100.20/32" {
		t.Errorf("gateway egress %+v", g.NetworkPolicy.Spec.Egress)
	}
	if g.Cilium == nil || g.Cilium.Spec.Egress[0].ToFQDNs[0].MatchName != "llm.example.test" || g.Cilium.Spec.Egress[0].ToPorts[0].Ports[0].Port != "8443" {
		t.Errorf("gateway cilium %+v", g.Cilium)
	}
	traced := map[string]bool{}
	for _, tr := range r.Trace {
		if g.Owns(tr.Object) {
			traced[tr.Object] = true
		}
	}
	if len(traced) != 5 {
		t.Errorf("traced gateway objects %v, want all five", traced)
	}
	for _, gp := range r.Gaps {
		if strings.HasPrefix(gp.Grant, "route") && strings.Contains(gp.StandIn, "does not deploy") {
			t.Errorf("gap still says the gateway is not deployed: %s", gp.StandIn)
		}
	}
	// The agent's policy reaches this agent's gateway only.
	for _, e := range r.NetworkPolicy.Spec.Egress {
		for _, to := range e.To {
			if to.PodSelector != nil && to.PodSelector.MatchLabels[LabelGatewayFor] != r.Pod.Name {
				t.Errorf("the agent's policy selects gateway pods %v", to.PodSelector.MatchLabels)
			}
		}
	}
}
