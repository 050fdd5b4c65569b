package acceptance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/gitplant"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// Git control data planted from inside the sandbox (issue 19)
//
// The Paseo daemon runs git on the host, as the deployment user, in an
// agent's workspace (status, diff, log, rev-parse, worktree list, and a
// fetch from the repository); that git reads control data in Git dirs the
// agent's sandbox can write. For every surface of the gitplant catalogue
// the agent (test/cmd/paseo-gitplanter, plain file operations, no git in
// its image) plants a payload from inside a real sandbox compiled for its
// worktree; then the daemon's command runs on the host as uid 1000, and a
// win is a payload marker. status and diff each get a fresh layout and
// plant, since they refresh and write the index and so can use up what
// would trigger the next command; the commands that write nothing in the
// workspace share one (gitPlantRounds). The control is
// the same planter run on the host as uid 1000, with no sandbox around
// it: it must run the payload under exactly the commands the catalogue
// says (Runs). Surfaces that run nothing are planted and checked too, and
// the effects short of execution some show (Shows: a toplevel the agent
// chose, another store's commits, a token in the daemon's hook) are a
// second attack with the same runs.

func init() { registerOutside("gitplant", gitPlantAttacks) }

// gitPlantUID is the deployment user, who owns the workspaces and runs
// the daemon's git (as the image's sandbox user, registry image.uid).
const gitPlantUID = 1000

// gitPlantDesignRefusals are the compile refusals that are the design's
// answer to a layout; any other refusal fails. The catalogue's layouts are
// compiled clean, before the plant, so none is expected.
var gitPlantDesignRefusals = map[diag.Code]string{
	diag.GitSubmodule: "a gitlink whose path the worktree lacks: its mount point would be made on the host",
}

// GitPlantRow is one surface's record in out/acceptance.json.
type GitPlantRow struct {
	Surface string `json:"surface"`
	// Agent and Host are the worktrees that plant and that host git runs
	// in ("" is the main one); Runs the commands the catalogue says run
	// the payload, Shows those whose output shows its effect.
	Agent    string            `json:"agent_worktree"`
	Host     string            `json:"host_worktree"`
	Runs     []string          `json:"runs"`
	Shows    map[string]string `json:"shows,omitempty"`
	Commands []GitPlantCommand `json:"commands"`
}

// GitPlantCommand is one daemon command after a fresh plant from the
// sandbox (contained) and from the host (control).
type GitPlantCommand struct {
	Command string `json:"command"`
	// Refused is the compiler's refusal of the layout (no sandbox ran).
	Refused []diag.Code `json:"compile_refused,omitempty"`
	// Plants are how the plant went in the sandbox: which step failed,
	// with which errno; then again wherever else the agent sees its
	// repository (where its Git finds it, the read-only view of the real
	// Git dir: gitplant.PlantAsAgent).
	Plants    []gitplant.Outcome `json:"plants"`
	HostError string             `json:"host_error,omitempty"`
	Markers   []string           `json:"markers"`
	Shown     bool               `json:"shown,omitempty"`

	ControlPlants  []gitplant.Outcome `json:"control_plants"`
	ControlError   string             `json:"control_host_error,omitempty"`
	ControlMarkers []string           `json:"control_markers"`
	ControlShown   bool               `json:"control_shown,omitempty"`
}

// TestOutsideGitPlant runs this family on its own and judges it as the
// acceptance proof does (TestAcceptance runs it with the others).
func TestOutsideGitPlant(t *testing.T) {
	testbundle.Prerequisites(t)
	attacks := gitPlantAttacks(t, nil)
	var failed, unsure []string
	judgeOutside(attacks, func(f string, a ...any) { failed = append(failed, fmt.Sprintf(f, a...)) },
		func(f string, a ...any) { unsure = append(unsure, fmt.Sprintf(f, a...)) })
	for _, a := range attacks {
		t.Log(a)
		t.Log(a.Evidence)
	}
	if len(failed)+len(unsure) > 0 {
		t.Errorf("failed: %v\ninconclusive: %v", failed, unsure)
	}
}

