package launcher

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// secretsTree makes a secrets dir holding two deployments' secrets, as an
// operator would: root-owned, 0700 directories, 0600 files.
func secretsTree(t *testing.T) string {
	t.Helper()
	skip.UnlessRoot(t, "the secrets dir must be owned by root")
	dir := filepath.Join(t.TempDir(), "secrets")
	for p, v := range map[string]string{
		"host-alice/alice/fake-llm": "alice-key\n",
		"host-bob/bob/fake-llm":     "bob-key",
		"dep:v1.2/k":                "colon-key",
	} {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestSecretsDirScopedPerDeployment(t *testing.T) {
	dir := secretsTree(t)
	src := SecretsDir(dir)
	for _, c := range []struct{ dep, ref, want string }{
		{"host-alice", "alice/fake-llm", "alice-key"}, // trailing newline trimmed
		{"host-bob", "bob/fake-llm", "bob-key"},
		{"dep:v1.2", "k", "colon-key"}, // ids may hold ':' and '.'
	} {
		v, err := src(c.dep, c.ref)
		if err != nil || string(v) != c.want {
			t.Errorf("%s %s: %v (value matches: %v)", c.dep, c.ref, err, string(v) == c.want)
		}
	}
	// A's facts naming B's ref find nothing, and the error names no ref of
	// B's directory and no value.
	for _, c := range []struct{ dep, ref string }{
		{"host-alice", "bob/fake-llm"},
		{"host-alice", "host-bob/bob/fake-llm"},
		{"host-carol", "bob/fake-llm"},
	} {
		v, err := src(c.dep, c.ref)
		if err == nil || v != nil {
			t.Fatalf("%s resolved %s", c.dep, c.ref)
		}
		if !errors.Is(err, ErrSecretUnknown) {
			t.Errorf("%s %s: want ErrSecretUnknown, got %v", c.dep, c.ref, err)
		}
		// Values never; names only those the request itself gave.
		for _, leak := range []string{"bob-key", "alice-key", "host-bob", "alice/fake-llm", "dep:v1.2"} {
			if strings.Contains(err.Error(), leak) && !strings.Contains(c.dep+" "+c.ref, leak) {
				t.Errorf("%s %s: error %q names %q", c.dep, c.ref, err, leak)
			}
		}
	}
	// Escapes and non-ids are refused before anything is opened.
	for _, c := range []struct{ dep, ref string }{
		{"..", "host-bob/bob/fake-llm"}, {".", "host-bob/bob/fake-llm"}, {"host-alice/../host-bob", "bob/fake-llm"},
		{"", "bob/fake-llm"}, {"host-alice", "../host-bob/bob/fake-llm"}, {"host-alice", "alice/../../host-bob/bob/fake-llm"},
		{"host-alice", "/host-bob/bob/fake-llm"}, {"host-alice", ""}, {"host-alice", "alice//fake-llm"},
	} {
		if _, err := src(c.dep, c.ref); err == nil {
			t.Errorf("deployment %q ref %q resolved", c.dep, c.ref)
		}
	}
}

func TestSecretsDirRefusesLinksAndLoosePermissions(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, dir string)
	}{
		{"deployment dir is a symlink to another's", func(t *testing.T, dir string) {
			must(t, os.Rename(filepath.Join(dir, "host-alice"), filepath.Join(dir, "alice-old")))
			must(t, os.Symlink("host-bob", filepath.Join(dir, "host-alice")))
			must(t, os.MkdirAll(filepath.Join(dir, "host-bob/alice"), 0o700))
			must(t, os.WriteFile(filepath.Join(dir, "host-bob/alice/fake-llm"), []byte("bob-key"), 0o600))
		}},
		{"secret is a symlink", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "host-alice/alice/fake-llm")
			must(t, os.Remove(p))
			must(t, os.Symlink("../../host-bob/bob/fake-llm", p))
		}},
		{"intermediate dir is a symlink", func(t *testing.T, dir string) {
			must(t, os.RemoveAll(filepath.Join(dir, "host-alice/alice")))
			must(t, os.Symlink("../host-bob/bob", filepath.Join(dir, "host-alice/alice")))
		}},
		{"secret readable by group", func(t *testing.T, dir string) {
			must(t, os.Chmod(filepath.Join(dir, "host-alice/alice/fake-llm"), 0o640))
		}},
		{"secret not owned by root", func(t *testing.T, dir string) {
			must(t, os.Chown(filepath.Join(dir, "host-alice/alice/fake-llm"), 1000, 1000))
		}},
		{"deployment dir writable by others", func(t *testing.T, dir string) {
			must(t, os.Chmod(filepath.Join(dir, "host-alice"), 0o777))
		}},
		{"deployment dir not owned by root", func(t *testing.T, dir string) {
			must(t, os.Chown(filepath.Join(dir, "host-alice"), 1000, 1000))
		}},
		{"ref dir writable by group", func(t *testing.T, dir string) {
			must(t, os.Chmod(filepath.Join(dir, "host-alice/alice"), 0o770))
		}},
		{"secrets dir writable by others", func(t *testing.T, dir string) {
			must(t, os.Chmod(dir, 0o757))
		}},
		{"secret is a directory", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "host-alice/alice/fake-llm")
			must(t, os.Remove(p))
			must(t, os.Mkdir(p, 0o700))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := secretsTree(t)
			if v, err := SecretsDir(dir)("host-alice", "alice/fake-llm"); err != nil || string(v) != "alice-key" {
				t.Fatalf("before the change: %v", err)
			}
			c.setup(t, dir)
			v, err := SecretsDir(dir)("host-alice", "alice/fake-llm")
			if err == nil {
				t.Fatalf("resolved (B's value: %v)", bytes.Equal(v, []byte("bob-key")))
			}
			if strings.Contains(err.Error(), "bob-key") || strings.Contains(err.Error(), "alice-key") {
				t.Errorf("error carries a value: %v", err)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
