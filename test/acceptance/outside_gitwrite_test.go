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
		}
		cases = append(cases, GitWriteCase{Surface: s.Name, Effect: s.Effect, SandboxRepo: planted["repo-"+s.Name], SandboxStore: planted["store-"+s.Name],
			ContainedWon: contained.Won[s.Name], ControlWon: control.Won[s.Name], ImportRefused: importNote, ContainedNotes: contained.Failed})
	}
	a.Cases = cases
	a.Evidence = fmt.Sprintf("contained: every plant in the repository refused, each landed in the store, the import refused the store (%s); control: %d of %d surfaces took", diagCodes(dl), a.ControlRun.Wins, a.ControlRun.Attempts)
	return []OutsideAttack{a}
}

func diagCodes(l diag.List) string {
	var cs []string
	for _, d := range l {
		cs = append(cs, string(d.Code))
	}
	return strings.Join(cs, ",")
}
