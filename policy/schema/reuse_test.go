package schema

import (
	"os"
	"runtime"
	"testing"
)

// One Loader reused for many inputs (as the compiler's pool does) must not
// accumulate: a CUE context that kept every compiled input would grow
// without bound in a long-lived supervisor.
func TestLoaderReuseMemoryBounded(t *testing.T) {
	data, err := os.ReadFile("../../testdata/base/facts.json")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := os.ReadFile("../../testdata/base/registry.json")
	if err != nil {
		t.Fatal(err)
	}
	ld := NewLoader()
	use := func(n int) {
		for i := 0; i < n; i++ {
			if _, d := ld.Facts(Input{Name: "facts.json", Data: data}); len(d) > 0 {
				t.Fatal(d)
			}
			if _, d := ld.Registry(Input{Name: "registry.json", Data: reg}); len(d) > 0 {
				t.Fatal(d)
			}
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	use(100)
	base := heap()
	use(2000)
	grown := heap()
	runtime.KeepAlive(ld)
	t.Logf("heap with one loader: after 100 uses %d KiB, after 2100 %d KiB", base>>10, grown>>10)
	if grown > base+8<<20 {
		t.Errorf("a reused loader grew the heap by %d KiB over 2000 uses", (grown-base)>>10)
	}
}
