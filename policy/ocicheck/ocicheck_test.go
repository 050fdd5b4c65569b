package ocicheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// specSchemaDir finds the JSON schema that ships in the runtime-spec module
// this build uses.
func specSchemaDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/opencontainers/runtime-spec").Output()
	if err != nil {
		t.Fatalf("locating the runtime-spec module (needs the go tool and the module cache): %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "schema")
	if _, err := os.Stat(filepath.Join(dir, "config-schema.json")); err != nil {
		t.Fatalf("runtime-spec schema missing: %v", err)
	}
	return dir
}

// Every compiled golden bundle (testdata/*/golden/) passes the runtime-tools checks, the
// runtime-spec JSON schema and the project's invariants.
func TestGoldenBundlesValidate(t *testing.T) {
	schema := specSchemaDir(t)
	configs, err := filepath.Glob(filepath.Join("..", "..", "testdata", "*", "golden", bundle.ConfigFile))
	if err != nil || len(configs) == 0 {
		t.Fatalf("no golden bundles found (%v)", err)
	}
	for _, c := range configs {
		dir := filepath.Dir(c)
		t.Run(filepath.Base(filepath.Dir(dir)), func(t *testing.T) {
			r, err := Dir(dir, Options{SchemaDir: schema})
			if err != nil {
				t.Fatal(err)
			}
			if !r.OK() {
				t.Errorf("findings: %+v", r.Findings)
			}
			if len(r.Ran) < 15 {
				t.Errorf("only %d checks ran: %v", len(r.Ran), r.Ran)
			}
		})
	}
}

// Each invariant and the schema catch a broken bundle.
func TestBrokenBundlesAreRefused(t *testing.T) {
	schema := specSchemaDir(t)
	src := filepath.Join("..", "..", "testdata", "host-pi-session-api-key", "golden")
	cases := map[string]struct {
		from, to string
		check    string
	}{
		"hook":        {`"root": {`, `"hooks": {"prestart": [{"path": "/bin/sh"}]}, "root": {`, "invariant/no-hooks"},
		"uid0":        {`"uid": 1000`, `"uid": 0`, "invariant/unprivileged"},
		"rw-root":     {`"readonly": true`, `"readonly": false`, "invariant/readonly-root"},
		"cap":         {`"capabilities": {}`, `"capabilities": {"bounding": ["CAP_SYS_ADMIN"]}`, "invariant/unprivileged"},
		"netns-join":  {`"type": "network"`, `"type": "network", "path": "/proc/1/ns/net"`, "invariant/namespaces"},
		"rbind":       {`"bind",`, `"rbind",`, "invariant/mounts"},
		"bad-type":    {`"ociVersion": "1.3.0"`, `"ociVersion": 13`, "decode"},
		"schema-type": {`"type": "RLIMIT_CORE"`, `"type": "core"`, "json-schema"},
		"annotation":  {`"hostname":`, `"annotations": {"dev.gvisor.spec.mount.x.share": "shared"}, "hostname":`, "invariant/no-gvisor-annotations"},
		"placeholder": {`"--mode",`, `"--mode", "@@paseo-secret:alice/fake-llm@@",`, "secret-placeholders"},
		"erofs-rw":    {`"mounts": [`, `"mounts": [{"destination": "/opt", "type": "erofs", "source": "/srv/opt.erofs", "options": ["rw", "nosuid", "nodev"]}, `, "invariant/mounts"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			files, err := bundle.Read(src)
			if err != nil {
				t.Fatal(err)
			}
			cfg := string(files[bundle.ConfigFile])
			if !strings.Contains(cfg, tc.from) {
				t.Fatalf("golden config lacks %q", tc.from)
			}
			files[bundle.ConfigFile] = []byte(strings.Replace(cfg, tc.from, tc.to, 1))
			r := Files(files, src, Options{SchemaDir: schema})
			found := false
			for _, f := range r.Findings {
				if f.Check == tc.check {
					found = true
				}
				if f.Check == "digests" {
					continue // tampering always breaks the digest too
				}
			}
			if !found {
				t.Errorf("check %s did not fire; findings: %+v", tc.check, r.Findings)
			}
			if r.Findings[0].Check != "digests" {
				t.Errorf("a modified config.json must fail the digest check first; got %+v", r.Findings[0])
			}
		})
	}
}

// A model route whose upstream the compiler would have refused (an unsafe
// host, plain http) is a finding too.
func TestUnsafeModelRouteRefused(t *testing.T) {
	for _, up := range []string{"https://169.254.169.254/v1", "https://localhost:8443/v1", "http://llm.example.test:8443/v1"} {
		t.Run(up, func(t *testing.T) {
			wantEgressFinding(t, "host-pi-session-api-key", `"upstream": "https://llm.example.test:8443/v1"`, `"upstream": "`+up+`"`)
		})
	}
}

