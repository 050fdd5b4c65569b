package grant

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDiffClassifies(t *testing.T) {
	ws := Grant{Kind: Mount, Subject: "/w", Access: RO, Source: "/h/w", Type: "bind", Reason: "r", Fact: "workspace.cwd"}
	wsRW := ws
	wsRW.Access = RW
	mem := Grant{Kind: Cgroup, Subject: "memory", Access: Max, Value: "100"}
	memMore := mem
	memMore.Value = "200"
	net := Grant{Kind: Namespace, Subject: "network", Access: New}
	egress := Grant{Kind: Egress, Subject: "api.example.test", Proto: "tcp", Port: 443, Access: Allow}
	reworded := ws
	reworded.Reason = "other words"
	route := Grant{Kind: Route, Subject: "mcp", Access: Allow, Port: 6767, Value: "POST /mcp/agents", Source: "http://127.0.0.1:6767/mcp/agents",
		Options: []string{"callerAgentId=a", "method=tools/list", "method=tools/call", "tool=list_agents"}}
	routeMoreTools := route
	routeMoreTools.Options = append([]string{"callerAgentId=a", "method=tools/list", "method=tools/call", "tool=list_agents"}, "tool=create_agent")
	routeFewer := route
	routeFewer.Options = []string{"callerAgentId=a", "method=tools/list"}
	routeSwapped := route
	routeSwapped.Options = []string{"callerAgentId=a", "method=tools/list", "method=tools/call", "tool=create_agent"}
	routeOtherAgent := route
	routeOtherAgent.Options = []string{"callerAgentId=b", "method=tools/list"}

	cases := []struct {
		name     string
		old, new []Grant
		want     []string // change kinds
		widens   bool
	}{
		{"same", []Grant{ws}, []Grant{ws}, nil, false},
		{"ro to rw", []Grant{ws}, []Grant{wsRW}, []string{"widened"}, true},
		{"rw to ro", []Grant{wsRW}, []Grant{ws}, []string{"narrowed"}, false},
		{"more memory", []Grant{mem}, []Grant{memMore}, []string{"widened"}, true},
		{"less memory", []Grant{memMore}, []Grant{mem}, []string{"narrowed"}, false},
		{"egress added", nil, []Grant{egress}, []string{"added"}, true},
		{"egress removed", []Grant{egress}, nil, []string{"removed"}, false},
		{"namespace removed", []Grant{net}, nil, []string{"removed"}, true},
		{"namespace added", nil, []Grant{net}, []string{"added"}, false},
		{"limit removed", []Grant{mem}, nil, []string{"removed"}, true},
		{"reason only", []Grant{ws}, []Grant{reworded}, []string{"changed"}, false},
		{"mcp tool added", []Grant{route}, []Grant{routeMoreTools}, []string{"widened"}, true},
		{"mcp scope narrowed", []Grant{route}, []Grant{routeFewer}, []string{"narrowed"}, false},
		{"mcp tool swapped", []Grant{route}, []Grant{routeSwapped}, []string{"widened"}, true},
		{"mcp caller changed with fewer tools", []Grant{route}, []Grant{routeOtherAgent}, []string{"changed"}, true},
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
	a := []Grant{{Kind: Process, Subject: "argv", Args: []string{"pi"}}, {Kind: Process, Subject: "argv", Args: []string{"--mode"}}}
	b := []Grant{{Kind: Process, Subject: "argv", Args: []string{"pi"}}, {Kind: Process, Subject: "argv", Args: []string{"--evil"}}}
	ch := Diff(a, b)
	if len(ch) != 1 || ch[0].Key != "process argv #2" || !ch[0].Widens {
		t.Fatalf("got %+v", ch)
	}
}
