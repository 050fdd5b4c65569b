package acceptance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/gitplant"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/gitimport"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// Git data planted from inside the sandbox (issue 30)
//
// Host git writes into and trusts the repository's objects, refs and
// reflogs, which issue 19's layout shared read-write with every sandbox.
// From a real sandbox compiled for a real linked worktree (busybox only)
// the agent plants each of gitplant.WriteSurfaces in the repository and in
// its own Git store; then the daemon's write-side git (checkout, commit,
// merge of the agent's branch, gc, a push to a local bare repository) runs
// on the host as the deployment user, and git import reads the store. A
// win is the surface's effect (gitplant.WriteSurfaces). The control plants
// the same into the repository on the host as the deployment user, as the
// read-write layout let a sandbox do.

func init() { registerOutside("gitwrite", gitWriteAttacks) }

// GitWriteCase is one surface's record in out/acceptance.json.
type GitWriteCase struct {
	Surface        string `json:"surface"`
	Effect         string `json:"effect"`
	SandboxRepo    string `json:"sandbox_plant_in_repository"`
	SandboxStore   string `json:"sandbox_plant_in_store"`
	ContainedWon   bool   `json:"contained_won"`
	ControlWon     bool   `json:"control_won"`
	ImportRefused  string `json:"import,omitempty"`
	ContainedNotes string `json:"contained_host_failures,omitempty"`
}

func TestOutsideGitWrite(t *testing.T) {
	testbundle.Prerequisites(t)
	attacks := gitWriteAttacks(t, nil)
	var failed, unsure []string
	judgeOutside(attacks, func(f string, a ...any) { failed = append(failed, fmt.Sprintf(f, a...)) },
		func(f string, a ...any) { unsure = append(unsure, fmt.Sprintf(f, a...)) })
	for _, a := range attacks {
		t.Log(a)
	}
	if len(failed)+len(unsure) > 0 {
		t.Errorf("failed: %v\ninconclusive: %v", failed, unsure)
	}
}

func gitWriteAttacks(t *testing.T, _ *scene) []OutsideAttack {
	testbundle.Prerequisites(t)
	a := OutsideAttack{Name: "agent-plants-git-data-write-side", Attacker: "agent",
		Goal:    "from its sandbox, plant in the repository's objects, refs and reflogs (and in its own Git store) so that the daemon's write-side host git (checkout, commit, merge, gc, push) writes through a symlink into the deployment user's files, takes another repository's objects, reads history changed under the same ids or replaced (refs/replace), loses an object, or that main moves",
		Control: "each plant alone in the repository on the host as the deployment user, as issue 19's read-write objects/, refs/ and logs/ allowed"}
	var l *gitplant.WriteLab
	sb := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(gitplant.WriteScript), Prepare: func(t testing.TB, host string) {
		l = gitplant.NewWriteLab(t, host, gitPlantUID)
	}})
	var out, errb bytes.Buffer
	res, err := launcher.Launch(context.Background(), launcher.Options{
		BundleDir: sb.Bundle, StateRoot: sb.State, RunscPath: sb.Runsc,
		Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
		Stdin:   strings.NewReader(""), Stdout: &out, Stderr: &errb,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v %+v\n%s", err, res, errb.String())
	}
	planted := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			planted[k] = v
		}
	}
	contained := l.HostWriteSide(t)
	if contained.Failed != "" {
		t.Errorf("the daemon's write-side git failed after the sandbox's plants: %s", contained.Failed)
	}
	_, ierr := gitimport.Import(context.Background(), gitimport.Options{Repo: l.Common, StateRoot: filepath.Join(l.Host, "srv/paseo/state"), Store: l.Store,
		Agent: "agent-7f3c", Branch: "refs/heads/feature", Base: l.Main, Home: "/nonexistent"})
	var dl diag.List
	importNote := fmt.Sprint(ierr)
	if !errors.As(ierr, &dl) || !slices.ContainsFunc(dl, func(d diag.Diagnostic) bool { return d.Code == diag.GitImportStore }) {
		t.Errorf("the import of the planted store: %v, want %s", ierr, diag.GitImportStore)
	}

	var cases []GitWriteCase
	for _, s := range gitplant.WriteSurfaces {
		// One fresh lab per surface, so no plant spoils another's command.
		c := gitplant.NewWriteLab(t, t.TempDir(), gitPlantUID)
		c.PlantOnHost(t, s.Name)
		control := c.HostWriteSide(t)
		a.Contained.Attempts++
		a.ControlRun.Attempts++
		if planted["repo-"+s.Name] != "ok" {
			a.Contained.Refusals++ // the read-only repository refused the plant itself
		}
		if contained.Won[s.Name] {
			a.Contained.Wins++
		}
		if control.Won[s.Name] {
			a.ControlRun.Wins++
		} else {
			t.Errorf("control: %s did not take where nothing protects (%s): %+v", s.Name, s.Effect, control)
		}
		cases = append(cases, GitWriteCase{Surface: s.Name, Effect: s.Effect, SandboxRepo: planted["repo-"+s.Name], SandboxStore: planted["store-"+s.Name],
			ContainedWon: contained.Won[s.Name], ControlWon: control.Won[s.Name], ImportRefused: importNote, ContainedNotes: contained.Failed})
	}
	a.Cases = cases
	a.Evidence = fmt.Sprintf("contained: every plant in the repository refused, each landed in the store, the import refused the store (%s); control: %d of %d surfaces took", diagCodes(dl), a.ControlRun.Wins, a.ControlRun.Attempts)
	return []OutsideAttack{a, gitStoreForgeAttack(t)}
}

