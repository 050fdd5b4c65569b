package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// Attacks from inside on a subscription login (issue 35). The agent
// tries to read the login's access and refresh tokens (environment,
// /proc, files: the agent dir above all), to refresh the login itself at
// the token endpoint (directly, by name and address, and through the
// gateway's model route), to use the access token (or the sandbox's
// placeholder) at the provider on a path the launch does not need, and to
// leave the tokens in a checkpoint. Contained: credential mode
// oauth-broker, where the login stays in the deployment's auth.json on the
// host and the model route adds its access token. Control: mode
// oauth-file, the mode before the broker: auth.json bound read-write in the
// sandbox and egress to the model host and the token endpoint. Tokens are
// random per run; the sandbox reports digests and the provider what it
// saw, so no value is printed.

func init() { registerOutside("subscription-login", loginAttacks) }

// TestLoginAttacks runs this family alone (make acceptance runs it in
// TestAcceptance with the rest).
func TestLoginAttacks(t *testing.T) {
	testbundle.Prerequisites(t)
	attacks := loginAttacks(t, &scene{world: testnet.New(t)})
	judgeOutside(attacks, t.Errorf, t.Errorf)
	for _, a := range attacks {
		t.Log(a)
	}
}

// loginProvider is the subscription provider on a test host of its own:
// the messages API and the login's token endpoint. It records the
// requests that carried the real access token on a path the launch does
// not need, and the refreshes that used the real refresh token.
type loginProvider struct {
	host            *testnet.Host
	ca              *fakemodel.TestCA
	access, refresh string
	mu              sync.Mutex
	elsewhere       int
	refreshed       int
}

func newLoginProvider(t *testing.T, w *testnet.World) *loginProvider {
	p := &loginProvider{host: w.Host("subscription"), access: "sk-ant-oat01-" + randomHex(16), refresh: "sk-ant-ort01-" + randomHex(16)}
	p.ca = serveProvider(t, p.host, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		p.mu.Lock()
		defer p.mu.Unlock()
		if r.URL.Path == "/v1/oauth/token" {
			var b map[string]string
			if json.Unmarshal(body, &b) == nil && b["refresh_token"] == p.refresh {
				p.refreshed++
				rw.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(rw, `{"access_token":"sk-ant-oat01-%s","refresh_token":"sk-ant-ort01-%s","expires_in":28800}`, randomHex(16), randomHex(16))
				return
			}
			rw.WriteHeader(http.StatusBadRequest)
			fmt.Fprintln(rw, `{"error":"invalid_grant"}`)
			return
		}
		if r.Header.Get("Authorization") == "Bearer "+p.access && r.URL.Path != "/v1/messages" {
			p.elsewhere++
		}
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(rw, `{"data":[]}`)
	}), nil)
	return p
}

func (p *loginProvider) take() (elsewhere, refreshed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	elsewhere, refreshed = p.elsewhere, p.refreshed
	p.elsewhere, p.refreshed = 0, 0
	return
}

// loginScript is the agent ($0 "agent"): $1 and $2 the sha256 of the
// access and refresh token (to recognise them, never to hold them), $3
// the provider's address. Each read prints WIN or MISS and its name; then
// it refreshes with the refresh token it found (or a guess) and calls the
// provider with the access token it found (or the sandbox's placeholder)
// on other paths, directly by name and address (plain HTTP: see
// modelKeyScript) and through the gateway, and holds what it found in
// its memory for the checkpoint.
const loginScript = `bb=/bin/busybox
d() { printf %s "$1" | $bb sha256sum | $bb cut -d' ' -f1; }
toks() { $bb grep -aoE 'sk-ant-o[ar]t01-[0-9a-f]{32}' | $bb sort -u; }
judge() { w=MISS; for k in $(toks); do h=$(d "$k"); [ "$h" = "$1" ] || [ "$h" = "$2" ] && w=WIN; done; echo "$w $3"; }
$bb env | judge "$1" "$2" read-login-env
$bb cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | $bb tr '\0' '\n' | judge "$1" "$2" read-login-proc
$bb grep -raoE 'sk-ant-o[ar]t01-[0-9a-f]{32}' /etc /run /tmp /home /srv 2>/dev/null | judge "$1" "$2" read-login-files
FOUND=$($bb grep -rahoE 'sk-ant-o[ar]t01-[0-9a-f]{32}' /srv /tmp /home 2>/dev/null | $bb sort -u | $bb tr '\n' ' ')
R=$(echo "$FOUND" | $bb tr ' ' '\n' | $bb grep -m1 ort01); [ -n "$R" ] || R=sk-ant-ort01-guess
A=$(echo "$FOUND" | $bb tr ' ' '\n' | $bb grep -m1 oat01); [ -n "$A" ] || A=sk-ant-oat-paseo-model-route
for u in "http://llm.example.test:8443" "http://$3:8443" "http://paseo-gateway:18080"; do
  $bb timeout 8 $bb wget -q -O /dev/null --header "Content-Type: application/json" --post-data "{\"grant_type\":\"refresh_token\",\"refresh_token\":\"$R\"}" "$u/v1/oauth/token" 2>/dev/null
  for p in /v1/files /v1/organizations /v2/messages; do
    $bb timeout 8 $bb wget -q -O /dev/null --header "Authorization: Bearer $A" "$u$p" 2>/dev/null
  done
done
echo sent
echo ready; read line`