// A login route's token endpoint is dialled from the host with the
// refresh token: an unsafe or plain-HTTP one is a finding (the golden
// case as compiled is not).
func TestUnsafeLoginRefreshRefused(t *testing.T) {
	for _, up := range []string{"https://169.254.169.254/v1/oauth/token", "https://localhost:8443/oauth/token", "http://platform.claude.com/v1/oauth/token"} {
		t.Run(up, func(t *testing.T) {
			wantEgressFinding(t, "host-pi-session-anthropic-login", `"loginRefresh": "https://platform.claude.com/v1/oauth/token"`, `"loginRefresh": "`+up+`"`)
		})
	}
}

// An egress rule the compiler would have refused is a finding, in every
// notation the classifier knows.
func TestUnsafeEgressRefused(t *testing.T) {
	for _, host := range []string{"169.254.169.254", "metadata.google.internal", "0x7f.1", "2130706433", "::ffff:127.0.0.1", "localhost"} {
		t.Run(host, func(t *testing.T) {
			wantEgressFinding(t, "host-pi-session-no-credential", `"host": "llm.example.test"`, `"host": "`+host+`"`)
		})
	}
}

// wantEgressFinding edits the golden case's egress.json (from becomes to,
// once; it fails if from is not there) and wants egress-destinations to
// fire on it.
func wantEgressFinding(t *testing.T, goldenCase, from, to string) {
	t.Helper()
	src := filepath.Join("..", "..", "testdata", goldenCase, "golden")
	files, err := bundle.Read(src)
	if err != nil {
		t.Fatal(err)
	}
	eg := string(files[bundle.EgressFile])
	files[bundle.EgressFile] = []byte(strings.Replace(eg, from, to, 1))
	if string(files[bundle.EgressFile]) == eg {
		t.Fatalf("golden egress.json of %s lacks %s", goldenCase, from)
	}
	r := Files(files, src, Options{})
	found := false
	for _, f := range r.Findings {
		found = found || f.Check == "egress-destinations"
	}
	if !found {
		t.Errorf("egress-destinations did not fire; findings: %+v", r.Findings)
	}
}

// A granted workspace monitor that the bundle could not serve as granted
// is a finding: a hook for another port or tree, no sandbox network, a
// hook bound writable, a route on the monitor's port, a vouched index's
// file not compiled empty or not bound read-only at its path. The golden bundle
// itself passes (TestGoldenBundlesValidate).
func TestFSMonitorServedAsGranted(t *testing.T) {
	src := filepath.Join("..", "..", "testdata", "host-pi-session-api-key", "golden")
	cases := map[string]struct {
		file, from, to string
	}{
		"hook for another port":    {bundle.FSMonitorHookFile, "2, 18090, $ip", "2, 18091, $ip"},
		"hook for another tree":    {bundle.FSMonitorHookFile, "stat('/srv/paseo/workspace/proj-feature')", "stat('/')"},
		"no gateway":               {bundle.EgressFile, `"mode": "sandbox"`, `"mode": "none"`},
		"route on its port":        {bundle.EgressFile, `"port": 18080`, `"port": 18090`},
		"index not compiled empty": {bundle.FSMonitorIndexFile, "", "DIRC"},
		"index bound elsewhere":    {bundle.ConfigFile, `"destination": "/run/paseo/fsmonitor/index"`, `"destination": "/run/paseo/fsmonitor/other"`},
		"index bound writable": {bundle.ConfigFile, `"source": "files/fsmonitor-index",
      "options": [
        "bind",
        "ro",`, `"source": "files/fsmonitor-index",
      "options": [
        "bind",
        "rw",`},
		"hook bound writable": {bundle.ConfigFile, `"source": "files/fsmonitor-hook",
      "options": [
        "bind",
        "ro",`, `"source": "files/fsmonitor-hook",
      "options": [
        "bind",
        "rw",`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			files, err := bundle.Read(src)
			if err != nil {
				t.Fatal(err)
			}
			if r := Files(files, src, Options{}); len(r.Failed(CheckFSMonitor)) > 0 {
				t.Fatalf("the golden bundle fails: %+v", r.Failed(CheckFSMonitor))
			}
			data := string(files[tc.file])
			if !strings.Contains(data, tc.from) {
				t.Fatalf("golden %s lacks %q", tc.file, tc.from)
			}
			files[tc.file] = []byte(strings.Replace(data, tc.from, tc.to, 1))
			if r := Files(files, src, Options{}); len(r.Failed(CheckFSMonitor)) == 0 {
				t.Errorf("check %s did not fire; findings: %+v", CheckFSMonitor, r.Findings)
			}
		})
	}
}

