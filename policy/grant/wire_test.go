package grant

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/diag"
)

const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// every holds one grant of every Go type, as the compiler makes them.
func every() List {
	p := func(r string) Provenance { return Provenance{Reason: r, Fact: "profile.test"} }
	return List{
		Rootfs{Path: "/rootfs", ReadOnly: true, Version: "v1", Digest: digest, Provenance: p("root")},
		Mount{Destination: "/opt", Type: "erofs", Source: "/img/opt.erofs", Options: []string{"ro", "nosuid"}, Digest: digest, Provenance: p("erofs")},
		Mount{Destination: "/w", Type: "bind", Source: "/h/w", Options: []string{"bind", "rw"}, Provenance: p("bind")},
		Argv{Words: []string{"pi", "--mode", "a > b & c"}, Provenance: p("argv")},
		Cwd{Dir: "/w", Provenance: p("cwd")},
		NoNewPrivileges{On: true, Provenance: p("nnp")},
		Terminal{Provenance: p("tty")},
		Capabilities{Provenance: p("caps")},
		Identity{Field: "uid", ID: 1000, Provenance: p("uid")},
		Identity{Field: "gid", ID: 1001, Provenance: p("gid")},
		Env{Name: "HOME", Value: "/home/sandbox", Provenance: p("env")},
		Hostname{Name: "paseo-sandbox", Provenance: p("uts")},
		Namespace{Type: "pid", Provenance: p("ns")},
		Rlimit{Type: "RLIMIT_CORE", Max: 0, Provenance: p("core")},
		Rlimit{Type: "RLIMIT_NOFILE", Max: 1 << 63, Provenance: p("nofile")},
		CgroupMax{Resource: "memory", Max: 2 << 30, Provenance: p("mem")},
		CgroupMax{Resource: "pids", Max: 512, Provenance: p("pids")},
		CPUQuota{CPUs: 1.5, Provenance: p("cpu")},
		OutputLimit{Bytes: 16 << 20, Provenance: p("out")},
		WallLimit{Wall: 4 * time.Hour, Provenance: p("wall")},
		NetworkMode{Mode: "sandbox", Provenance: p("net")},
		DirectFS{Provenance: p("directfs")},
		FSMonitor{On: true, Port: 18090, Path: "/w", Provenance: p("fsmonitor")},
		Search{On: true, Port: 18091, Path: "/w", Provenance: p("search")},
		Egress{Host: "llm.example.test", Proto: "tcp", Port: 443, Purpose: "model", Provenance: p("egress")},
		Route{Purpose: "mcp", Proto: "tcp", Port: 6767, Method: "POST", Path: "/mcp/agents", Upstream: "http://127.0.0.1:6767/mcp/agents",
			CallerAgentID: "a", TokenRef: "paseo/mcp", Methods: []string{"tools/list"}, Tools: []string{"list_agents"}, Provenance: p("route")},
		Route{Purpose: "model", Proto: "tcp", Port: 18080, Path: "/v1", Upstream: "https://llm.example.test/v1", TokenRef: "alice/k",
			API: "anthropic-messages", Credential: "x-api-key", Requests: []string{"POST /v1/messages"}, Model: "claude-x",
			Headers: []string{"anthropic-version: 2023-06-01"}, HostedTools: []string{"web_search"}, Provenance: p("model")},
	}
}

func TestListRoundTrip(t *testing.T) {
	want := every()
	data, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	var got List
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	again, err := json.Marshal(got)
	if err != nil || string(again) != string(data) {
		t.Errorf("second encoding differs: %v", err)
	}
}

