package supervisor

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Each typed result encodes to the bytes the op sent while its result was
// still a map or the holder's own type. TestWireBytes pins most of them
// over the socket; a signal that succeeds is the TypeScript client's e2e
// (a real Pi), since runsc kill finds no container state for the Go
// fixture's sandboxes.
func TestResultBytes(t *testing.T) {
	for _, c := range []struct {
		name       string
		typed, was any
	}{
		{"signal", SignalResult{Signal: "SIGTERM"}, map[string]string{"signal": "SIGTERM"}},
		{"delete", DeleteResult{Deleted: "pp-0123456789abcdef"}, map[string]string{"deleted": "pp-0123456789abcdef"}},
		{"attach", AttachResult{Epoch: 2, Cursor: 5}, map[string]uint64{"epoch": 2, "cursor": 5}},
		{"write", WriteResult{Applied: true}, map[string]bool{"applied": true}},
		{"ack", AckResult{Acked: 3}, map[string]uint64{"acked": 3}},
		{"closeInput", CloseResult{Closed: true}, map[string]bool{"closed": true}},
	} {
		got, _ := json.Marshal(Response{V: Version, ID: "c1", OK: true, Result: c.typed})
		want, _ := json.Marshal(Response{V: Version, ID: "c1", OK: true, Result: c.was})
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("%s (-was +typed):\n%s", c.name, diff)
		}
	}
}

// The op table: which ops name a sandbox, which wake a hibernated one
// (docs/supervisor.md, "Hibernate"), and which may send large frames.
func TestOpTable(t *testing.T) {
	var onSandbox, wakes []string
	for name, o := range ops {
		if o.sandbox {
			onSandbox = append(onSandbox, name)
		}
		if o.wakes {
			wakes = append(wakes, name)
		}
	}
	slices.Sort(onSandbox)
	slices.Sort(wakes)
	if diff := cmp.Diff([]string{OpAck, OpAttach, OpCloseInput, OpDelete, OpGitImport, OpHibernate, OpInspect, OpSignal, OpWake, OpWrite}, onSandbox); diff != "" {
		t.Errorf("ops on a sandbox (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{OpAttach, OpCloseInput, OpWake, OpWrite}, wakes); diff != "" {
		t.Errorf("ops that wake (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{OpWrite: MaxWriteFrame}, opFrames()); diff != "" {
		t.Errorf("large frames (-want +got):\n%s", diff)
	}
	if len(ops) != 12 {
		t.Errorf("%d ops, want the protocol's 12", len(ops))
	}
}
