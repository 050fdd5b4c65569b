package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// The pi-session profile's own start script (policy/profiles/pi-session.cue),
// run as compiled in a real sandbox with a stand-in pi that reports what it
// found: the image's jiti seed copied into the sandbox's private /tmp, and
// the worktree's private Git dir seeded from the real one, its commondir
// the agent's Git store, which gets the repository's objects as its
// alternate and, at its first launch only, the repository's refs. When
// the seed cannot be read whole, the private Git dir is left empty and
// stderr says why, so Git in the sandbox finds no HEAD without its index.
func TestProfileStartSeeds(t *testing.T) {
	const pi = `#!/bin/busybox sh
b=/bin/busybox
echo "args=$*"
echo "jiti=$($b ls -A /tmp/jiti | $b tr '\n' ' ')"
echo "jiti-owner=$($b stat -c %u /tmp/jiti/entry.mjs)"
echo "git=$($b ls -A "$PASEO_GIT_DIR" | $b tr '\n' ' ')"
echo "head=$($b cat "$PASEO_GIT_DIR/HEAD" 2>&1)"
echo "commondir=$($b cat "$PASEO_GIT_DIR/commondir" 2>&1)"
echo "alternates=$($b cat /run/paseo/git-store/objects/info/alternates 2>&1)"
echo "store-refs=$($b ls -A /run/paseo/git-store/refs/heads 2>&1 | $b tr '\n' ' ')"
echo "store-feature=$($b cat /run/paseo/git-store/refs/heads/feature 2>&1)"
`
	piFile := filepath.Join(t.TempDir(), "pi")
	seedFile := filepath.Join(t.TempDir(), "entry.mjs")
	writeFileT(t, piFile, pi)
	writeFileT(t, seedFile, "export {}\n")
	for _, tc := range []struct {
		name       string
		unreadable bool
	}{{"seeded", false}, {"unseedable", true}} {
		t.Run(tc.name, func(t *testing.T) {
			sc := testbundle.New(t, testbundle.Options{
				RootfsFiles: map[string]string{"/usr/local/bin/pi": piFile, "/opt/pi-jiti-seed/entry.mjs": seedFile},
				Prepare: func(t testing.TB, host string) {
					// The daemon's repository and the agent's store, owned
					// by the sandbox user; main and feature at one commit.
					repos := filepath.Join(host, "srv/paseo/repos")
					for _, ref := range []string{"main", "feature"} {
						if err := os.WriteFile(filepath.Join(repos, "proj/.git/refs/heads", ref), []byte(strings.Repeat("1", 40)+"\n"), 0o644); err != nil {
							t.Fatal(err)
						}
					}
					for _, dir := range []string{repos, filepath.Join(host, "srv/paseo/state/pi-git/agent-7f3c")} {
						if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
							if err != nil {
								return err
							}
							return os.Lchown(p, 1000, 1000)
						}); err != nil {
							t.Fatal(err)
						}
					}
					if !tc.unreadable {
						return
					}
					// One seed file as another user's private file: the
					// sandbox user cannot copy it.
					gitdir := filepath.Join(repos, "proj/.git/worktrees/proj-feature/gitdir")
					if err := os.Chown(gitdir, 0, 0); err != nil {
						t.Fatal(err)
					}
					if err := os.Chmod(gitdir, 0o600); err != nil {
						t.Fatal(err)
					}
				}})
			s := sceneSandbox(sc)
			res, out, stderr, err := s.launch(t, staticSecret("sk"))
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("launch: %v %+v\n%s\n%s", err, res, out, stderr)
			}
			got := outcomes(out)
			if !strings.HasPrefix(got["args"], "--mode rpc ") {
				t.Errorf("pi got args %q, want the profile's words after the script", got["args"])
			}
			if got["jiti"] != "entry.mjs " || got["jiti-owner"] != "1000" {
				t.Errorf("/tmp/jiti holds %q owned by %q, want the image's seed copied by the sandbox user", got["jiti"], got["jiti-owner"])
			}
			const warning = "the worktree's Git dir could not be seeded"
			if tc.unreadable {
				if got["git"] != "" || !strings.Contains(stderr, warning) {
					t.Errorf("unseedable: private Git dir holds %q, stderr %q; want it empty and the warning", got["git"], stderr)
				}
			} else {
				if !strings.Contains(got["git"], "HEAD") || !strings.Contains(got["git"], "commondir") || got["head"] != "ref: refs/heads/feature" || strings.Contains(stderr, warning) {
					t.Errorf("seeded: private Git dir holds %q, HEAD %q, stderr %q", got["git"], got["head"], stderr)
				}
				repoObjects := filepath.Join(sc.Host, "srv/paseo/repos/proj/.git/objects")
				if got["commondir"] != "/run/paseo/git-store" || got["alternates"] != repoObjects || got["store-refs"] != "feature main " || got["store-feature"] != strings.Repeat("1", 40) {
					t.Errorf("seeded: commondir %q, store alternates %q, refs %q, feature %q; want the store, the repository's objects, its refs", got["commondir"], got["alternates"], got["store-refs"], got["store-feature"])
				}
				// The agent's branch in its store survives into the next
				// launch: the store is seeded at its first launch only.
				store := filepath.Join(sc.Host, "srv/paseo/state/pi-git/agent-7f3c")
				if err := os.WriteFile(filepath.Join(store, "refs/heads/feature"), []byte(strings.Repeat("2", 40)+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				_, out, stderr, err := s.launch(t, staticSecret("sk"))
				if got := outcomes(out); err != nil || got["store-feature"] != strings.Repeat("2", 40) {
					t.Errorf("second launch: %v, store feature %q, want the agent's; stderr %q", err, got["store-feature"], stderr)
				}
			}
			s.assertClean(t)
		})
	}
}