func gitPlantAttacks(t *testing.T, _ *scene) []OutsideAttack {
	testbundle.Prerequisites(t)
	planter := testbundle.BuildStatic(t, "./test/cmd/paseo-gitplanter")
	hostPlanter := gitPlanterForUser(t, planter)
	plants := OutsideAttack{Name: "agent-plants-git-control-data", Attacker: "agent",
		Goal:    "from its sandbox, plant a payload on each Git control surface of the gitplant catalogue, by plain file operations, so that the daemon's host git (status, diff, log, rev-parse, worktree list, a fetch) runs it as the deployment user",
		Control: "the same planter run on the host as the deployment user, with no sandbox around it (the catalogue's controls)"}
	shows := OutsideAttack{Name: "agent-redirects-host-git-through-git-data", Attacker: "agent",
		Goal:    "from its sandbox, plant Git data that changes what the daemon's host git shows without running anything: a toplevel of the agent's choice, commits from another workspace's store, a token in the daemon's fsmonitor hook",
		Control: "the same planter run on the host as the deployment user, with no sandbox around it"}
	// The surfaces are independent (a lab, layouts and sandboxes each), so
	// they run in parallel; the group returns when all have.
	rows := make([]GitPlantRow, len(gitplant.Surfaces))
	done := make([]bool, len(gitplant.Surfaces))
	t.Run("gitplant", func(t *testing.T) {
		for i, s := range gitplant.Surfaces {
			t.Run(subtestName(s.Name), func(t *testing.T) {
				t.Parallel()
				row, lab := plantSurface(t, planter, hostPlanter, s)
				t.Log(row.summary(lab))
				rows[i], done[i] = row, true
			})
		}
	})
	var ranIn, ranCtl, claimed, commands int
	var kept []GitPlantRow
	for i, s := range gitplant.Surfaces {
		if !done[i] {
			continue // its subtest failed, and with it the test
		}
		row := rows[i]
		kept = append(kept, row)
		won, refused, shown, ctlWon, ctlShown := false, true, false, false, false
		for _, c := range row.Commands {
			commands++
			if len(c.Markers) > 0 {
				won = true
				ranIn++
			}
			if len(c.ControlMarkers) > 0 {
				ctlWon = true
				ranCtl++
			}
			refused = refused && (c.Refused != nil || !anyPlanted(c.Plants))
			shown, ctlShown = shown || c.Shown, ctlShown || c.ControlShown
		}
		claimed += len(s.Runs)
		gitPlantCount(&plants, won, refused, ctlWon)
		if len(s.Shows) > 0 {
			gitPlantCount(&shows, shown, refused, ctlShown)
		}
	}
	plants.Evidence = fmt.Sprintf("one attempt per surface (%d); a payload ran under %d of %d host commands after a plant from the sandbox, under %d after the same plant on the host (the catalogue claims %d)",
		len(gitplant.Surfaces), ranIn, commands, ranCtl, claimed)
	plants.Cases = kept
	shows.Evidence = "one attempt per surface with a Shows effect; a win is the effect in the host command's output"
	return []OutsideAttack{plants, shows}
}

// gitPlantCount adds one surface's attempt on each side: a win, else a refusal
// when the sandbox's plant was stopped everywhere it tried.
func gitPlantCount(a *OutsideAttack, won, refused, ctlWon bool) {
	a.Contained.Attempts++
	a.ControlRun.Attempts++
	switch {
	case won:
		a.Contained.Wins++
	case refused:
		a.Contained.Refusals++
	}
	if ctlWon {
		a.ControlRun.Wins++
	}
}