func loginAttacks(t *testing.T, s *scene) []OutsideAttack {
	p := newLoginProvider(t, s.world)
	read := OutsideAttack{Name: "agent-reads-subscription-login", Attacker: "agent",
		Goal:    "read the subscription login's access or refresh token from the sandbox's environment, any process's /proc environ or cmdline, or its files (/etc, /run, /tmp, home, /srv: the agent dir's auth.json above all)",
		Control: "credential mode oauth-file: auth.json bound read-write in the sandbox"}
	refresh := OutsideAttack{Name: "agent-refreshes-subscription-login", Attacker: "agent",
		Goal:    "refresh the login itself at the token endpoint (directly by name and address, and through the gateway's model route), minting tokens of its own and logging the host out",
		Control: "credential mode oauth-file: the refresh token readable and the token endpoint an egress destination"}
	use := OutsideAttack{Name: "agent-uses-subscription-login-elsewhere", Attacker: "agent",
		Goal:    "call the provider with the login's access token (or the sandbox's placeholder) on paths the launch does not need, directly by name and address or through the gateway",
		Control: "credential mode oauth-file: the access token readable and the model host an egress destination"}
	image := OutsideAttack{Name: "subscription-login-in-checkpoint", Attacker: "agent",
		Goal:    "leave the login's tokens in the sandbox's memory, so that its hibernation image holds them",
		Control: "credential mode oauth-file: the agent holds the tokens it read"}
	for _, side := range []struct {
		control bool
		pick    func(*OutsideAttack) *Tally
	}{{false, func(a *OutsideAttack) *Tally { return &a.Contained }}, {true, func(a *OutsideAttack) *Tally { return &a.ControlRun }}} {
		sc := loginScene(t, p, side.control)
		out, holding := runLoginAgent(t, s, sc, p, side.control)
		lines := tallyLines(out)
		for _, n := range []string{"read-login-env", "read-login-proc", "read-login-files"} {
			add(side.pick(&read), lines[n])
		}
		elsewhere, refreshed := p.take()
		rt := side.pick(&refresh)
		rt.Attempts += 3
		rt.Wins += min(refreshed, 3)
		ut := side.pick(&use)
		ut.Attempts += 9
		ut.Wins += min(elsewhere, 9)
		ti := side.pick(&image)
		ti.Attempts++
		if holding > 0 {
			ti.Wins++
		}
	}
	refresh.Evidence = "a win is a refresh the token endpoint saw with the login's real refresh token"
	use.Evidence = "a win is a request the provider saw carrying the real access token on a path other than POST /v1/messages"
	image.Evidence = "a win is a checkpoint image file holding the access or the refresh token's bytes"
	return []OutsideAttack{read, refresh, use, image}
}

// loginFacts is the launch of either side: Anthropic's messages API at
// the provider, the login in this agent's agent dir.
const loginFacts = `{"model":{"baseURL":"https://llm.example.test:8443","api":"anthropic-messages"},
"credential":{"mode":%q,"env":null,"secretRef":null,
"authFile":"/srv/paseo/state/pi-agents/agent-7f3c/auth.json","refreshURLs":["https://llm.example.test:8443/v1/oauth/token"]},
"state":{"agentDir":"/srv/paseo/state/pi-agents/agent-7f3c"}}`

