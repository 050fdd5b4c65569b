package launcher

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/gitplant"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/gitimport"
)

// Issue 30's write-side plants (gitplant.WriteScript), from inside the
// pinned runsc with the compiled layout of a real linked worktree (busybox
// only): in the repository and in the agent's store, a reflog made a
// symlink to the deployment user's login script, objects/pack a symlink to
// another repository's packs, main's README overwritten under its id, main
// moved, grafts. Then, as the deployment user on the host, the daemon's
// write-side git in the repository (checkout, commit, merge, gc, a push to
// a local bare repository) and the import. The control plants the same
// into the repository on the host, as issue 19's read-write layout let the
// sandbox do, and the same commands write through or corrupt.
func TestGitWriteSidePlantsInRunsc(t *testing.T) {
	var l *gitplant.WriteLab
	sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(gitplant.WriteScript), Prepare: func(t testing.TB, host string) {
		l = gitplant.NewWriteLab(t, host, 1000)
	}})
	s := sceneSandbox(sc)
	res, out, stderr, err := s.launch(t, staticSecret("sk"))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v %+v\n%s\n%s", err, res, out, stderr)
	}
	t.Logf("sandbox:\n%s", out)
	got := outcomes(out)
	for _, p := range []string{"reflog-symlink", "pack-symlink", "object-overwrite", "ref-move", "replace-ref", "object-delete", "grafts"} {
		if g := got["repo-"+p]; g == "ok" || g == "" {
			t.Errorf("repo-%s: %q, want a refusal (the repository is read-only)", p, g)
		}
		// In its own store the agent may do anything; none of it is read.
		if g := got["store-"+p]; g != "ok" {
			t.Errorf("store-%s: %q, want it planted (the store is the agent's)", p, g)
		}
	}
	contained := l.HostWriteSide(t)
	if contained.Failed != "" {
		t.Errorf("contained: the daemon's write-side git failed: %s", contained.Failed)
	}
	if contained.Corrupted() {
		t.Errorf("contained: the daemon's git was led by the sandbox's plants: %+v", contained.Won)
	}
	_, err = gitimport.Import(context.Background(), gitimport.Options{Repo: l.Common, StateRoot: filepath.Join(l.Host, "srv/paseo/state"), Store: l.Store,
		Agent: "agent-7f3c", Branch: "refs/heads/feature", Base: l.Main, Home: "/nonexistent"})
	var dl diag.List
	if !errors.As(err, &dl) || !slices.ContainsFunc(dl, func(d diag.Diagnostic) bool { return d.Code == diag.GitImportStore }) {
		t.Errorf("the import of the planted store: %v, want %s", err, diag.GitImportStore)
	}
	s.assertClean(t)

	// The control: the same plants in the repository, on the host.
	// One fresh lab per surface, so no plant spoils another's command.
	for _, sf := range gitplant.WriteSurfaces {
		c := gitplant.NewWriteLab(t, t.TempDir(), 1000)
		c.PlantOnHost(t, sf.Name)
		if control := c.HostWriteSide(t); !control.Won[sf.Name] {
			t.Errorf("control: %s did not take where nothing protects (%s): %+v", sf.Name, sf.Effect, control)
		}
	}
}
