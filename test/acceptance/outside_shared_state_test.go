package acceptance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/policy/schema"
)

// Code and settings planted in shared state by a neighbour
//
// A neighbouring agent of the same deployment (same agent dir on the host,
// its own session and cache dirs) plants what a later Pi loads: an
// extension, settings.json, models.json and an auth.json in the agent dir
// (Pi runs extensions/*.ts, the packages settings.json names, and "!command"
// key values), and a forged session log in the victim's session dir and in
// the deployment-wide one (replayed on resume, scanned for imports). A win is
// the planted file on the host where the victim's next Pi reads it. The
// product gives the neighbour the agent dir as a private projection and a
// session dir of its own; each control is the neighbour's own bundle with
// just one of those undone (the old read-write agent dir bind; the old
// deployment-wide session dir), run by runsc directly.

func init() { registerOutside("shared-state", sharedStateAttacks) }

// agentDirTargets are the files the neighbour plants in the agent dir.
var agentDirTargets = []string{"extensions/planted.ts", "settings.json", "models.json", "auth.json"}

const (
	neighbourID = "agent-n1"
	victimID    = "agent-7f3c" // the base facts' agent
)

type sharedState struct {
	s                              *scene
	agentDir, sessions, victimSess string
	marker                         string
	neighbourSess, neighbourCache  string
	neighbourGit                   string   // its own Git store (state.gitStore), named for it
	sessionTargets                 []string // host paths
}

func sharedStateAttacks(t *testing.T, s *scene) []OutsideAttack {
	st := &sharedState{s: s, marker: "plant-" + randomHex(8)}
	st.agentDir = filepath.Join(s.host, "srv/paseo/state/pi-agent")
	st.sessions = filepath.Join(s.host, "srv/paseo/state/pi-sessions")
	st.victimSess = filepath.Join(st.sessions, victimID)
	st.neighbourSess = filepath.Join(st.sessions, neighbourID)
	st.neighbourCache = filepath.Join(s.host, "srv/paseo/state/pi-cache", neighbourID)
	st.neighbourGit = filepath.Join(s.host, "srv/paseo/state/pi-git", neighbourID)
	st.sessionTargets = []string{filepath.Join(st.victimSess, "forged.jsonl"), filepath.Join(st.sessions, "forged.jsonl")}
	for _, d := range []string{st.neighbourSess, st.neighbourCache, st.neighbourGit, st.victimSess} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	nb := st.neighbour(t)
	// Compiled once, before any plant: a compile rebuilds the base tree,
	// which would put the daemon's files back.
	victim := st.victim(t)
	// The daemon owns its state as the sandbox uid (as in e2e), so only the
	// grant, never a permission bit, stands between the neighbour and it.
	st.chown(t)

	agent := OutsideAttack{Name: "neighbour-plants-agent-dir", Attacker: "neighbour-sandbox",
		Goal:    "a neighbour writes an extension, settings.json, models.json and a command-running auth.json into the deployment's agent dir, where the next agent's Pi loads them",
		Control: "the neighbour's bundle with the agent dir bound read-write (the old grant) instead of the private projection, run by runsc directly"}
	sess := OutsideAttack{Name: "neighbour-plants-session-log", Attacker: "neighbour-sandbox",
		Goal:    "a neighbour writes a forged session log into the victim agent's session dir and the deployment-wide one, which the victim's Pi replays on resume",
		Control: "the neighbour's bundle with the deployment-wide session dir (the old reference layout), run by runsc directly"}

	// Product: the neighbour's launch, then what the victim's sandbox sees.
	out := st.launch(t, nb)
	st.tally(t, out, &agent.Contained, &sess.Contained)
	seen := st.victimSees(t, victim)
	st.reset(t)
	// Product: the old layout's deployment-wide session dir does not compile.
	sess.Contained.Attempts++
	if st.sharedSessionRefused(t, nb) {
		sess.Contained.Refusals++
	}

	// Controls: one protection undone each.
	out = st.rawRun(t, nb, func(m map[string]any) map[string]any { return st.oldAgentDir(m) })
	st.tally(t, out, &agent.ControlRun, nil)
	// A planted auth.json refuses the victim's next api-key launch outright
	// (PP-CRED-AUTHFILE-PRESENT); without it, count what the victim loads.
	if err := os.RemoveAll(st.agentDir + "/auth.json"); err != nil {
		t.Fatal(err)
	}
	ctlSeen := st.victimSees(t, victim)
	st.reset(t)
	out = st.rawRun(t, nb, func(m map[string]any) map[string]any { return st.sharedSessions(m) })
	st.tally(t, out, nil, &sess.ControlRun)
	st.reset(t)

	agent.Evidence = fmt.Sprintf("the victim's product sandbox read %d planted agent-dir files after the contained neighbour, %d after the control (its planted auth.json removed first: it refuses the victim's launch)", seen, ctlSeen)
	sess.Evidence = "contained refusals: writes the neighbour's sandbox saw fail, and the deployment-wide session dir refused at compile (PP-STATE-SHARED)"
	return []OutsideAttack{agent, sess}
}