// plantSurface runs every daemon command on s after a fresh plant from the
// sandbox and after one from the host.
func plantSurface(t *testing.T, planter, hostPlanter string, s gitplant.Surface) (GitPlantRow, string) {
	lab := gitplant.New(t)
	lab.RunAs(t, gitPlantUID, gitPlantUID)
	row := GitPlantRow{Surface: s.Name, Agent: s.Agent, Host: s.Host, Runs: s.Runs, Shows: s.Shows}
	if row.Runs == nil {
		row.Runs = []string{}
	}
	gitPlantBaseline(t, lab, s)
	for _, round := range gitPlantRounds() {
		recs := make([]GitPlantCommand, len(round))
		r, p := lab.Prepared(t, s)
		sb, refused := gitPlantCompile(t, planter, s, p)
		var plants []gitplant.Outcome
		if sb != nil {
			plants = gitPlantInSandbox(t, sb)
		}
		for i, c := range round {
			res := gitPlantHostRun(t, lab, c, r.Worktree(s.Host))
			recs[i] = GitPlantCommand{Command: c.Name, Refused: refused, Plants: plants,
				HostError: errText(res.Err), Markers: res.Markers, Shown: shownIn(s, c, res)}
		}

		r, p = lab.Prepared(t, s)
		ctl := gitPlantOnHost(t, hostPlanter, s, p)
		if len(ctl) != 1 || !ctl[0].Planted {
			t.Errorf("the control's plant on the host: %+v", ctl)
		}
		for i, c := range round {
			res := gitPlantHostRun(t, lab, c, r.Worktree(s.Host))
			recs[i].ControlPlants, recs[i].ControlError, recs[i].ControlMarkers, recs[i].ControlShown = ctl, errText(res.Err), res.Markers, shownIn(s, c, res)
		}
		row.Commands = append(row.Commands, recs...)
	}
	for i := range row.Commands {
		rec := &row.Commands[i]

		// A plant from the sandbox that leaves the repository broken where
		// the control's does not would stop host git before any payload
		// could run, and pass for contained.
		if rec.HostError != "" && rec.ControlError == "" {
			t.Errorf("%s failed on the host after the sandbox's plant (%s) but not after the control's", rec.Command, rec.HostError)
		}
		if rec.Markers == nil {
			rec.Markers = []string{}
		}
		if rec.ControlMarkers == nil {
			rec.ControlMarkers = []string{}
		}
		t.Logf("%s: sandbox plant %s; markers %v (control %v); host git error %q (control %q)", rec.Command, outcomeText(rec.Plants, rec.Refused), rec.Markers, rec.ControlMarkers, rec.HostError, rec.ControlError)
	}
	// The control must be the catalogue's: the payload runs under exactly
	// its commands, and its effect shows where it says; else the surface
	// proves nothing here.
	var ran []string
	for _, c := range row.Commands {
		if len(c.ControlMarkers) > 0 {
			ran = append(ran, c.Command)
		}
		if _, ok := s.Shows[c.Command]; ok && !c.ControlShown {
			t.Errorf("control: %s did not show %q", c.Command, s.Shows[c.Command])
		}
	}
	if !slices.Equal(ran, s.Runs) {
		t.Errorf("control: the payload ran under %v, the catalogue says %v", ran, s.Runs)
	}
	return row, lab.Dir
}

// gitPlantRounds are the daemon's commands in the order they run, one
// round per plant: status and diff refresh the index and may write it, so
// each has a plant of its own; log, rev-parse, worktree list and the
// fetch (upload-pack in the workspace) write nothing there, so they share
// one. The controls, run in the same rounds, must still find what the
// catalogue found with a plant per command.
func gitPlantRounds() [][]gitplant.Command {
	var rounds [][]gitplant.Command
	var readOnly []gitplant.Command
	for _, c := range gitplant.Commands {
		switch c.Name {
		case "status", "diff":
			rounds = append(rounds, []gitplant.Command{c})
		case "log", "rev-parse", "worktree-list", "fetch":
			readOnly = append(readOnly, c)
		default:
			panic("gitplant command " + c.Name + " has no round: say whether it writes in the workspace")
		}
	}
	return append(rounds, readOnly)
}

// gitPlantBaseline runs every daemon command as the deployment user on an
// unplanted layout and requires it to work: a host git that refused the
// tree (dubious ownership, an unreadable dir) would run no payload either,
// and the contained runs would prove nothing.
func gitPlantBaseline(t *testing.T, lab *gitplant.Lab, s gitplant.Surface) {
	r := lab.Build(t, s.Layout)
	wt := r.Worktree(s.Host)
	for _, c := range gitplant.Commands {
		res := gitPlantHostRun(t, lab, c, wt)
		if res.Err != nil || len(res.Markers) > 0 {
			t.Fatalf("baseline %s in %s as uid %d: err %v, markers %v\n%s", c.Name, wt, gitPlantUID, res.Err, res.Markers, res.Out)
		}
		want := map[string]string{"rev-parse": wt + "\n", "log": "commit ", "worktree-list": r.Main + " "}[c.Name]
		if !strings.Contains(res.Out, want) {
			t.Fatalf("baseline %s in %s printed %q, want it to hold %q", c.Name, wt, res.Out, want)
		}
	}
}

