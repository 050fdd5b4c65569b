package acceptance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// Attacks on secret references, from whoever writes one deployment's facts
// (its daemon, or input that steers it): naming another deployment's
// secret as the model route's key, and smuggling a placeholder into a
// fact the launcher was never meant to fill. The sandbox and the provider
// report only digests or what they saw; the test compares them with the
// values it planted, so no value is ever printed.

func init() { registerOutside("secrets", secretAttacks) }

// TestSecretAttacks runs this family alone (make acceptance runs it in
// TestAcceptance with the rest).
func TestSecretAttacks(t *testing.T) {
	testbundle.Prerequisites(t)
	attacks := secretAttacks(t, &scene{world: testnet.New(t)})
	judgeOutside(attacks, t.Errorf, t.Errorf)
	for _, a := range attacks {
		t.Log(a)
	}
}

func secretAttacks(t *testing.T, s *scene) []OutsideAttack {
	w := newSecretWorld(t)
	return []OutsideAttack{w.otherDeploymentsSecret(t, s), w.placeholderInAnotherFact(t)}
}

// secretWorld is a secrets dir as the product lays it out (one directory
// per deployment) and the same secrets in the old flat layout (one global
// namespace of refs), each value random.
type secretWorld struct {
	scoped, flat string
	values       map[string]string // "<deployment>/<ref>" -> value
}

func newSecretWorld(t *testing.T) *secretWorld {
	w := &secretWorld{scoped: filepath.Join(t.TempDir(), "secrets"), flat: filepath.Join(t.TempDir(), "flat"), values: map[string]string{}}
	for _, dr := range []string{"host-alice/alice/fake-llm", "host-alice/paseo/mcp-token", "host-bob/bob/fake-llm", "host-bob/bob/mcp-token"} {
		v := randomHex(16)
		w.values[dr] = v
		_, ref, _ := strings.Cut(dr, "/")
		for _, p := range []string{filepath.Join(w.scoped, dr), filepath.Join(w.flat, ref)} {
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	return w
}

// flatSource is what the launcher used to do: the ref alone names the
// file, whatever deployment asks.
func (w *secretWorld) flatSource(_, ref string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(w.flat, ref))
	return bytes.TrimRight(data, "\n"), err
}

// secretScript reports a digest of the model word in argv ($1 after
// "--model").
const secretScript = `d() { printf %s "$1" | /bin/busybox sha256sum | /bin/busybox cut -d' ' -f1; }
echo argv-sha256=$(d "$1")`

func hexDigest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// secretScene compiles a busybox bundle for deployment host-alice (network
// none, no credential) whose argv ends in the model slot.
func secretScene(t *testing.T) *testbundle.Scene {
	return testbundle.New(t, testbundle.Options{Argv: append(testbundle.Script(secretScript), "slot:model"),
		FactsPatch: `{"credential":{"mode":"none","env":null,"secretRef":null}}`})
}

// launchSecrets runs sc; refused is true when the launch was refused as
// sandbox-unavailable (nothing ran) for the reason the attack meets. Any
// other refusal fails the test: it would count a broken scene as defended.
func launchSecrets(t *testing.T, opts launcher.Options, because error) (out string, refused bool) {
	var stdout, stderr bytes.Buffer
	opts.Stdin, opts.Stdout, opts.Stderr = strings.NewReader(""), &stdout, &stderr
	_, err := launcher.Launch(context.Background(), opts)
	var ue *launcher.UnavailableError
	if errors.As(err, &ue) {
		if !strings.Contains(ue.Reason, because.Error()) {
			t.Fatalf("launch refused for another reason than %q: %v", because, err)
		}
		return "", true
	}
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	return stdout.String(), false
}

// askModelsScript asks the model for its models through the model route
// on the gateway, with the stand-in key the sandbox has: the route adds
// the key its secretRef names.
const askModelsScript = `(printf 'GET /v1/models HTTP/1.0\r\nHost: paseo-gateway\r\nAuthorization: Bearer %s\r\n\r\n' "$FAKE_LLM_KEY"; /bin/busybox sleep 2) | /bin/busybox timeout 8 /bin/busybox nc -w 6 paseo-gateway 18080 | /bin/busybox head -n1`

// otherDeploymentsSecret: host-alice's facts name host-bob's refs as the
// secretRef of their model route (B's provider key, B's daemon MCP
// token), so that A's route would add B's value to A's agent's requests.
// Traversals ("alice/../bob/…") are refused by the launcher's ref check
// on both sides and are left to the unit tests.
// The win is the provider seeing B's value on a request of A's sandbox.
func (w *secretWorld) otherDeploymentsSecret(t *testing.T, s *scene) OutsideAttack {
	a := OutsideAttack{Name: "other-deployment-names-secret", Attacker: "other-deployment",
		Goal:    "deployment host-alice's facts name host-bob's secretRef for the model route; A's route adds B's key to A's agent's requests (B's account answers A, and the key goes to whatever provider A's facts name)",
		Control: "a secret source that ignores the deployment and reads <dir>/<ref> from one flat namespace, as the launcher used to"}
	p := newProviderOn(t, s.world.Host("secret-provider"), "")
	attempts := []struct{ ref, victim string }{
		{"bob/fake-llm", "host-bob/bob/fake-llm"},
		{"bob/mcp-token", "host-bob/bob/mcp-token"},
	}
	for _, side := range []struct {
		tally *Tally
		src   launcher.SecretSource
	}{{&a.Contained, launcher.SecretsDir(w.scoped)}, {&a.ControlRun, w.flatSource}} {
		for _, at := range attempts {
			sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(askModelsScript), RegistryPatch: `{"network":{"mode":"sandbox"}}`,
				FactsPatch: `{"credential":{"secretRef":"` + at.ref + `"}}`})
			p.mu.Lock()
			p.key, p.keyed = w.values[at.victim], map[string]int{}
			p.mu.Unlock()
			side.tally.Attempts++
			_, refused := launchSecrets(t, launcher.Options{BundleDir: sc.Bundle, StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: side.src,
				Uplink: s.world.Uplink, ModelRoots: p.ca.Roots,
				Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
					if host == "llm.example.test" {
						return []netip.Addr{p.host.Addr}, nil
					}
					return nil, fmt.Errorf("unknown host %s", host)
				}}, launcher.ErrSecretUnknown)
			p.mu.Lock()
			seen := len(p.keyed) > 0
			p.mu.Unlock()
			switch {
			case refused:
				side.tally.Refusals++
			case seen:
				side.tally.Wins++
			}
		}
	}
	a.Evidence = fmt.Sprintf("refs named: %d of host-bob's; a win is a request of A's sandbox reaching the provider with B's value as its key", len(attempts))
	return a
}