// neighbour compiles the neighbour's bundle: the product's pi-session
// profile running a busybox script that plants every target.
func (st *sharedState) neighbour(t *testing.T) *testbundle.Scene {
	var sh []string
	for _, rel := range agentDirTargets {
		p := st.agentDir + "/" + rel
		sh = append(sh, fmt.Sprintf(`mkdir -p %s 2>/dev/null; if echo '{"planted":"%s"}' > %s 2>/dev/null; then echo "wrote %s"; else echo "refused %s"; fi`, filepath.Dir(p), st.marker, p, p, p))
	}
	for _, p := range st.sessionTargets {
		sh = append(sh, fmt.Sprintf(`if echo '{"type":"session","planted":"%s"}' > %s 2>/dev/null; then echo "wrote %s"; else echo "refused %s"; fi`, st.marker, p, p, p))
	}
	return testbundle.New(t, testbundle.Options{Host: st.s.host, Argv: testbundle.Script(strings.Join(sh, "\n")),
		FactsPatch: fmt.Sprintf(`{"agent":{"id":%q},"state":{"sessionDir":%q,"cacheDir":%q,"gitStore":%q}}`, neighbourID, st.neighbourSess, st.neighbourCache, st.neighbourGit)})
}

// victim compiles the victim agent's product bundle: a script printing
// every agent-dir target it can read.
func (st *sharedState) victim(t *testing.T) *testbundle.Scene {
	var sh []string
	for _, rel := range agentDirTargets {
		sh = append(sh, "cat "+st.agentDir+"/"+rel+" 2>/dev/null; echo")
	}
	return testbundle.New(t, testbundle.Options{Host: st.s.host, Argv: testbundle.Script(strings.Join(sh, "\n"))})
}

// victimSees launches the victim and counts the planted files it read.
func (st *sharedState) victimSees(t *testing.T, v *testbundle.Scene) int {
	return strings.Count(st.launch(t, v), st.marker)
}

// sharedSessionRefused compiles the neighbour's facts again with the
// deployment-wide session dir, as the reference facts used to name it.
func (st *sharedState) sharedSessionRefused(t *testing.T, nb *testbundle.Scene) bool {
	facts, err := testtree.MergePatch(nb.Facts, []byte(fmt.Sprintf(`{"state":{"sessionDir":%q}}`, st.sessions)))
	if err != nil {
		t.Fatal(err)
	}
	_, diags := compiler.Compile(compiler.Inputs{
		Facts:    schema.Input{Name: "facts.json", Data: facts},
		Registry: schema.Input{Name: "registry.json", Data: nb.Registry},
	}, compiler.Options{})
	for _, d := range diags {
		if d.Code == diag.StateShared && d.Path == "state.sessionDir" {
			return true
		}
	}
	t.Logf("the deployment-wide session dir compiled: %v", diags)
	return false
}

// launch runs a product bundle through the launcher and returns its stdout.
func (st *sharedState) launch(t *testing.T, sb *testbundle.Scene) string {
	res, out, errb := st.s.launch(t, sb)
	if res.ExitCode != 0 {
		t.Fatalf("shared-state sandbox exit %d (%s): %s", res.ExitCode, res.Reason, errb)
	}
	return string(out)
}

