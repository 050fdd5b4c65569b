package gitplant

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// The controls: every surface, planted on the host as a sandbox would,
// runs its payload under the daemon commands it lists, and those only; a
// surface that runs nothing says why. A protection is then tested by
// planting from inside the sandbox and finding no marker.
func TestPlantsRunOnHost(t *testing.T) {
	out, err := exec.Command("git", "version").Output()
	if err != nil {
		t.Fatalf("git: %v", err)
	}
	// Which surfaces execute depends on git's version; the table was found
	// with this one, and another may differ in either direction.
	if v := strings.TrimSpace(string(out)); v != "git version 2.39.5" {
		t.Logf("host %s; the catalogue was verified with git 2.39.5", v)
	}
	names := map[string]bool{}
	for _, s := range Surfaces {
		if names[s.Name] {
			t.Fatalf("surface %q twice", s.Name)
		}
		names[s.Name] = true
		t.Run(s.Name, func(t *testing.T) {
			l := New(t)
			res := l.Trigger(t, s)
			var ran []string
			for _, c := range Commands {
				r := res[c.Name]
				if len(r.Markers) > 0 {
					ran = append(ran, c.Name)
					t.Logf("%s ran %v", c.Name, r.Markers)
				}
				if want, ok := s.Shows[c.Name]; ok && !strings.Contains(r.Out, want) {
					t.Errorf("%s printed %q, want it to hold %q (err %v)", c.Name, r.Out, want, r.Err)
				}
			}
			if diff := cmp.Diff(s.Runs, ran); diff != "" {
				t.Errorf("commands that ran the payload (-want +got):\n%s", diff)
			}
			if len(s.Runs) == 0 && s.Why == "" {
				t.Error("a surface that runs nothing must say why")
			}
		})
	}
}

// Of all hooks, the daemon's commands run only post-index-change (status
// and diff write a refreshed index); git 2.39 has no other hook there.
func TestOnlyPostIndexChangeHook(t *testing.T) {
	l := New(t)
	i := slices.IndexFunc(Surfaces, func(s Surface) bool { return strings.HasPrefix(s.Name, "hooks/") })
	for cmd, r := range l.Trigger(t, Surfaces[i]) {
		if len(r.Markers) > 0 && !slices.Equal(r.Markers, []string{"post-index-change"}) {
			t.Errorf("%s ran hooks %v", cmd, r.Markers)
		}
	}
}

// Without a plant no layout runs anything and every command works: the
// markers above come from the plants, not from the builders.
func TestLayoutsAloneRunNothing(t *testing.T) {
	l := New(t)
	for _, spec := range []Spec{{}, {EmptyTemplate: true}, {WorktreeConfig: true, Fsmonitor: true, Linked: []string{"wt1", "wt2"}}, {Submodule: "sub"}} {
		r := l.Build(t, spec)
		wts := append([]string{""}, spec.Linked...)
		for _, wt := range wts {
			for _, c := range Commands {
				if res := l.Run(t, c, r.Worktree(wt)); res.Err != nil || len(res.Markers) > 0 {
					t.Errorf("layout %+v, worktree %q, %s: err %v, markers %v\n%s", spec, wt, c.Name, res.Err, res.Markers, res.Out)
				}
			}
		}
	}
}

// A planter reports the step that stopped a plant and its errno, and a
// plant made in full as planted; where the Git dir names a common dir
// elsewhere, PlantAsAgent plants there too.
func TestPlantOutside(t *testing.T) {
	l := New(t)
	s, _ := SurfaceNamed("commondir created in a main worktree's .git")
	_, p := l.Prepared(t, s)
	if got := PlantAsAgent(s, p, ""); len(got) != 1 || !got[0].Planted || got[0].Common != p.Common {
		t.Errorf("a plot where Git finds the repository: %+v", got)
	}
	// As a sandbox shows a main worktree: its Git dir's commondir names
	// the repository's view elsewhere.
	_, p = l.Prepared(t, s)
	view := filepath.Join(l.Dir, "view")
	writeFile(t, filepath.Join(p.GitDir, "commondir"), view+"\n")
	got := PlantAsAgent(s, p, "")
	if len(got) != 2 || !got[0].Planted || got[0].Common != p.Common || !got[1].Planted || got[1].Common != view {
		t.Errorf("a plot whose Git finds the repository elsewhere: %+v", got)
	}
	// And where the real Git dir is shown elsewhere: a main worktree's is
	// its repository.
	_, p = l.Prepared(t, s)
	seed := filepath.Join(l.Dir, "seed")
	got = PlantAsAgent(s, p, seed)
	if len(got) != 2 || got[1].GitDir != seed || got[1].Common != seed || got[1].Planted {
		t.Errorf("a plot with the real Git dir elsewhere: %+v", got)
	}

	_, p = l.Prepared(t, s)
	file := filepath.Join(l.Dir, "a-file")
	writeFile(t, file, "")
	p.WT = filepath.Join(file, "wt") // a path beneath a file: ENOTDIR
	o := PlantOutside(s, p)
	if o.Planted || o.Errno != "ENOTDIR" || o.Step != "mkdir "+file || o.Panic != "" {
		t.Errorf("refused plant: %+v", o)
	}
}

// The write-side controls without a sandbox: each surface planted in the
// repository on the host as the deployment user takes under the daemon's
// git, and an unplanted lab shows no effect (the test can fail both ways).
func TestWriteSideControls(t *testing.T) {
	skip.UnlessRoot(t, "the deployment user's git runs as uid 1000 and the lab is chowned to it")
	clean := NewWriteLab(t, t.TempDir(), 1000).HostWriteSide(t)
	if clean.Failed != "" || clean.Corrupted() {
		t.Fatalf("no plant: %+v", clean)
	}
	for _, s := range WriteSurfaces {
		t.Run(s.Name, func(t *testing.T) {
			l := NewWriteLab(t, t.TempDir(), 1000)
			l.PlantOnHost(t, s.Name)
			if w := l.HostWriteSide(t); !w.Won[s.Name] {
				t.Errorf("%s did not take (%s): %+v", s.Name, s.Effect, w)
			}
		})
	}
}

// The store's forged indexes are real forgeries: git reading the store as
// a repository shows both, and reading it before they are planted shows
// neither.
func TestStoreForgeControl(t *testing.T) {
	skip.UnlessRoot(t, "the deployment user's git runs as uid 1000 and the lab is chowned to it")
	l := NewWriteLab(t, t.TempDir(), 1000)
	f := l.PrepareStoreForge(t)
	out := l.PlantStoreOnHost(t)
	for _, label := range []string{"work", "multi-pack-index", "commit-graph"} {
		if !strings.Contains(out, label+"=ok\n") {
			t.Fatalf("plant: %s", out)
		}
	}
	won := l.StoreAsRepository(t, f)
	for _, s := range StoreForgeSurfaces {
		if !won[s.Name] {
			t.Errorf("%s: git reading the store did not show it (%s)", s.Name, s.Effect)
		}
	}
	tip, clean := l.Imported(t, f)
	if tip != l.Main || clean["multi-pack-index"] || clean["commit-graph"] {
		t.Errorf("the shared repository before any import: feature %s, effects %v", tip, clean)
	}
}
