package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	rspec "github.com/opencontainers/runtime-spec/specs-go"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// The run copy of config.json is written once, at start, from the plan's
// decoded spec: nothing writes it while the launch prepares, and what
// runsc gets differs from the reviewed spec in exactly the launch-time
// fields (no secret is filled into it: the environment is as reviewed).
func TestLaunchWritesTheRunSpecOnce(t *testing.T) {
	s := compileScriptFacts(t, "echo ran", "", directModel)
	var reviewed rspec.Spec
	if err := json.Unmarshal(mustReadFile(t, filepath.Join(s.bundle, bundle.ConfigFile)), &reviewed); err != nil {
		t.Fatal(err)
	}
	const id = "pp-write-once"
	runDir := filepath.Join(s.state, "run", id)
	var stop func() map[string]int
	var written []byte
	var out bytes.Buffer
	res, err := Launch(context.Background(), Options{
		BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc, ID: id,
		Secrets: staticSecret("s3cr3t-value"), Stdin: strings.NewReader(""), Stdout: &out,
		afterStaging: func(dir string) {
			if _, err := os.Stat(filepath.Join(dir, bundle.ConfigFile)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the run copy exists before the start: %v", err)
			}
			stop = testbundle.WatchWrites(t, dir)
		},
		OnStart: func() { written = mustReadFile(t, filepath.Join(runDir, bundle.ConfigFile)) },
	})
	if err != nil || res.ExitCode != 0 || !strings.Contains(out.String(), "ran") {
		t.Fatalf("launch: %v (exit %d, output %q)", err, res.ExitCode, out.String())
	}
	if stop == nil || written == nil {
		t.Fatal("the launch never staged or never started")
	}
	if n := stop()[bundle.ConfigFile]; n != 1 {
		t.Errorf("the run copy of config.json was written %d times, want once", n)
	}
	var run rspec.Spec
	if err := json.Unmarshal(written, &run); err != nil {
		t.Fatal(err)
	}
	// Put back what the launch fills in; the rest must be as reviewed.
	if run.Linux.CgroupsPath != statedir.CgroupsPath(id) || run.Root.Path != filepath.Join(runDir, "root", "merged") {
		t.Errorf("cgroups path %q, root %q: not the launch's", run.Linux.CgroupsPath, run.Root.Path)
	}
	run.Linux.CgroupsPath, run.Root.Path = reviewed.Linux.CgroupsPath, reviewed.Root.Path
	staged := 0
	for i, m := range run.Mounts {
		if strings.HasPrefix(m.Source, runDir+"/binds/") {
			run.Mounts[i].Source = reviewed.Mounts[i].Source
			staged++
		}
	}
	if staged == 0 {
		t.Error("no bind points at a staged source")
	}
	if diff := cmp.Diff(reviewed, run); diff != "" {
		t.Errorf("the run copy differs from the reviewed spec beyond the launch's fields (-reviewed +run):\n%s", diff)
	}
	s.assertClean(t)
}

// A teardown step that fails does not stop the steps after it: the
// failures come back in the result, one log line each, and the record is
// kept naming them, so ps shows the sandbox as garbage while the process
// that ran it lives, and gc removes what the failed steps left. The
// failures are injected on the cleanup stack (the steps do not run, as an
// undo that could not undo leaves its resource), not by breaking runsc.
func TestTeardownFailureIsReported(t *testing.T) {
	s := compileScript(t, "echo ran", "")
	const id = "pp-teardown-fails"
	var steps []string
	var log bytes.Buffer
	res, err := Launch(context.Background(), Options{
		BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc, ID: id,
		Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: &bytes.Buffer{}, Log: &log,
		undoFault: func(step string) error {
			steps = append(steps, step)
			if step == "runsc delete" || step == "run dir" {
				return errors.New("injected")
			}
			return nil
		},
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("launch: %v (exit %d)", err, res.ExitCode)
	}
	if i, j := indexOf(steps, "run dir"), indexOf(steps, "record"); i < 0 || j < i || indexOf(steps, "runsc delete") > i {
		t.Fatalf("steps %v: want runsc delete, then the run dir, then the record, all of them run", steps)
	}
	want := []UndoFailure{{Step: "runsc delete", Error: "injected"}, {Step: "run dir", Error: "injected"}}
	if diff := cmp.Diff(want, res.Teardown); diff != "" {
		t.Errorf("Result.Teardown (-want +got):\n%s", diff)
	}
	if lines := strings.Split(strings.TrimSpace(log.String()), "\n"); len(lines) != 2 || !strings.Contains(lines[1], id) || !strings.Contains(lines[1], "run dir: injected") {
		t.Errorf("log %q: want one line per failure", log.String())
	}
	if _, err := os.Stat(filepath.Join(s.state, "run", id)); err != nil {
		t.Errorf("the run dir's undo was failed, yet the run dir is gone: %v", err)
	}

	entries, err := s.inventory().PS()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].ID != id || !entries[0].Garbage || entries[0].Launcher != "alive" {
		t.Fatalf("ps: %+v, want %s as garbage although its launcher (this test) lives", entries, id)
	}
	if diff := cmp.Diff(want, entries[0].Teardown); diff != "" {
		t.Errorf("ps teardown (-want +got):\n%s", diff)
	}
	if err := s.inventory().Kill(id, 9); !errors.Is(err, inventory.ErrLaunchEnded) {
		t.Error("kill accepted a sandbox whose teardown ended")
	}
	rep, err := s.inventory().GC()
	if err != nil || len(rep.Errors) > 0 || len(rep.Removed) != 1 || rep.Removed[0] != id {
		t.Fatalf("gc: %+v %v, want %s removed", rep, err, id)
	}
	if recs, err := statedir.Records(s.state); err != nil || len(recs) != 0 {
		t.Errorf("records after gc: %v %v", recs, err)
	}
	s.assertClean(t)
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

// A record kept by a failed teardown is listed as garbage with its
// failures, whoever wrote it: the launch it names is over.
func TestPSShowsAKeptRecord(t *testing.T) {
	state := t.TempDir()
	rec := statedir.Record{ID: "pp-kept", Network: "none", Started: time.Unix(0, 0).UTC(), LauncherPID: os.Getpid(), LauncherStart: statedir.ProcessStart(os.Getpid())}
	if err := statedir.WriteRecord(state, rec); err != nil {
		t.Fatal(err)
	}
	inv := inventory.Inventory{StateRoot: state, RunscPath: "/nonexistent/runsc"}
	if e, err := inv.PS(); err != nil || len(e) != 1 || e[0].Garbage {
		t.Fatalf("a running launch's record: %+v %v, want it live", e, err)
	}
	failed := []UndoFailure{{Step: "sandbox network", Error: "deleting table: busy"}}
	if err := statedir.KeepFailedRecord(state, rec, failed); err != nil {
		t.Fatal(err)
	}
	e, err := inv.PS()
	if err != nil || len(e) != 1 || !e[0].Garbage || e[0].Launcher != "alive" {
		t.Fatalf("ps: %+v %v, want the kept record as garbage", e, err)
	}
	if diff := cmp.Diff(failed, e[0].Teardown); diff != "" {
		t.Errorf("ps teardown (-want +got):\n%s", diff)
	}
	if err := inv.Kill("pp-kept", 9); !errors.Is(err, inventory.ErrLaunchEnded) {
		t.Errorf("kill of a record whose teardown ended: %v, want refused", err)
	}
}
