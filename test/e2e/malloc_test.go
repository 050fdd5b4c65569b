package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// toolHeap prints the size of a process's [heap] mapping (its brk area)
// from /proc/PID/maps, in bash alone: no program runs to read it.
const toolHeap = `heap() { local r _a _b _c _d n; while read -r r _a _b _c _d n; do [[ $n == "[heap]" ]] && { echo $(( 16#${r#*-} - 16#${r%-*} )); return; }; done </proc/$1/maps; echo 0; }`

// The shell Pi's bash tool starts, on the product's path (the pi-session
// profile's environment through the real Pi in the image), keeps freed
// heap with a trim threshold, not a pad: its heap at start is what it
// uses, not 16 MiB more. gVisor backs and copies a process's private
// memory in 2 MiB blocks, so a heap grown 16 MiB past its use made every
// fork of a tool's shell copy more and every start back more: 2-5 ms a
// command (docs/benchmarks.md, "The fixed cost of an exec"). The control
// (a shell given the pad the profile shipped before) shows the heap this
// test reads grows with a pad, in the same sandbox.
func TestPiToolShellHeap(t *testing.T) {
	e := newEnv(t)
	sc := e.scene(t, "pi-session", "")
	out := e.bashTurn(t, sc, strings.Join([]string{
		toolHeap,
		`echo "tool-heap=$(heap $$)"`,
		`echo "trim=${MALLOC_TRIM_THRESHOLD_-unset} pad=${MALLOC_TOP_PAD_-unset}"`,
		`echo "padded-heap=$(MALLOC_TOP_PAD_=16777216 bash -c '` + toolHeap + `; heap $$')"`,
	}, "\n"))
	num := func(name string) int64 {
		t.Helper()
		m := regexp.MustCompile(name + `=([0-9]+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no %s in the tool's output %q", name, out)
		}
		n, err := strconv.ParseInt(m[1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	const pad = 16 << 20
	if got := num("padded-heap"); got < pad {
		t.Fatalf("control: a shell with MALLOC_TOP_PAD_=%d has a heap of %d bytes, not at least the pad: the test cannot see a pad (output %q)", pad, got, out)
	}
	if got := num("tool-heap"); got >= 4<<20 {
		t.Errorf("the tool's shell starts with a heap of %d bytes, want under 4 MiB (no pad)", got)
	}
	if !strings.Contains(out, "trim=16777216 pad=unset") {
		t.Errorf("the tool's shell: want MALLOC_TRIM_THRESHOLD_=16777216 and no MALLOC_TOP_PAD_, output %q", out)
	}
}