// GitStoreForgeCase is one forged index's record in out/acceptance.json.
type GitStoreForgeCase struct {
	Surface      string `json:"surface"`
	Effect       string `json:"effect"`
	SandboxPlant string `json:"sandbox_plant_in_store"`
	ImportedWon  bool   `json:"imported_won"`
	ControlWon   bool   `json:"control_won"`
}

// gitStoreForgeAttack: from its sandbox the agent leaves its two commits
// in its store with a forged multi-pack-index and commit-graph beside
// them (gitplant.StoreForgeScript); then git import. A win is a forgery
// in the shared repository after the import (or the branch not at the
// agent's tip, or fsck unclean); the control is git reading the store as
// a repository, as a naive import (a fetch from the store) would.
func gitStoreForgeAttack(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "agent-forges-object-indexes-in-its-store", Attacker: "agent",
		Goal:    "from its sandbox, plant a multi-pack-index and a commit-graph in its own Git store that git trusts without re-hashing (a file of its commit answered with another blob, its commit given another tree), so that git import brings the forged content into the shared repository under the commits' ids",
		Control: "git reading the planted store as a repository, as the deployment user (what a fetch from the store would run)"}
	var l *gitplant.WriteLab
	var f gitplant.StoreForge
	sb := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(gitplant.StoreForgeScript), Prepare: func(t testing.TB, host string) {
		l = gitplant.NewWriteLab(t, host, gitPlantUID)
		f = l.PrepareStoreForge(t)
	}})
	var out, errb bytes.Buffer
	res, err := launcher.Launch(context.Background(), launcher.Options{
		BundleDir: sb.Bundle, StateRoot: sb.State, RunscPath: sb.Runsc,
		Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
		Stdin:   strings.NewReader(""), Stdout: &out, Stderr: &errb,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v %+v\n%s", err, res, errb.String())
	}
	planted := map[string]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			planted[k] = v
		}
	}
	if planted["work"] != "ok" {
		t.Fatalf("the agent's commits were not planted in its store: %q", planted["work"])
	}
	ir, ierr := gitimport.Import(context.Background(), gitimport.Options{Repo: l.Common, StateRoot: filepath.Join(l.Host, "srv/paseo/state"), Store: l.Store,
		Agent: "agent-7f3c", Branch: "refs/heads/feature", Base: l.Main, Home: "/nonexistent"})
	if ierr != nil {
		t.Errorf("the import of the agent's commits beside forged indexes: %v", ierr)
	}
	tip, imported := l.Imported(t, f)
	fsckErr := l.Fsck()
	control := l.StoreAsRepository(t, f)
	var cases []GitStoreForgeCase
	for _, s := range gitplant.StoreForgeSurfaces {
		a.Contained.Attempts++
		a.ControlRun.Attempts++
		won := imported[s.Name] || tip != f.Tip || fsckErr != nil || ierr != nil
		if won {
			a.Contained.Wins++
		}
		if control[s.Name] {
			a.ControlRun.Wins++
		} else {
			t.Errorf("control: git reading the store did not show %s (%s)", s.Name, s.Effect)
		}
		cases = append(cases, GitStoreForgeCase{Surface: s.Name, Effect: s.Effect, SandboxPlant: planted[s.Name], ImportedWon: won, ControlWon: control[s.Name]})
	}
	a.Cases = cases
	a.Evidence = fmt.Sprintf("contained: the import indexed %d packs afresh and moved feature to the agent's tip (%v), content as committed, fsck clean (%v); control: %d of %d forgeries shown by git reading the store",
		ir.Packs, tip == f.Tip, fsckErr == nil, a.ControlRun.Wins, a.ControlRun.Attempts)
	return a
}

func diagCodes(l diag.List) string {
	var cs []string
	for _, d := range l {
		cs = append(cs, string(d.Code))
	}
	return strings.Join(cs, ",")
}
