package bundle

import (
	"errors"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/grant"
)

// egress.json's routes have the purposes grant.RoutePurpose defines and
// no other: a route of another purpose is refused as it is decoded, with
// the code of a grant no type decodes; the known ones decode as the
// constants.
func TestEgressRefusesAnUnknownRoutePurpose(t *testing.T) {
	doc := func(purpose string) Files {
		return Files{EgressFile: []byte(`{"apiVersion":"` + APIVersion + `","kind":"Egress","mode":"sandbox","default":"deny","dns":"pinned","rules":[],` +
			`"gateway":{"name":"` + GatewayName + `"},"routes":[{"purpose":"` + purpose + `","listen":"gateway","port":6767,"method":"POST","path":"/x",` +
			`"callerAgentId":"a","upstream":"http://127.0.0.1:6767/x","tokenRef":"","methods":[],"tools":[],"fact":"f"}]}`)}
	}
	for _, p := range []grant.RoutePurpose{grant.RouteMCP, grant.RouteModel} {
		eg, err := doc(string(p)).Egress()
		if err != nil || len(eg.Routes) != 1 || eg.Routes[0].Purpose != p || eg.Gateway == nil || eg.Gateway.Name != GatewayName {
			t.Errorf("purpose %s: %+v, %v", p, eg, err)
		}
	}
	_, err := doc("search").Egress()
	if !errors.Is(err, grant.ErrRoutePurpose) || !strings.Contains(err.Error(), string(diag.GrantUnknownKind)) {
		t.Errorf("a route of purpose search: %v, want %v", err, grant.ErrRoutePurpose)
	}
}
