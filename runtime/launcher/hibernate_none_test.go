package launcher

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// noneScript counts the lines it reads (memory), writes each to the
// workspace, and on "ifs" lists the network interfaces it sees.
const noneScript = `n=0
while read line; do
  n=$((n+1))
  echo "$line" >> "$PASEO_AGENT_CWD/lines.txt"
  if [ "$line" = ifs ]; then
    echo "ifs $n $(/bin/busybox cat /proc/net/dev | /bin/busybox tail -n +3 | /bin/busybox cut -d: -f1 | /bin/busybox tr -d ' ' | /bin/busybox sort | /bin/busybox tr '\n' ,)"
  else
    echo "got $n $line key=$FAKE_LLM_KEY"
  fi
done`

// A sandbox in network mode none hibernates and wakes as one in mode
// sandbox does, without any network: the image records mode none and no
// link, nothing of a network (namespace, lease) exists while hibernated or
// after the wake, the woken agent sees loopback only, its memory survives
// (and its key is the model route's stand-in: with no network there is no
// route, and the key is needed nowhere), gc keeps it while hibernated, and nothing is left at the end.
func TestHibernateWakeNetworkNone(t *testing.T) {
	s := compileScript(t, noneScript, `{"network":{"mode":"none"}}`)
	key := staticSecret("s3cr3t-none")
	id := "pp-hibnone-" + fmt.Sprint(os.Getpid())
	noNetwork := func(what string) {
		t.Helper()
		for _, d := range []string{"net/netns", "net/leases"} {
			if ents, _ := os.ReadDir(filepath.Join(s.state, d)); len(ents) > 0 {
				t.Errorf("%s: network mode none, yet %s holds %v", what, d, ents)
			}
		}
		if _, ok, _ := sandboxnet.LeasedLink(filepath.Join(s.state, "net"), netip.Prefix{}, id); ok {
			t.Errorf("%s: network mode none holds an address lease", what)
		}
	}
	r := s.startRun(t, id, key, false)
	if r.err != nil {
		t.Fatalf("launch: %v", r.err)
	}
	if r.netns != nil {
		t.Fatalf("network mode none built a network: %+v", r.netns)
	}
	if got := r.line(t, "one"); got != "got 1 one key="+bundle.ModelRoutePlaceholder {
		t.Fatalf("first run answered %q", got)
	}
	if got := r.line(t, "ifs"); got != "ifs 2 lo," {
		t.Fatalf("before hibernate the agent sees interfaces %q, want loopback only", got)
	}
	for round := 2; round <= 3; round++ {
		img, err := Checkpoint(CheckpointOptions{ID: id, StateRoot: s.state, RunscPath: s.runsc})
		if err != nil {
			t.Fatalf("round %d: checkpoint: %v", round, err)
		}
		r.ended(t)
		if img.Network != "none" || img.Link.IsValid() || len(img.Files) == 0 {
			t.Fatalf("round %d: image %+v, want network none, no link, files", round, img)
		}
		noNetwork(fmt.Sprintf("round %d hibernated", round))
		if rep, err := (inventory.Inventory{StateRoot: s.state, RunscPath: s.runsc}).GC(); err != nil || len(rep.Removed) > 0 {
			t.Errorf("round %d: gc of a hibernated sandbox: %+v %v", round, rep, err)
		}
		r = s.startRun(t, id, key, true)
		if r.err != nil {
			t.Fatalf("round %d: wake: %v", round, r.err)
		}
		if r.netns != nil {
			t.Fatalf("round %d: the wake of a network-none sandbox built a network: %+v", round, r.netns)
		}
		if statedir.Hibernated(s.state, id) {
			t.Errorf("round %d: the image outlived the wake", round)
		}
		n := 2*round - 1
		if got, want := r.line(t, fmt.Sprintf("w%d", round)), fmt.Sprintf("got %d w%d key=%s", n, round, bundle.ModelRoutePlaceholder); got != want {
			t.Fatalf("round %d: woken sandbox answered %q, want %q", round, got, want)
		}
		if got, want := r.line(t, "ifs"), fmt.Sprintf("ifs %d lo,", n+1); got != want {
			t.Fatalf("round %d: after wake the agent sees interfaces %q, want %q", round, got, want)
		}
		noNetwork(fmt.Sprintf("round %d woken", round))
	}
	r.in.Close()
	r.ended(t)
	data, err := os.ReadFile(filepath.Join(s.host, "srv/paseo/workspace/proj-feature/lines.txt"))
	if want := "one\nifs\nw2\nifs\nw3\nifs\n"; err != nil || string(data) != want {
		t.Errorf("workspace lines %q (%v), want %q", data, err, want)
	}
	s.assertClean(t)
	if ents, _ := os.ReadDir(filepath.Join(s.state, "hibernate")); len(ents) > 0 {
		t.Errorf("images left behind: %v", ents)
	}
}