// gitPlantHostRun is one daemon command on the host as the deployment
// user; git refusing to run at all fails the test, for the baseline's reason.
func gitPlantHostRun(t *testing.T, lab *gitplant.Lab, c gitplant.Command, wt string) gitplant.Result {
	res := lab.Run(t, c, wt)
	if strings.Contains(res.Out, "dubious ownership") || strings.Contains(res.Out, "safe.directory") {
		t.Fatalf("host git %s refused the tree itself: %s", c.Name, res.Out)
	}
	return res
}

// gitPlantCompile compiles the product bundle for the agent's worktree:
// its Git facts as the daemon would give them, the lab as the workspace
// root, and the reviewed pi-session profile as it is, whose start script
// seeds the private Git dir and then runs "pi": the planter, with its job
// in the image. refused holds the compiler's codes when it refused the
// layout, as the design means it to.
func gitPlantCompile(t *testing.T, planter string, s gitplant.Surface, p gitplant.Plot) (sb *testbundle.Scene, refused []diag.Code) {
	job, _ := json.Marshal(map[string]any{"surface": s.Name, "paths": p.Paths()})
	jobFile := filepath.Join(t.TempDir(), "job.json")
	if err := os.WriteFile(jobFile, job, 0o644); err != nil {
		t.Fatal(err)
	}
	git := map[string]any{"gitdir": p.GitDir, "commondir": nil, "write": true}
	if s.Agent != "" {
		git["commondir"] = p.Common
	}
	facts, _ := json.Marshal(map[string]any{"workspace": map[string]any{"cwd": p.WT, "git": git}})
	reg, _ := json.Marshal(map[string]any{"deployments": map[string]any{"host-alice": map[string]any{"roots": map[string]any{"workspace": []string{p.Lab.Dir}}}}})
	o := testbundle.Options{FactsPatch: string(facts), RegistryPatch: string(reg),
		RootfsFiles: map[string]string{"/bin/pi": planter, "/etc/paseo-gitplanter.json": jobFile}}
	sb, codes, msg := compileCatching(t, o)
	if sb != nil {
		noGitIn(t, sb.Rootfs)
		return sb, nil
	}
	for _, c := range codes {
		if gitPlantDesignRefusals[c] == "" {
			t.Fatalf("the compiler refused the layout, which the design does not mean: %s", msg)
		}
	}
	if len(codes) == 0 {
		t.Fatalf("building the bundle: %s", msg)
	}
	return nil, codes
}

// compileCatching runs testbundle.New, which fails the test on a refusal,
// and returns the refusal's codes instead (typed, from the diagnostics it
// fails with) with its message.
func compileCatching(t *testing.T, o testbundle.Options) (*testbundle.Scene, []diag.Code, string) {
	c := &fatalCatcher{TB: t}
	var sb *testbundle.Scene
	done := make(chan struct{})
	go func() {
		defer close(done)
		sb = testbundle.New(c, o)
	}()
	<-done
	if !c.fatal {
		return sb, nil, ""
	}
	return nil, c.codes, c.msg
}

// fatalCatcher is the test as testbundle sees it, but a Fatal ends only
// testbundle's goroutine and is kept.
type fatalCatcher struct {
	testing.TB
	fatal bool
	msg   string
	codes []diag.Code
}

func (c *fatalCatcher) Fatal(args ...any) { c.stop(fmt.Sprint(args...), args) }
func (c *fatalCatcher) Fatalf(format string, args ...any) {
	c.stop(fmt.Sprintf(format, args...), args)
}

func (c *fatalCatcher) stop(msg string, args []any) {
	c.fatal, c.msg = true, msg
	for _, a := range args {
		if l, ok := a.(diag.List); ok {
			for _, d := range l {
				c.codes = append(c.codes, d.Code)
			}
		}
	}
	runtime.Goexit()
}