// rawRun runs the neighbour's bundle with its config.json changed by edit,
// by runsc directly (the launcher would refuse a bundle that no longer
// matches its manifest, and that is the point: this is the old grant).
func (st *sharedState) rawRun(t *testing.T, nb *testbundle.Scene, edit func(map[string]any) map[string]any) string {
	files, err := bundle.Read(nb.Bundle)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(files[bundle.ConfigFile], &cfg); err != nil {
		t.Fatal(err)
	}
	cfg = edit(cfg)
	if files[bundle.ConfigFile], err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := files.Write(dir); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	id := "ctl-" + randomHex(6)
	cmd := exec.Command(nb.Runsc, "--root", root, "--network=none", "--directfs=false", "run", "--bundle", dir, id)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("control runsc: %v\n%s", err, errb.String())
	}
	_ = exec.Command(nb.Runsc, "--root", root, "delete", "--force", id).Run()
	// runsc leaves an nsfs mount for its network namespace under its root
	// (the launcher unmounts it the same way).
	for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil { // at times stacked
	}
	return out.String()
}

// oldAgentDir puts back the grant this issue removed: the host agent dir
// bound read-write, and no projected files inside it.
func (st *sharedState) oldAgentDir(cfg map[string]any) map[string]any {
	var keep []any
	for _, m := range cfg["mounts"].([]any) {
		mm := m.(map[string]any)
		dst := mm["destination"].(string)
		switch {
		case dst == st.agentDir:
			keep = append(keep, map[string]any{"destination": dst, "type": "bind", "source": st.agentDir, "options": []any{"bind", "rw", "nosuid", "nodev"}})
		case strings.HasPrefix(dst, st.agentDir+"/"):
		default:
			keep = append(keep, mm)
		}
	}
	cfg["mounts"] = keep
	return cfg
}

// sharedSessions binds the deployment-wide session dir where the
// neighbour's own one was, as one dir for every agent used to be.
func (st *sharedState) sharedSessions(cfg map[string]any) map[string]any {
	for _, m := range cfg["mounts"].([]any) {
		mm := m.(map[string]any)
		if mm["destination"] == st.neighbourSess {
			mm["destination"], mm["source"] = st.sessions, st.sessions
		}
	}
	return cfg
}

// tally counts the neighbour's attempts: a target that holds the marker on
// the host afterwards is a win, one the sandbox saw fail a refusal.
func (st *sharedState) tally(t *testing.T, out string, agent, sess *Tally) {
	count := func(tl *Tally, hostPaths []string) {
		for _, p := range hostPaths {
			tl.Attempts++
			if data, err := os.ReadFile(p); err == nil && bytes.Contains(data, []byte(st.marker)) {
				tl.Wins++
			} else if strings.Contains(out, "refused "+p+"\n") {
				tl.Refusals++
			}
		}
	}
	if !strings.Contains(out, "wrote") && !strings.Contains(out, "refused") {
		t.Fatalf("the neighbour's script reported nothing: %q", out)
	}
	if agent != nil {
		var ps []string
		for _, rel := range agentDirTargets {
			ps = append(ps, st.agentDir+"/"+rel)
		}
		count(agent, ps)
	}
	if sess != nil {
		count(sess, st.sessionTargets)
	}
}

// reset removes every plant and gives the daemon's files back their
// contents, so each run starts from the same host state.
func (st *sharedState) reset(t *testing.T) {
	for _, p := range append([]string{st.agentDir + "/auth.json", st.agentDir + "/extensions"}, st.sessionTargets...) {
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"settings.json", "models.json"} {
		if err := os.WriteFile(st.agentDir+"/"+f, []byte("{}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st.chown(t)
}

func (st *sharedState) chown(t *testing.T) {
	for _, d := range []string{st.agentDir, st.sessions, st.neighbourGit} {
		err := filepath.Walk(d, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, 1000, 1000)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
