package grant

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDiffClassifies(t *testing.T) {
	ws := Mount{Destination: "/w", Source: "/h/w", Type: "bind", Options: []string{"bind", "ro"}, Provenance: Provenance{Reason: "r", Fact: "workspace.cwd"}}
	wsRW := ws
	wsRW.Options = []string{"bind", "rw"}
	mem := CgroupMax{Resource: "memory", Max: 100}
	memMore := mem
	memMore.Max = 200
	net := Namespace{Type: "network"}
	egress := Egress{Host: "api.example.test", Proto: "tcp", Port: 443, Purpose: "model"}
	reworded := ws
	reworded.Reason = "other words"
	route := Route{Purpose: "mcp", Proto: "tcp", Port: 6767, Method: "POST", Path: "/mcp/agents", Upstream: "http://127.0.0.1:6767/mcp/agents",
		CallerAgentID: "a", Methods: []string{"tools/list", "tools/call"}, Tools: []string{"list_agents"}}
	routeMoreTools := route
	routeMoreTools.Tools = []string{"list_agents", "create_agent"}
	routeFewer := route
	routeFewer.Methods, routeFewer.Tools = []string{"tools/list"}, nil
	routeSwapped := route
	routeSwapped.Tools = []string{"create_agent"}
	routeOtherAgent := route
	routeOtherAgent.CallerAgentID, routeOtherAgent.Methods, routeOtherAgent.Tools = "b", []string{"tools/list"}, nil
	model := Route{Purpose: "model", Proto: "tcp", Port: 18080, Path: "/v1", Upstream: "https://llm.example.test/v1", TokenRef: "alice/k",
		API: "openai-completions", Credential: "authorization-bearer", Requests: []string{"POST /chat/completions", "GET /models"}, Model: "m-1"}
	modelMore := model
	modelMore.Requests = []string{"POST /chat/completions", "GET /models", "POST /files"}
	modelFewer := model
	modelFewer.Requests = []string{"POST /chat/completions"}
	modelElsewhere := model
	modelElsewhere.Upstream = "https://other.example.test/v1"
	modelOther := model
	modelOther.Model = "m-2"
	modelBeta := model
	modelBeta.Headers = []string{"openai-beta: x"}
	modelSearch := model
	modelSearch.HostedTools = []string{"web_search"}
	nnp := NoNewPrivileges{On: true}
	network := NetworkMode{Mode: "sandbox"}
	networkNone := NetworkMode{Mode: "none"}
	wall := WallLimit{Wall: 60e9}
	wallLonger := WallLimit{Wall: 120e9}
	monitor := FSMonitor{On: true, Port: 18090, Path: "/w"}
	monitorOff := FSMonitor{}
	monitorElsewhere := monitor
	monitorElsewhere.Port = 18091
	search := Search{On: true, Port: 18091, Path: "/w"}
	searchOff := Search{}

	cases := []struct {
		name     string
		old, new List
		want     []string // change kinds
		widens   bool
	}{
		{"same", List{ws}, List{ws}, nil, false},
		{"ro to rw", List{ws}, List{wsRW}, []string{"widened"}, true},
		{"rw to ro", List{wsRW}, List{ws}, []string{"narrowed"}, false},
		{"more memory", List{mem}, List{memMore}, []string{"widened"}, true},
		{"less memory", List{memMore}, List{mem}, []string{"narrowed"}, false},
		{"egress added", nil, List{egress}, []string{"added"}, true},
		{"egress removed", List{egress}, nil, []string{"removed"}, false},
		{"namespace removed", List{net}, nil, []string{"removed"}, true},
		{"namespace added", nil, List{net}, []string{"added"}, false},
		{"limit removed", List{mem}, nil, []string{"removed"}, true},
		{"reason only", List{ws}, List{reworded}, []string{"changed"}, false},
		{"mcp tool added", List{route}, List{routeMoreTools}, []string{"widened"}, true},
		{"mcp scope narrowed", List{route}, List{routeFewer}, []string{"narrowed"}, false},
		{"mcp tool swapped", List{route}, List{routeSwapped}, []string{"widened"}, true},
		{"mcp caller changed with fewer tools", List{route}, List{routeOtherAgent}, []string{"changed"}, true},
		{"model request added", List{model}, List{modelMore}, []string{"widened"}, true},
		{"model requests narrowed", List{model}, List{modelFewer}, []string{"narrowed"}, false},
		{"model upstream changed", List{model}, List{modelElsewhere}, []string{"changed"}, true},
		{"model changed", List{model}, List{modelOther}, []string{"changed"}, true},
		{"model header value added", List{model}, List{modelBeta}, []string{"widened"}, true},
		{"model header value removed", List{modelBeta}, List{model}, []string{"narrowed"}, false},
		{"model hosted tool granted", List{model}, List{modelSearch}, []string{"widened"}, true},
		{"model hosted tool withdrawn", List{modelSearch}, List{model}, []string{"narrowed"}, false},
		{"model route replaces egress", List{egress}, List{model}, []string{"removed", "added"}, true},
		{"no-new-privileges dropped", List{nnp}, List{NoNewPrivileges{}}, []string{"widened"}, true},
		{"network to none", List{network}, List{networkNone}, []string{"narrowed"}, false},
		{"network from none", List{networkNone}, List{network}, []string{"changed"}, true},
		{"longer wall time", List{wall}, List{wallLonger}, []string{"widened"}, true},
		{"shorter wall time", List{wallLonger}, List{wall}, []string{"narrowed"}, false},
		{"monitor turned on", List{monitorOff}, List{monitor}, []string{"widened"}, true},
		{"monitor turned off", List{monitor}, List{monitorOff}, []string{"narrowed"}, false},
		{"monitor added on", nil, List{monitor}, []string{"added"}, true},
		{"monitor added off", nil, List{monitorOff}, []string{"added"}, false},
		{"monitor removed", List{monitor}, nil, []string{"removed"}, false},
		{"monitor on another port", List{monitor}, List{monitorElsewhere}, []string{"changed"}, true},
		{"search turned on", List{searchOff}, List{search}, []string{"widened"}, true},
		{"search turned off", List{search}, List{searchOff}, []string{"narrowed"}, false},
		{"search added on", nil, List{search}, []string{"added"}, true},
		{"search added off", nil, List{searchOff}, []string{"added"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changes := Diff(tc.old, tc.new)
			var kinds []string
			widens := false
			for _, c := range changes {
				kinds = append(kinds, c.Change)
				widens = widens || c.Widens
			}
			if diff := cmp.Diff(tc.want, kinds); diff != "" {
				t.Errorf("changes (-want +got):\n%s", diff)
			}
			if widens != tc.widens {
				t.Errorf("widens = %v, want %v", widens, tc.widens)
			}
		})
	}
}

func TestDiffMatchesRepeatedKeysByOccurrence(t *testing.T) {
	a := List{Argv{Words: []string{"pi"}}, Argv{Words: []string{"--mode"}}}
	b := List{Argv{Words: []string{"pi"}}, Argv{Words: []string{"--evil"}}}
	ch := Diff(a, b)
	if len(ch) != 1 || ch[0].Key != "process argv #2" || !ch[0].Widens {
		t.Fatalf("got %+v", ch)
	}
}
