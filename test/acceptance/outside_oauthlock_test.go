package acceptance

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// The daemon user runs two sandboxes of one oauth-file agent at once (a
// session and a probe; docs/threat-model.md, threat 57). Both would bind
// the same auth.json read-write, and Pi's refresh lock lives in each
// sandbox's own projection, so both refresh and one loses the rotated
// refresh token. The launcher refuses a second sandbox of the same
// auth.json object while the first lives. No network: network none.

func init() { registerOutside("oauthlock", oauthLockAttacks) }

func oauthLockAttacks(t *testing.T, _ *scene) []OutsideAttack {
	return []OutsideAttack{twoOAuthSandboxes(t)}
}

// oauthRefreshScript stands for Pi's refresh: on a line it appends its
// "rotated token" to auth.json, then holds the sandbox until stdin ends.
const oauthRefreshScript = `read line
echo "$line" >> "$PI_CODING_AGENT_DIR/auth.json" && echo wrote
read line`

const oauthLockFacts = `{"credential":{"mode":"oauth-file","env":null,"secretRef":null,
"authFile":"/srv/paseo/state/pi-agents/agent-7f3c/auth.json","refreshURLs":["https://auth.example.test/oauth/token"]},
"state":{"agentDir":"/srv/paseo/state/pi-agents/agent-7f3c"}}`

// oauthScene is an oauth-file bundle whose auth.json (OAuth entries only)
// belongs to the sandbox user, as the daemon's does, so the agent can
// rewrite it.
func oauthScene(t *testing.T) (*testbundle.Scene, string) {
	host := filepath.Join(t.TempDir(), "host")
	dir := filepath.Join(host, "srv/paseo/state/pi-agents/agent-7f3c")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	auth := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(auth, []byte(`{"anthropic":{"type":"oauth","access":"at-redacted","refresh":"rt-redacted","expires":1}}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(auth, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	sc := testbundle.New(t, testbundle.Options{Host: host, Argv: testbundle.Script(oauthRefreshScript),
		FactsPatch: strings.ReplaceAll(oauthLockFacts, `"/srv/`, `"`+host+`/srv/`)})
	return sc, auth
}

// oauthRun is one launch of the scene, driven over stdin.
type oauthRun struct {
	in   *io.PipeWriter
	out  *bufio.Reader
	done chan error
}

// startOAuth launches sc in stateRoot; refused is true when the launcher
// refused it because the auth.json is in use. Any other refusal fails the
// test: it would count a broken scene as defended.
func startOAuth(t *testing.T, sc *testbundle.Scene, stateRoot string) (r *oauthRun, refused bool) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r = &oauthRun{in: inW, out: bufio.NewReader(outR), done: make(chan error, 1)}
	started := make(chan struct{})
	go func() {
		_, err := launcher.Launch(context.Background(), launcher.Options{BundleDir: sc.Bundle, ID: "pp-accoauth-" + randomHex(4), StateRoot: stateRoot,
			RunscPath: sc.Runsc, Stdin: inR, Stdout: outW, OnStart: func() { close(started) }})
		outW.Close()
		inR.Close()
		r.done <- err
	}()
	select {
	case <-started:
		return r, false
	case err := <-r.done:
		var ue *launcher.UnavailableError
		if errors.As(err, &ue) && errors.Is(err, launcher.ErrAuthFileInUse) {
			return nil, true
		}
		t.Fatalf("oauthlock attack: launch refused for another reason: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("oauthlock attack: the sandbox did not start in 60 s")
	}
	return nil, false
}

// refresh has the sandbox write its token and reports whether it did.
func (r *oauthRun) refresh(token string) bool {
	fmt.Fprintln(r.in, token)
	line, _ := r.out.ReadString('\n')
	return strings.TrimSpace(line) == "wrote"
}

func (r *oauthRun) end() {
	r.in.Close()
	<-r.done
}

// twoOAuthSandboxes: the product's launcher, both launches in one state
// root, against launchers that take no shared lock (the second launch in
// a state root of its own, whose locks the first's never sees). The win is
// the second sandbox writing auth.json while the first still runs on it.
func twoOAuthSandboxes(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "daemon-user-runs-two-oauth-sandboxes", Attacker: "daemon-user",
		Goal:    "run two sandboxes of one oauth-file agent at once (a session and a probe) so both rewrite the same auth.json and one loses the rotated refresh token",
		Control: "the second launch's launcher shares no lock with the first's (its lock lives in a state root of its own), as before the auth.json lock"}
	const attempts = 3
	for _, side := range []struct {
		tally    *Tally
		separate bool
	}{{&a.Contained, false}, {&a.ControlRun, true}} {
		sc, auth := oauthScene(t)
		for i := range attempts {
			side.tally.Attempts++
			first, _ := startOAuth(t, sc, sc.State)
			if first == nil || !first.refresh(fmt.Sprintf("first-%d", i)) {
				t.Fatal("oauthlock attack: the first sandbox did not write its auth.json")
			}
			root := sc.State
			if side.separate {
				root = filepath.Join(t.TempDir(), "state")
			}
			second, refused := startOAuth(t, sc, root)
			switch {
			case refused:
				side.tally.Refusals++
			case second.refresh(fmt.Sprintf("second-%d", i)):
				data, _ := os.ReadFile(auth)
				if strings.Contains(string(data), fmt.Sprintf("first-%d\nsecond-%d\n", i, i)) {
					side.tally.Wins++
				}
			}
			if second != nil {
				second.end()
			}
			first.end()
		}
	}
	a.Evidence = fmt.Sprintf("%d pairs of launches of one bundle per side; a win is the second sandbox's write landing in the auth.json the first still holds", attempts)
	return a
}