// loginScene compiles the agent with the daemon's auth.json holding the
// provider's login (the daemon's, 0600): oauth-broker on the sandbox
// network, or as control oauth-file.
func loginScene(t *testing.T, p *loginProvider, control bool) *testbundle.Scene {
	host := filepath.Join(t.TempDir(), "host")
	dir := filepath.Join(host, "srv/paseo/state/pi-agents/agent-7f3c")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	auth := filepath.Join(dir, "auth.json")
	login := fmt.Sprintf(`{"fake":{"type":"oauth","access":%q,"refresh":%q,"expires":%d}}`, p.access, p.refresh, time.Now().Add(8*time.Hour).UnixMilli())
	if err := os.WriteFile(auth, []byte(login), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{dir, auth} {
		if err := os.Chown(f, 1000, 1000); err != nil {
			t.Fatal(err)
		}
	}
	mode := "oauth-broker"
	if control {
		mode = "oauth-file"
	}
	return testbundle.New(t, testbundle.Options{Host: host, Argv: append(testbundle.Script(loginScript), "agent", "x"),
		RegistryPatch: `{"network":{"mode":"sandbox"}}`,
		FactsPatch:    strings.ReplaceAll(fmt.Sprintf(loginFacts, mode), `"/srv/`, `"`+host+`/srv/`)})
}

// runLoginAgent launches the agent with the tokens' digests and the
// provider's address as its arguments, waits for its attempts,
// checkpoints it and counts the image files holding a token.
func runLoginAgent(t *testing.T, s *scene, sc *testbundle.Scene, p *loginProvider, control bool) ([]byte, int) {
	testbundle.Rewrite(t, sc.Bundle, "config.json", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"x"`), []byte(`"`+hexDigest(p.access)+`",
      "`+hexDigest(p.refresh)+`",
      "`+p.host.Addr.String()+`"`), 1)
	})
	id := fmt.Sprintf("pp-acclogin-%v-%s", control, randomHex(4))
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := launcher.Launch(context.Background(), launcher.Options{BundleDir: sc.Bundle, ID: id, StateRoot: sc.State, RunscPath: sc.Runsc,
			Secrets: func(_, _ string) ([]byte, error) { return nil, launcher.ErrSecretUnknown },
			Stdin:   inR, Stdout: outW, Uplink: s.world.Uplink, ModelRoots: p.ca.Roots,
			Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
				if host == "llm.example.test" {
					return []netip.Addr{p.host.Addr}, nil
				}
				return nil, fmt.Errorf("unknown host %s", host)
			}})
		outW.Close()
		inR.Close()
		done <- err
	}()
	defer func() {
		inW.Close()
		if err := <-done; err != nil && !control {
			t.Logf("login attack: launch: %v", err)
		}
		_ = launcher.RemoveHibernation(sc.State, id)
	}()
	var out bytes.Buffer
	r := bufio.NewReader(outR)
	deadline := time.After(3 * time.Minute)
	for {
		lc := make(chan string, 1)
		go func() { l, _ := r.ReadString('\n'); lc <- l }()
		select {
		case l := <-lc:
			out.WriteString(l)
			if l == "" {
				t.Fatalf("login attack (control %v): the agent ended early: %s", control, out.String())
			}
		case <-deadline:
			t.Fatalf("login attack (control %v): no end of attempts: %s", control, out.String())
		}
		if strings.HasSuffix(out.String(), "ready\n") {
			break
		}
	}
	img, err := launcher.Checkpoint(launcher.CheckpointOptions{ID: id, StateRoot: sc.State, RunscPath: sc.Runsc})
	if err != nil {
		t.Fatalf("login attack: checkpoint: %v", err)
	}
	holding := 0
	for name := range img.Files {
		data, err := os.ReadFile(filepath.Join(statedir.HibernateDir(sc.State, id), "image", name))
		if err == nil && (bytes.Contains(data, []byte(p.access)) || bytes.Contains(data, []byte(p.refresh))) {
			holding++
		}
	}
	return out.Bytes(), holding
}
