package launcher

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
)

// askModels asks the model for its models through the model route on the
// gateway, with the stand-in key the sandbox has (the route adds the real
// one), and prints the status line.
const askModels = `(printf 'GET /v1/models HTTP/1.0\r\nHost: paseo-gateway\r\nAuthorization: Bearer %s\r\n\r\n' "$FAKE_LLM_KEY"; /bin/busybox sleep 2) | /bin/busybox timeout 8 /bin/busybox nc -w 6 paseo-gateway 18080 | /bin/busybox head -n1 | /bin/busybox tr -d '\r' | /bin/busybox sed "s/^/models: /"`

// Through the real secrets dir the model route gets its own deployment's
// key (the fake model takes only alice's), and facts naming another
// deployment's ref get no sandbox at all.
func TestLaunchSecretsDirScoped(t *testing.T) {
	dir := secretsTree(t)
	t.Run("own ref", func(t *testing.T) {
		s, fm := modelRouteSandbox(t, askModels, "", "alice-key")
		res, out, stderr, err := s.launch(t, SecretsDir(dir))
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("launch: %v (exit %d)\nstderr: %s", err, res.ExitCode, stderr)
		}
		if !strings.Contains(out, "models: HTTP/1.0 200 OK") {
			t.Errorf("the model did not take the deployment's key (it saw %d requests):\n%s", len(fm.Requests()), out)
		}
		s.assertClean(t)
	})
	t.Run("another deployment's ref", func(t *testing.T) {
		s, _ := modelRouteSandbox(t, askModels, `{"credential":{"secretRef":"bob/fake-llm"}}`, "bob-key")
		_, _, _, err := s.launch(t, SecretsDir(dir))
		wantUnavailableIs(t, err, diag.LaunchSecret)
		if !errors.Is(err, ErrSecretUnknown) {
			t.Errorf("refused for %v, want ErrSecretUnknown", err)
		}
		if strings.Contains(err.Error(), "bob-key") {
			t.Error("the refusal carries B's value")
		}
		s.assertNotStarted(t)
	})
}

// A bundle with a placeholder (edited in, digests recomputed, so it
// verifies) or the secret slot compilers wrote before the model route is
// refused with its code before any secret is read or runsc starts; the
// old launcher would have put the key in the agent's argv, or in its
// environment. Control: the same bundle unedited runs.
func TestLaunchRefusesPlaceholders(t *testing.T) {
	ph := bundle.SecretPlaceholder("alice/fake-llm")
	for name, c := range map[string]struct {
		edit func(t *testing.T, dir string)
		code diag.Code
	}{
		"argv": {func(t *testing.T, dir string) {
			testbundle.Rewrite(t, dir, bundle.ConfigFile, func(cfg []byte) []byte {
				return bytes.Replace(cfg, []byte(`"-c",`), []byte(`"-c", "`+ph+`",`), 1)
			})
		}, diag.SecretMarker},
		"cwd": {func(t *testing.T, dir string) {
			testbundle.Rewrite(t, dir, bundle.ConfigFile, func(cfg []byte) []byte {
				return bytes.Replace(cfg, []byte(`"cwd": "`), []byte(`"cwd": "/`+ph), 1)
			})
		}, diag.SecretMarker},
		"legacy slot": {func(t *testing.T, dir string) { testbundle.SecretSlot(t, dir, "FAKE_LLM_KEY", "alice/fake-llm") }, diag.SecretSlot},
		"control":     {func(*testing.T, string) {}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			s := compileScriptFacts(t, keyEcho, "", directModel)
			c.edit(t, s.bundle)
			asked := 0
			_, out, _, err := s.launch(t, func(d, r string) ([]byte, error) { asked++; return staticSecret("s3cr3t-value")(d, r) })
			if asked > 0 {
				t.Errorf("the secret source was asked %d times", asked)
			}
			if c.code == "" {
				if err != nil || !strings.Contains(out, "key=[]") {
					t.Fatalf("control: %v, output %q", err, out)
				}
				return
			}
			wantUnavailableIs(t, err, diag.PreflightBundleValid, c.code)
			s.assertNotStarted(t)
		})
	}
}

// keyEcho prints the credential's env variable: empty unless something
// filled it.
const keyEcho = `echo "key=[$FAKE_LLM_KEY]"`