// noGitIn fails unless the image is git-free: the agent plants with plain
// file operations, as one with busybox alone could.
func noGitIn(t *testing.T, rootfs string) {
	err := filepath.WalkDir(rootfs, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), "git") {
			t.Fatalf("the sandbox's image has %s", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// gitPlantInSandbox launches the bundle: the planter plants and reports.
func gitPlantInSandbox(t *testing.T, sb *testbundle.Scene) []gitplant.Outcome {
	var out, errb bytes.Buffer
	res, err := launcher.Launch(context.Background(), launcher.Options{
		BundleDir: sb.Bundle, StateRoot: sb.State, RunscPath: sb.Runsc,
		Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
		Stdin:   strings.NewReader(""), Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatalf("launch: %v\nstderr: %s", err, errb.String())
	}
	if res.ExitCode != 0 {
		t.Fatalf("the planter in the sandbox exited %d (%s): %s%s", res.ExitCode, res.Reason, out.String(), errb.String())
	}
	return parseOutcomes(t, out.Bytes())
}

// gitPlanterForUser copies the planter where the deployment user can run
// it (BuildStatic's dir is root's alone).
func gitPlanterForUser(t *testing.T, planter string) string {
	dir, err := os.MkdirTemp("", "paseo-gitplanter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data, err := os.ReadFile(planter)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "paseo-gitplanter")
	if err := os.WriteFile(p, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// gitPlantOnHost is the control's plant: the same program on the host as
// the deployment user, with no environment (no PATH: it could find no git).
func gitPlantOnHost(t *testing.T, planter string, s gitplant.Surface, p gitplant.Plot) []gitplant.Outcome {
	paths, _ := json.Marshal(p.Paths())
	cmd := exec.Command(planter, s.Name, string(paths))
	cmd.Dir, cmd.Env = p.WT, []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: gitPlantUID, Gid: gitPlantUID, Groups: []uint32{}}}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the planter on the host: %v\n%s", err, errb.String())
	}
	return parseOutcomes(t, out)
}

// parseOutcomes reads the planter's lines: one outcome per plant, at
// least one, none crashed.
func parseOutcomes(t *testing.T, out []byte) []gitplant.Outcome {
	var outs []gitplant.Outcome
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var o gitplant.Outcome
		if err := json.Unmarshal([]byte(line), &o); err != nil || o.Surface == "" {
			t.Fatalf("the planter's report: %v\n%s", err, out)
		}
		if o.Panic != "" {
			t.Fatalf("the plant crashed: %s", o.Panic)
		}
		if !o.WorktreeWritable {
			t.Fatalf("the planter could not write in the agent's worktree: %+v", o)
		}
		outs = append(outs, o)
	}
	return outs
}

func anyPlanted(outs []gitplant.Outcome) bool {
	return slices.ContainsFunc(outs, func(o gitplant.Outcome) bool { return o.Planted })
}

// summary is the row in a line: where the sandbox's plant stopped, and
// which commands ran a payload after it and after the control's.
func (r GitPlantRow) summary(lab string) string {
	// Each command had a layout of its own: $WS stands for its root.
	ws := regexp.MustCompile(regexp.QuoteMeta(lab) + `/ws[0-9]+`)
	plants := map[string]bool{}
	var in, ctl []string
	for _, c := range r.Commands {
		plants[ws.ReplaceAllString(outcomeText(c.Plants, c.Refused), "$$WS")] = true
		if len(c.Markers) > 0 {
			in = append(in, fmt.Sprintf("%s%v", c.Command, c.Markers))
		}
		if len(c.ControlMarkers) > 0 {
			ctl = append(ctl, c.Command)
		}
	}
	var ps []string
	for p := range plants {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return fmt.Sprintf("sandbox plant %s; payload ran after it under %v; after the control's under %v", strings.Join(ps, " | "), in, ctl)
}

// subtestName keeps the surface's name to what a temp dir path may hold:
// runsc's overlay refuses an image root with ',' or ':' in its path, and
// t.TempDir names its dirs after the test.
func subtestName(name string) string {
	return strings.Trim(unsafeInPath.ReplaceAllString(name, "_"), "_")
}

var unsafeInPath = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func shownIn(s gitplant.Surface, c gitplant.Command, res gitplant.Result) bool {
	want, ok := s.Shows[c.Name]
	return ok && strings.Contains(res.Out, want)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func outcomeText(outs []gitplant.Outcome, refused []diag.Code) string {
	if refused != nil {
		return fmt.Sprintf("not made: the compiler refused the layout %v", refused)
	}
	var parts []string
	for _, o := range outs {
		at := ""
		if len(outs) > 1 {
			at = fmt.Sprintf(" (Git dir %s, repository %s)", o.GitDir, o.Common)
		}
		if o.Planted {
			parts = append(parts, "made in full"+at)
		} else {
			parts = append(parts, fmt.Sprintf("stopped at %s (%s)%s", o.Step, o.Errno, at))
		}
	}
	return strings.Join(parts, "; ")
}