// placeholderInAnotherFact: the placeholder of A's own credential put in a
// fact that reaches argv (model.id; model.baseURL for the compiler), and,
// for a bundle edited after compile with its digests recomputed, straight
// into argv. The win is the secret in the sandbox's argv.
func (w *secretWorld) placeholderInAnotherFact(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "placeholder-in-another-fact", Attacker: "daemon-user",
		Goal:    "a secret placeholder in model.id (or written into argv of a compiled bundle) makes the launcher put the credential in the agent's argv",
		Control: "the test substitutes every placeholder across config.json (and the manifest) itself, as the old launcher did, then runs the bundle"}
	ph := bundle.SecretPlaceholder("alice/fake-llm")
	value := w.values["host-alice/alice/fake-llm"]

	// At compile: each fact carrying the marker is refused with its code.
	clean := secretScene(t)
	for _, patch := range []string{`{"model":{"id":"fake-1` + ph + `"}}`, `{"model":{"baseURL":"https://llm.example.test:8443/v1/` + ph + `"}}`} {
		facts, err := testtree.MergePatch(clean.Facts, []byte(patch))
		if err != nil {
			t.Fatal(err)
		}
		a.Contained.Attempts++
		res, diags := compiler.Compile(compiler.Inputs{Facts: schema.Input{Name: "facts.json", Data: facts},
			Registry: schema.Input{Name: "registry.json", Data: clean.Registry}}, compiler.Options{})
		if res == nil && slices.ContainsFunc(diags, func(d diag.Diagnostic) bool { return d.Code == diag.SecretMarker }) {
			a.Contained.Refusals++
		} else if res != nil && bytes.Contains(res.Files[bundle.ConfigFile], []byte(`"fake/fake-1`+ph)) {
			// Compiled with the placeholder in argv: a launcher filling
			// anywhere would finish the attack; count it as won.
			a.Contained.Wins++
		}
	}

	intoArgv := func(cfg []byte) []byte {
		return bytes.Replace(cfg, []byte(`"fake/fake-1"`), []byte(`"fake/fake-1`+ph+`"`), 1)
	}
	// At launch: the edited bundle verifies, and the product refuses it.
	sc := secretScene(t)
	testbundle.Rewrite(t, sc.Bundle, bundle.ConfigFile, intoArgv)
	a.Contained.Attempts++
	if out, refused := launchSecrets(t, launcher.Options{BundleDir: sc.Bundle, StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: launcher.SecretsDir(w.scoped)}, launcher.ErrStrayPlaceholder); refused {
		a.Contained.Refusals++
	} else if strings.Contains(out, "argv-sha256="+hexDigest("fake/fake-1"+value)) {
		a.Contained.Wins++
	}

	// Control: the same edited bundle, substituted across config.json as
	// the old launcher did (the test does the filling), run as it stands.
	sc = secretScene(t)
	testbundle.Rewrite(t, sc.Bundle, bundle.ConfigFile, intoArgv)
	testbundle.Rewrite(t, sc.Bundle, bundle.ConfigFile, func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(ph), []byte(value)) })
	a.ControlRun.Attempts++
	if out, refused := launchSecrets(t, launcher.Options{BundleDir: sc.Bundle, StateRoot: sc.State, RunscPath: sc.Runsc}, launcher.ErrStrayPlaceholder); refused {
		a.ControlRun.Refusals++
	} else if strings.Contains(out, "argv-sha256="+hexDigest("fake/fake-1"+value)) {
		a.ControlRun.Wins++
	}
	a.Evidence = "facts refused at compile with " + string(diag.SecretMarker) + "; an edited bundle refused at launch; a win is the sandbox's argv digest equal to the model word with A's key in it"
	return a
}