// A granted native search that the bundle could not serve as granted is a
// finding: a client for another port or workspace, no sandbox network, a
// client bound writable or not at all (under any of its names), PATH not starting with its
// directory, a route or the monitor on its port. The golden bundle itself
// passes (TestGoldenBundlesValidate).
func TestSearchServedAsGranted(t *testing.T) {
	src := filepath.Join("..", "..", "testdata", "host-search-native", "golden")
	cases := map[string]struct {
		file, from, to string
	}{
		"client for another port":      {bundle.SearchClientFile, "2, 18091, $ip", "2, 18092, $ip"},
		"client for another workspace": {bundle.SearchClientFile, "my $ws = '/srv/paseo/workspace/proj-feature';", "my $ws = '/';"},
		"client altered":               {bundle.SearchClientFile, "#!/usr/bin/perl", "#!/bin/sh"},
		"no gateway":                   {bundle.EgressFile, `"mode": "sandbox"`, `"mode": "none"`},
		"route on its port":            {bundle.EgressFile, `"port": 18080`, `"port": 18091`},
		"PATH without the client":      {bundle.ConfigFile, `"PATH=/run/paseo/search:`, `"PATH=`},
		"a PATH before the client's":   {bundle.ConfigFile, `"PATH=/run/paseo/search:`, `"PATH=/usr/bin", "PATH=/run/paseo/search:`},
		"PATH with the client last":    {bundle.ConfigFile, `"PATH=/run/paseo/search:/usr/local/bin:/usr/bin:/bin"`, `"PATH=/usr/local/bin:/usr/bin:/bin:/run/paseo/search"`},
		"client not bound":             {bundle.ConfigFile, `"destination": "/run/paseo/search/rg"`, `"destination": "/run/paseo/elsewhere/rg"`},
		"client not bound as fd":       {bundle.ConfigFile, `"destination": "/run/paseo/search/fd"`, `"destination": "/run/paseo/elsewhere/fd"`},
		"client not bound as find":     {bundle.ConfigFile, `"destination": "/run/paseo/search/find"`, `"destination": "/run/paseo/elsewhere/find"`},
		"client falls back elsewhere":  {bundle.SearchClientFile, "'find', '/usr/bin/find'", "'find', '/tmp/find'"},
		"spool not bound":              {bundle.ConfigFile, `"destination": "/run/paseo/search-spool"`, `"destination": "/run/paseo/elsewhere"`},
		"spool not empty":              {bundle.SearchSpoolFile, ``, `an answer planted at compile time`},
		"spool bound writable": {bundle.ConfigFile, `"source": "files/search-spool",
      "options": [
        "bind",
        "ro",`, `"source": "files/search-spool",
      "options": [
        "bind",
        "rw",`},
		"client bound writable": {bundle.ConfigFile, `"source": "files/search-client",
      "options": [
        "bind",
        "ro",`, `"source": "files/search-client",
      "options": [
        "bind",
        "rw",`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			files, err := bundle.Read(src)
			if err != nil {
				t.Fatal(err)
			}
			if r := Files(files, src, Options{}); len(r.Failed(CheckSearch)) > 0 {
				t.Fatalf("the golden bundle fails: %+v", r.Failed(CheckSearch))
			}
			data := string(files[tc.file])
			if !strings.Contains(data, tc.from) {
				t.Fatalf("golden %s lacks %q", tc.file, tc.from)
			}
			files[tc.file] = []byte(strings.Replace(data, tc.from, tc.to, 1))
			if r := Files(files, src, Options{}); len(r.Failed(CheckSearch)) == 0 {
				t.Errorf("check %s did not fire; findings: %+v", CheckSearch, r.Findings)
			}
		})
	}
}

// The monitor's port is the search's as much as a route's: a search
// granted on it is a finding.
func TestSearchNotOnTheMonitorsPort(t *testing.T) {
	src := filepath.Join("..", "..", "testdata", "host-search-native", "golden")
	files, err := bundle.Read(src)
	if err != nil {
		t.Fatal(err)
	}
	m := string(files[bundle.ManifestFile])
	if !strings.Contains(m, `"port": 18091`) {
		t.Fatal("golden manifest lacks the search's port 18091")
	}
	files[bundle.ManifestFile] = []byte(strings.Replace(m, `"port": 18091`, `"port": 18090`, 1))
	files[bundle.SearchClientFile] = []byte(strings.Replace(string(files[bundle.SearchClientFile]), "2, 18091, $ip", "2, 18090, $ip", 1))
	r := Files(files, src, Options{})
	if f := r.Failed(CheckSearch); len(f) != 1 || !strings.Contains(f[0].Detail, "the workspace monitor's") {
		t.Errorf("check %s: %+v; all findings: %+v", CheckSearch, f, r.Findings)
	}
}

