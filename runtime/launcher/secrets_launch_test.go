package launcher

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
)

// keyDigest is what the sandbox prints about its credential: a digest,
// never the value.
const keyDigest = `echo key-sha256=$(printf %s "$FAKE_LLM_KEY" | /bin/busybox sha256sum | /bin/busybox cut -d' ' -f1)
echo started > $PASEO_AGENT_CWD/started`

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// Through the real secrets dir a sandbox gets its own deployment's key in
// the credential env, and facts naming another deployment's ref get no
// sandbox at all.
func TestLaunchSecretsDirScoped(t *testing.T) {
	dir := secretsTree(t)
	// A bundle with the key's slot (the launch before the model route):
	// the secrets dir's scoping is the same for the route's key.
	t.Run("own ref", func(t *testing.T) {
		s := compileScriptFacts(t, keyDigest, "", directModel)
		testbundle.KeyInEnv(t, s.bundle, "FAKE_LLM_KEY", "alice/fake-llm")
		res, out, stderr, err := s.launch(t, SecretsDir(dir))
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("launch: %v (exit %d)\nstderr: %s", err, res.ExitCode, stderr)
		}
		if !strings.Contains(out, "key-sha256="+sha256hex("alice-key")) {
			t.Errorf("the sandbox did not get its deployment's key:\n%s", out)
		}
		s.assertClean(t)
	})
	t.Run("another deployment's ref", func(t *testing.T) {
		s := compileScriptFacts(t, keyDigest, "", directModel)
		testbundle.KeyInEnv(t, s.bundle, "FAKE_LLM_KEY", "bob/fake-llm")
		_, _, _, err := s.launch(t, SecretsDir(dir))
		wantUnavailable(t, err, "no such secret in this deployment")
		if strings.Contains(err.Error(), "bob-key") {
			t.Error("the refusal carries B's value")
		}
		s.assertNotStarted(t)
	})
}

// A bundle edited to carry a placeholder in argv (digests recomputed, so
// it verifies) is refused before any secret is read or runsc starts; the
// old launcher would have put the key in the agent's argv.
func TestLaunchRefusesPlaceholderOutsideSlots(t *testing.T) {
	for name, edit := range map[string]func([]byte) []byte{
		"argv": func(cfg []byte) []byte {
			return bytes.Replace(cfg, []byte(`"-c",`), []byte(`"-c", "`+bundle.SecretPlaceholder("alice/fake-llm")+`",`), 1)
		},
		"cwd": func(cfg []byte) []byte {
			return bytes.Replace(cfg, []byte(`"cwd": "`), []byte(`"cwd": "/`+bundle.SecretPlaceholder("alice/fake-llm")), 1)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := compileScript(t, keyDigest, "")
			testbundle.Rewrite(t, s.bundle, bundle.ConfigFile, edit)
			asked := 0
			_, _, _, err := s.launch(t, func(d, r string) ([]byte, error) { asked++; return staticSecret("s3cr3t-value")(d, r) })
			wantUnavailable(t, err, "placeholder")
			if asked > 0 {
				t.Errorf("the secret source was asked %d times before the refusal", asked)
			}
			s.assertNotStarted(t)
		})
	}
}
