package acceptance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// Attacks on secret references, from whoever writes one deployment's facts
// (its daemon, or input that steers it): naming another deployment's
// secret, and smuggling a placeholder into a fact the launcher was never
// meant to fill. The sandbox reports only digests; the test compares them
// with digests of the values it planted, so no value is ever printed.

func init() { registerOutside("secrets", secretAttacks) }

func secretAttacks(t *testing.T, _ *scene) []OutsideAttack {
	w := newSecretWorld(t)
	return []OutsideAttack{w.otherDeploymentsSecret(t), w.placeholderInAnotherFact(t)}
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

// secretScript reports digests of the credential env and of the model
// word in argv ($1 after "--model").
const secretScript = `d() { printf %s "$1" | /bin/busybox sha256sum | /bin/busybox cut -d' ' -f1; }
echo env-sha256=$(d "$FAKE_LLM_KEY")
echo argv-sha256=$(d "$1")`

func hexDigest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// secretScene compiles a busybox bundle for deployment host-alice (network
// none) whose argv ends in the model slot, with facts patched, and gives
// it the credential env slot of ref. The compiler writes no slot for the
// provider key any more (the model route adds it, issue 24; the
// model-key attacks), but the launcher still fills a bundle's slots from
// the deployment's secrets, and the model route reads its key through
// the same scoped source: these attacks keep testing both.
func secretScene(t *testing.T, factsPatch, ref string) *testbundle.Scene {
	patch := `{"credential":{"mode":"none","env":null,"secretRef":null}}`
	if factsPatch != "" {
		merged, err := testtree.MergePatch([]byte(patch), []byte(factsPatch))
		if err != nil {
			t.Fatal(err)
		}
		patch = string(merged)
	}
	sc := testbundle.New(t, testbundle.Options{Argv: append(testbundle.Script(secretScript), "slot:model"), FactsPatch: patch})
	testbundle.KeyInEnv(t, sc.Bundle, "FAKE_LLM_KEY", ref)
	return sc
}

// launchSecrets runs sc; refused is true when the launch was refused as
// sandbox-unavailable (nothing ran) for the reason the attack meets. Any
// other refusal fails the test: it would count a broken scene as defended.
func launchSecrets(t *testing.T, sc *testbundle.Scene, src launcher.SecretSource, because error) (out string, refused bool) {
	var stdout, stderr bytes.Buffer
	_, err := launcher.Launch(context.Background(), launcher.Options{BundleDir: sc.Bundle, StateRoot: sc.State, RunscPath: sc.Runsc,
		Secrets: src, Stdin: strings.NewReader(""), Stdout: &stdout, Stderr: &stderr})
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

// otherDeploymentsSecret: host-alice's facts name host-bob's refs as their
// credential (B's provider key, B's daemon MCP token). Traversals
// ("alice/../bob/…") are refused by the launcher's ref check on both sides
// and are left to the unit tests.
// The win is A's sandbox holding B's value.
func (w *secretWorld) otherDeploymentsSecret(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "other-deployment-names-secret", Attacker: "other-deployment",
		Goal:    "deployment host-alice's facts name host-bob's secretRef; A's sandbox receives B's key (and could send it to any baseURL A names)",
		Control: "a secret source that ignores the deployment and reads <dir>/<ref> from one flat namespace, as the launcher used to"}
	attempts := []struct{ ref, victim string }{
		{"bob/fake-llm", "host-bob/bob/fake-llm"},
		{"bob/mcp-token", "host-bob/bob/mcp-token"},
	}
	for _, side := range []struct {
		tally *Tally
		src   launcher.SecretSource
	}{{&a.Contained, launcher.SecretsDir(w.scoped)}, {&a.ControlRun, w.flatSource}} {
		for _, at := range attempts {
			sc := secretScene(t, "", at.ref)
			side.tally.Attempts++
			out, refused := launchSecrets(t, sc, side.src, launcher.ErrSecretUnknown)
			switch {
			case refused:
				side.tally.Refusals++
			case strings.Contains(out, "env-sha256="+hexDigest(w.values[at.victim])):
				side.tally.Wins++
			}
		}
	}
	a.Evidence = fmt.Sprintf("refs named: %d of host-bob's; a win is the sandbox's env digest equal to B's value's", len(attempts))
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
	clean := secretScene(t, "", "alice/fake-llm")
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
	sc := secretScene(t, "", "alice/fake-llm")
	testbundle.Rewrite(t, sc.Bundle, bundle.ConfigFile, intoArgv)
	a.Contained.Attempts++
	if out, refused := launchSecrets(t, sc, launcher.SecretsDir(w.scoped), launcher.ErrStrayPlaceholder); refused {
		a.Contained.Refusals++
	} else if strings.Contains(out, "argv-sha256="+hexDigest("fake/fake-1"+value)) {
		a.Contained.Wins++
	}

	// Control: the same edited bundle, substituted across config.json as
	// the old launcher did; the manifest's record of the credential slot
	// is dropped, since the test has done the filling, so the launcher
	// runs it as it stands.
	sc = secretScene(t, "", "alice/fake-llm")
	testbundle.Rewrite(t, sc.Bundle, bundle.ConfigFile, intoArgv)
	testbundle.Rewrite(t, sc.Bundle, bundle.ConfigFile, func(b []byte) []byte { return bytes.ReplaceAll(b, []byte(ph), []byte(value)) })
	testbundle.Rewrite(t, sc.Bundle, bundle.ManifestFile, func(b []byte) []byte {
		m, err := bundle.Files{bundle.ManifestFile: b}.Manifest()
		if err != nil {
			t.Fatal(err)
		}
		m.Grants = slices.DeleteFunc(m.Grants, func(g grant.Grant) bool {
			e, ok := g.(grant.Env)
			return ok && strings.Contains(e.Value, ph)
		})
		out, err := bundle.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	})
	a.ControlRun.Attempts++
	if out, refused := launchSecrets(t, sc, nil, launcher.ErrStrayPlaceholder); refused {
		a.ControlRun.Refusals++
	} else if strings.Contains(out, "argv-sha256="+hexDigest("fake/fake-1"+value)) {
		a.ControlRun.Wins++
	}
	a.Evidence = "facts refused at compile with " + string(diag.SecretMarker) + "; an edited bundle refused at launch; a win is the sandbox's argv digest equal to the model word with A's key in it"
	return a
}