// Importing and running the validator leaves logrus's standard logger as
// the program set it: its init once lowered the level for every program
// that imported it.
func TestLeavesLogLevel(t *testing.T) {
	if got := logrus.GetLevel(); got != logrus.InfoLevel {
		t.Fatalf("logrus level %s before any check, want logrus's default %s: an import changed it", got, logrus.InfoLevel)
	}
	if _, err := Dir(filepath.Join("..", "..", "testdata", "host-pi-session-api-key", "golden"), Options{}); err != nil {
		t.Fatal(err)
	}
	if got := logrus.GetLevel(); got != logrus.InfoLevel {
		t.Fatalf("logrus level %s after a check, want %s", got, logrus.InfoLevel)
	}
}

// A bundle names its gateway in egress.json exactly when it serves a
// route or the workspace monitor there, by the name the generated files
// address it by. One that serves a route and names none (a bundle from
// before the gateway was typed, whose name was a comment in files/hosts),
// names another, or names one where nothing is served is a finding; the
// golden bundles themselves pass.
func TestGatewayNamedAsServed(t *testing.T) {
	const gw = "  \"gateway\": {\n    \"name\": \"paseo-gateway\"\n  },\n"
	cases := map[string]struct{ golden, from, to string }{
		"serves a route, names none":      {"host-pi-session-api-key", gw, ""},
		"another name":                    {"host-pi-session-api-key", `"name": "paseo-gateway"`, `"name": "llm.example.test"`},
		"serves nothing, names a gateway": {"host-network-none", `  "routes": []`, gw + `  "routes": []`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join("..", "..", "testdata", tc.golden, "golden")
			files, err := bundle.Read(src)
			if err != nil {
				t.Fatal(err)
			}
			if r := Files(files, src, Options{}); len(r.Failed(CheckGateway)) > 0 {
				t.Fatalf("the golden bundle fails: %+v", r.Failed(CheckGateway))
			}
			data := string(files[bundle.EgressFile])
			if !strings.Contains(data, tc.from) {
				t.Fatalf("golden %s of %s lacks %q", bundle.EgressFile, tc.golden, tc.from)
			}
			files[bundle.EgressFile] = []byte(strings.Replace(data, tc.from, tc.to, 1))
			if r := Files(files, src, Options{}); len(r.Failed(CheckGateway)) == 0 {
				t.Errorf("check %s did not fire; findings: %+v", CheckGateway, r.Findings)
			}
		})
	}
}

// The launcher finds the auth.json bind it locks by the mount grant's
// authFile: a read-write auth.json bind without it (a bundle from before
// the field, which the launcher would run without the lock) is a finding,
// and so are two. The golden oauth-file bundle passes.
func TestAuthFileBindTyped(t *testing.T) {
	src := filepath.Join("..", "..", "testdata", "host-pi-session-oauth", "golden")
	files, err := bundle.Read(src)
	if err != nil {
		t.Fatal(err)
	}
	if r := Files(files, src, Options{}); len(r.Failed(CheckAuthFile)) > 0 {
		t.Fatalf("the golden bundle fails: %+v", r.Failed(CheckAuthFile))
	}
	m, err := files.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	at := slices.IndexFunc(m.Grants, func(g grant.Grant) bool { mt, ok := g.(grant.Mount); return ok && mt.AuthFile })
	if at < 0 {
		t.Fatal("the golden oauth-file bundle has no auth.json bind")
	}
	untyped, twice := *m, *m
	mt := m.Grants[at].(grant.Mount)
	mt.AuthFile = false
	untyped.Grants = slices.Clone(m.Grants)
	untyped.Grants[at] = mt
	other := m.Grants[at].(grant.Mount)
	other.Destination, other.Source = "/x/auth.json", "/h/x/auth.json"
	twice.Grants = append(slices.Clone(m.Grants), other)
	for name, mf := range map[string]*bundle.Manifest{"untyped": &untyped, "two": &twice} {
		t.Run(name, func(t *testing.T) {
			d := Decode(files)
			d.Manifest = mf
			r := Check(d, src, Options{})
			if len(r.Failed(CheckAuthFile)) == 0 {
				t.Errorf("check %s did not fire; findings: %+v", CheckAuthFile, r.Findings)
			}
		})
	}
}