// Every kind's Apply applies to an empty spec, creating what it needs.
func TestApplyToEmptySpec(t *testing.T) {
	for _, g := range every() {
		s := &specs.Spec{}
		if err := g.Apply(s); err != nil {
			t.Errorf("%s: %v", g.Key(), err)
		}
		// The kinds the spec does not carry leave it alone; every other
		// one sets its part.
		var outside bool
		switch g.(type) {
		case OutputLimit, WallLimit, NetworkMode, DirectFS, FSMonitor, Search, Egress, Route:
			outside = true
		}
		if unchanged := reflect.DeepEqual(s, &specs.Spec{}); unchanged != outside {
			t.Errorf("%s: Apply left the empty spec unchanged: %v, want %v", g.Key(), unchanged, outside)
		}
		if err := g.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", g.Key(), err)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	const why = `"reason":"r","fact":"f"`
	cases := []struct {
		name, elem string
		code       diag.Code
	}{
		{"unknown kind", `{"kind":"sysctl","subject":"net.ipv4.ip_forward","access":"set","value":"1",` + why + `}`, diag.GrantUnknownKind},
		{"unknown process field", `{"kind":"process","subject":"oomScoreAdj","access":"set","value":0,` + why + `}`, diag.GrantUnknownKind},
		{"unknown runtime flag", `{"kind":"runtime","subject":"host-uds","access":"set","value":true,` + why + `}`, diag.GrantUnknownKind},
		{"unknown limit", `{"kind":"limit","subject":"cpuSeconds","access":"max","value":1,` + why + `}`, diag.GrantUnknownKind},
		{"unknown field", `{"kind":"env","subject":"A","access":"set","value":"b","colour":"red",` + why + `}`, diag.GrantInvalid},
		{"field of another kind", `{"kind":"env","subject":"A","access":"set","value":"b","port":80,` + why + `}`, diag.GrantInvalid},
		{"limit as a string", `{"kind":"limit","subject":"wallSeconds","access":"max","value":"60",` + why + `}`, diag.GrantInvalid},
		{"limit as a fraction", `{"kind":"limit","subject":"outputBytes","access":"max","value":1.5,` + why + `}`, diag.GrantInvalid},
		{"non-canonical number", `{"kind":"rlimit","subject":"RLIMIT_NOFILE","access":"max","value":1e3,` + why + `}`, diag.GrantInvalid},
		{"negative rlimit", `{"kind":"rlimit","subject":"RLIMIT_NOFILE","access":"max","value":-1,` + why + `}`, diag.GrantInvalid},
		{"access disagrees", `{"kind":"mount","subject":"/w","access":"ro","type":"bind","source":"/h","options":["bind","rw"],` + why + `}`, diag.GrantInvalid},
		{"root uid", `{"kind":"identity","subject":"uid","access":"set","value":0,` + why + `}`, diag.GrantInvalid},
		{"uid out of range", `{"kind":"identity","subject":"uid","access":"set","value":4294967296,` + why + `}`, diag.GrantInvalid},
		{"writable rootfs", `{"kind":"rootfs","subject":"/","access":"rw","source":"/r","readonly":false,"version":"v","digest":"` + digest + `",` + why + `}`, diag.GrantInvalid},
		{"directfs on", `{"kind":"runtime","subject":"directfs","access":"set","value":true,` + why + `}`, diag.GrantInvalid},
		{"network host", `{"kind":"runtime","subject":"network","access":"set","value":"host",` + why + `}`, diag.GrantInvalid},
		{"erofs without digest", `{"kind":"mount","subject":"/opt","access":"ro","type":"erofs","source":"/f","options":["ro"],` + why + `}`, diag.GrantInvalid},
		{"egress port 0", `{"kind":"egress","subject":"h.test","access":"allow","proto":"tcp","purpose":"model",` + why + `}`, diag.GrantInvalid},
		{"capabilities granted", `{"kind":"process","subject":"capabilities","access":"set","value":"CAP_SYS_ADMIN",` + why + `}`, diag.GrantInvalid},
		{"fsmonitor of another tree", `{"kind":"fsmonitor","subject":"home","access":"allow","value":true,"port":18090,"path":"/w",` + why + `}`, diag.GrantUnknownKind},
		{"fsmonitor off with a port", `{"kind":"fsmonitor","subject":"workspace","access":"set","value":false,"port":18090,` + why + `}`, diag.GrantInvalid},
		{"fsmonitor on without a port", `{"kind":"fsmonitor","subject":"workspace","access":"allow","value":true,"path":"/w",` + why + `}`, diag.GrantInvalid},
		{"fsmonitor on, access set", `{"kind":"fsmonitor","subject":"workspace","access":"set","value":true,"port":18090,"path":"/w",` + why + `}`, diag.GrantInvalid},
		{"fsmonitor relative path", `{"kind":"fsmonitor","subject":"workspace","access":"allow","value":true,"port":18090,"path":"w",` + why + `}`, diag.GrantInvalid},
		{"not an object", `"env"`, diag.GrantInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l List
			err := json.Unmarshal([]byte("["+tc.elem+"]"), &l)
			var de *Error
			if !errors.As(err, &de) || de.Code != tc.code {
				t.Fatalf("got %v, want %s", err, tc.code)
			}
			if !strings.HasPrefix(err.Error(), string(tc.code)) {
				t.Errorf("error %q does not lead with its code", err)
			}
		})
	}
}

// FuzzDecodeList: whatever the decoder accepts it encodes back to an
// equal list, and every grant it returns passes Validate.
func FuzzDecodeList(f *testing.F) {
	data, err := json.Marshal(every())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	for _, g := range every() {
		one, _ := json.Marshal(List{g})
		f.Add(one)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var l List
		if json.Unmarshal(data, &l) != nil {
			return
		}
		for _, g := range l {
			if err := g.Validate(); err != nil {
				t.Fatalf("decoded %s fails Validate: %v", g.Key(), err)
			}
		}
		out, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		var back List
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if diff := cmp.Diff(l, back); diff != "" {
			t.Fatalf("re-decode differs:\n%s", diff)
		}
	})
}
