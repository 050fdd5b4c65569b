package kubernetes

import (
	"bytes"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

var opts = Options{Image: "paseo.test/pi@sha256:" + string(bytes.Repeat([]byte("a"), 64)), GatewayIP: "192.0.2.80"}

func why(fact string) grant.Provenance { return grant.Provenance{Reason: "test", Fact: fact} }

// bundleOf is a bundle of these grants, pins and files, as a compile
// would write it (manifest, and pins.json naming that manifest).
func bundleOf(t *testing.T, grants grant.List, pins []bundle.Pin, extra bundle.Files) bundle.Files {
	t.Helper()
	files := bundle.Files{}
	for k, v := range extra {
		files[k] = v
	}
	m := &bundle.Manifest{APIVersion: bundle.ManifestAPIVersion, Kind: bundle.ManifestKind, Profile: "pi-session", Deployment: "dep-1",
		Topology: "host", Agent: "Agent_1", Inputs: map[string]string{}, Outputs: map[string]string{}, Grants: grants}
	data, err := bundle.MarshalManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	files[bundle.ManifestFile] = data
	if pins == nil {
		pins = []bundle.Pin{}
	}
	if files[bundle.PinsFile], err = bundle.Marshal(&bundle.Pins{APIVersion: bundle.APIVersion, Kind: bundle.PinsKind, Manifest: bundle.Digest(data), Pins: pins}); err != nil {
		t.Fatal(err)
	}
	return files
}

func base() grant.List {
	return grant.List{
		grant.Rootfs{Path: "/img", ReadOnly: true, Version: "v1", Digest: "sha256:" + string(bytes.Repeat([]byte("0"), 64)), Provenance: why("registry.image")},
		grant.Identity{Field: "uid", ID: 1000, Provenance: why("registry.image.uid")},
		grant.Identity{Field: "gid", ID: 1000, Provenance: why("registry.image.gid")},
	}
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func TestNamesAreDNSLabels(t *testing.T) {
	for _, id := range []string{"Agent_1", "agent-1", "a:b.c", "x", "A" + string(bytes.Repeat([]byte("b"), 127))} {
		n := objectName(id)
		if len(n) > 63 || !dnsLabel.MatchString(n) {
			t.Errorf("objectName(%q) = %q is not a DNS label", id, n)
		}
	}
	if objectName("Agent_1") == objectName("agent-1") {
		t.Error("ids differing in case and punctuation share a name")
	}
}

// TestRefusals: what cannot be rendered faithfully is refused with
// PP-KUBE-RENDER and the fact (or option) that caused it, all at once.
func TestRefusals(t *testing.T) {
	route := grant.Route{Purpose: "mcp", Proto: "tcp", Port: 6767, Method: "POST", Path: "/mcp", Upstream: "http://127.0.0.1:6767/mcp", Provenance: why("mcp.agentsURL")}
	eg, err := bundle.Marshal(&bundle.Egress{APIVersion: bundle.APIVersion, Kind: "Egress", Mode: "sandbox", Default: "deny",
		Rules: []bundle.EgressRule{}, Gateway: &bundle.Gateway{Name: bundle.GatewayName}, Routes: []bundle.Route{}})
	if err != nil {
		t.Fatal(err)
	}
	// The gateway is named in egress.json; a hosts file's comment names none.
	gateway := bundle.Files{bundle.EgressFile: eg}
	hostsOnly := bundle.Files{bundle.HostsFile: []byte("# gateway: paseo-gateway\n")}
	cases := []struct {
		name   string
		grants grant.List
		files  bundle.Files
		opt    Options
		facts  []string
	}{
		{"image by tag", base(), nil, Options{Image: "paseo.test/pi:latest"}, []string{"options.image"}},
		{"route without gateway address", append(base(), route), gateway, Options{Image: opts.Image}, []string{"options.gatewayIP"}},
		{"route to a loopback gateway", append(base(), route), gateway, Options{Image: opts.Image, GatewayIP: "127.0.0.1"}, []string{"options.gatewayIP"}},
		{"route without a gateway name", append(base(), route), nil, opts, []string{"registry.network"}},
		{"gateway named only in the hosts file", append(base(), route), hostsOnly, opts, []string{"registry.network"}},
		{"bind without pin", append(base(), grant.Mount{Destination: "/ws", Type: "bind", Source: "/srv/ws", Options: []string{"bind", "rw"}, Provenance: why("workspace.cwd")}),
			nil, opts, []string{"workspace.cwd"}},
		{"writable bundle file", append(base(), grant.Mount{Destination: "/x/mcp.json", Type: "bind", Source: bundle.MCPConfigFile, Options: []string{"bind", "rw"}, Provenance: why("launch.mcpConfig")}),
			bundle.Files{bundle.MCPConfigFile: []byte("{}")}, opts, []string{"launch.mcpConfig"}},
		{"stray placeholder", append(base(), grant.Env{Name: "X", Value: "a" + bundle.SecretPlaceholder("r"), Provenance: why("profile.p.env.X")}),
			nil, opts, []string{"profile.p.env.X"}},
		{"legacy secret slot", append(base(), grant.Env{Name: "FAKE_LLM_KEY", Value: bundle.SecretPlaceholder("alice/fake-llm"), Provenance: why("credential.secretRef")}),
			nil, opts, []string{"credential.secretRef"}},
		{"tmpfs without size", append(base(), grant.Mount{Destination: "/t", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid"}, Provenance: why("profile.p.mounts[9]")}),
			nil, opts, []string{"profile.p.mounts[9]"}},
		{"unknown mount type", append(base(), grant.Mount{Destination: "/m", Type: "mqueue", Source: "mqueue", Provenance: why("profile.p.mounts[8]")}),
			nil, opts, []string{"profile.p.mounts[8]"}},
		{"all at once", append(base(), route, grant.Mount{Destination: "/t", Type: "tmpfs", Source: "tmpfs", Provenance: why("profile.p.mounts[9]")}),
			gateway, Options{Image: "x"}, []string{"options.image", "options.gatewayIP", "profile.p.mounts[9]"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Render(bundleOf(t, c.grants, nil, c.files), c.opt)
			var dl diag.List
			if !errors.As(err, &dl) {
				t.Fatalf("want diagnostics, got %v", err)
			}
			var facts []string
			for _, d := range dl {
				if d.Code != diag.KubeRender {
					t.Errorf("code %s, want %s", d.Code, diag.KubeRender)
				}
				facts = append(facts, d.Path)
			}
			slices.Sort(facts)
			slices.Sort(c.facts)
			if diff := cmp.Diff(c.facts, facts); diff != "" {
				t.Errorf("facts (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReadOnlyFlagsCarried: each mount's access is its volume mount's.
func TestReadOnlyFlagsCarried(t *testing.T) {
	g := append(base(),
		grant.Mount{Destination: "/ws", Type: "bind", Source: "/srv/ws", Options: []string{"bind", "rw", "nosuid"}, Provenance: why("workspace.cwd")},
		grant.Mount{Destination: "/ext.mjs", Type: "bind", Source: "/srv/ext.mjs", Options: []string{"bind", "ro"}, Provenance: why("launch.extension")},
		grant.Mount{Destination: "/home/sandbox", Type: "tmpfs", Source: "tmpfs", Options: []string{"size=16m"}, Provenance: why("registry.limits.tmpfsBytes")},
	)
	pins := []bundle.Pin{{Destination: "/ext.mjs", Source: "/srv/ext.mjs", Root: "/srv", Kind: "file"}, {Destination: "/ws", Source: "/srv/ws", Root: "/srv", Kind: "dir"}}
	r, err := Render(bundleOf(t, g, pins, nil), opts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, m := range r.Pod.Spec.Containers[0].VolumeMounts {
		got[m.MountPath] = m.ReadOnly
	}
	if diff := cmp.Diff(map[string]bool{"/ws": false, "/ext.mjs": true, "/home/sandbox": false}, got); diff != "" {
		t.Errorf("read-only flags (-want +got):\n%s", diff)
	}
	if s := r.Pod.Spec.Volumes[2].EmptyDir.SizeLimit.String(); s != "16Mi" {
		t.Errorf("tmpfs size limit %s, want 16Mi", s)
	}
}

// TestSearchNotServedInAPod: no launcher serves the native search in a
// Pod, so its client is not mounted (or put in the ConfigMap) and PATH is
// rendered without its directory: the Pod's rg is the image's. The grant
// and each of the client's mounts are listed as gaps.
func TestSearchNotServedInAPod(t *testing.T) {
	w := why("registry.deployments.d.search,profile.pi-session.nativeSearch")
	g := append(base(), grant.Search{On: true, Port: 18091, Path: "/ws", Provenance: w},
		grant.Env{Name: "PATH", Value: bundle.SearchDir + ":/usr/bin:/bin", Provenance: w})
	for _, n := range bundle.SearchClientNames {
		g = append(g, grant.Mount{Destination: bundle.SearchDir + "/" + n, Type: "bind", Source: bundle.SearchClientFile, Options: []string{"bind", "ro"}, Provenance: w})
	}
	r, err := Render(bundleOf(t, g, nil, bundle.Files{bundle.SearchClientFile: []byte("#!/usr/bin/perl\n")}), opts)
	if err != nil {
		t.Fatal(err)
	}
	path := "(none)"
	for _, e := range r.Pod.Spec.Containers[0].Env {
		if e.Name == "PATH" {
			path = e.Value
		}
	}
	if path != "/usr/bin:/bin" {
		t.Errorf("PATH in a Pod: %q, want it without %s", path, bundle.SearchDir)
	}
	for _, m := range r.Pod.Spec.Containers[0].VolumeMounts {
		if strings.HasPrefix(m.MountPath, bundle.SearchDir) {
			t.Errorf("the client is mounted: %+v", m)
		}
	}
	if r.ConfigMap != nil {
		if _, ok := r.ConfigMap.Data["search-client"]; ok {
			t.Error("the client is in the ConfigMap")
		}
	}
	gaps := 0
	for _, gp := range r.Gaps {
		if strings.HasPrefix(gp.Grant, "search") || strings.Contains(gp.Grant, bundle.SearchDir) {
			gaps++
		}
	}
	if want := 1 + len(bundle.SearchClientNames); gaps != want {
		t.Errorf("want the search grant and its %d client mounts listed as gaps, got %d: %+v", len(bundle.SearchClientNames), gaps, r.Gaps)
	}
}

// TestFSMonitorNotServedInAPod: no launcher serves the workspace monitor in
// a Pod, so its hook and its vouched index are not mounted (or put in the
// ConfigMap: the start script then seeds the worktree's own index) and its Git
// setting is core.fsmonitor=false, a full scan, rather than a hook that
// fails or waits on the gateway in every git command.
func TestFSMonitorNotServedInAPod(t *testing.T) {
	w := why("profile.pi-session.fsmonitor")
	g := append(base(),
		grant.Env{Name: "GIT_CONFIG_COUNT", Value: "1", Provenance: w},
		grant.Env{Name: "GIT_CONFIG_KEY_0", Value: "core.fsmonitor", Provenance: w},
		grant.Env{Name: "GIT_CONFIG_VALUE_0", Value: bundle.FSMonitorHookPath, Provenance: w},
		grant.Mount{Destination: bundle.FSMonitorHookPath, Type: "bind", Source: bundle.FSMonitorHookFile, Options: []string{"bind", "ro"}, Provenance: w},
		grant.Mount{Destination: bundle.FSMonitorIndexPath, Type: "bind", Source: bundle.FSMonitorIndexFile, Options: []string{"bind", "ro"}, Provenance: w},
		grant.FSMonitor{On: true, Port: 18090, Path: "/ws", Provenance: w},
	)
	r, err := Render(bundleOf(t, g, nil, bundle.Files{bundle.FSMonitorHookFile: []byte("#!/usr/bin/perl\n"), bundle.FSMonitorIndexFile: []byte{}}), opts)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range r.Pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env["GIT_CONFIG_KEY_0"] != "core.fsmonitor" || env["GIT_CONFIG_VALUE_0"] != "false" {
		t.Errorf("the monitor's Git setting in a Pod: %q=%q, want core.fsmonitor=false", env["GIT_CONFIG_KEY_0"], env["GIT_CONFIG_VALUE_0"])
	}
	for _, m := range r.Pod.Spec.Containers[0].VolumeMounts {
		if m.MountPath == bundle.FSMonitorHookPath || m.MountPath == bundle.FSMonitorIndexPath {
			t.Errorf("the hook or the vouched index is mounted: %+v", m)
		}
	}
	if r.ConfigMap != nil {
		for _, k := range []string{"fsmonitor-hook", "fsmonitor-index"} {
			if _, ok := r.ConfigMap.Data[k]; ok {
				t.Errorf("%s is in the ConfigMap", k)
			}
		}
	}
	gaps := 0
	for _, gp := range r.Gaps {
		if strings.HasPrefix(gp.Grant, "fsmonitor") || strings.Contains(gp.Grant, bundle.FSMonitorHookPath) || strings.Contains(gp.Grant, bundle.FSMonitorIndexPath) {
			gaps++
		}
	}
	if gaps != 3 {
		t.Errorf("want the monitor grant, its hook mount and its index mount listed as gaps, got %d: %+v", gaps, r.Gaps)
	}
}
