package preflight

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkPreflight times the host checks Launch runs before every start,
// all together (Run without a bundle) and one by one, with the pinned
// bin/runsc (make runsc): where the launcher's preflight time goes. The
// bundle checks are timed with a real bundle by the launcher's
// BenchmarkLaunchSteps (preflight-ns there minus run here). It is a
// measurement for make bench-launch; `go test` without -bench skips it.
func BenchmarkPreflight(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("preflight benchmarks create network namespaces and need root")
	}
	runsc, err := filepath.Abs("../../../bin/runsc")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(runsc); err != nil {
		b.Fatalf("pinned runsc missing at %s: run `make runsc` (%v)", runsc, err)
	}
	b.Run("run", func(b *testing.B) {
		for b.Loop() {
			if r := Run(Options{RunscPath: runsc}); !r.OK() {
				b.Fatal(r.Err())
			}
		}
	})
	// inspectRunsc reads the whole binary once: sha256 and ELF checks.
	b.Run("runsc", func(b *testing.B) {
		st, err := os.Stat(runsc)
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(st.Size())
		for b.Loop() {
			info := inspectRunsc(runsc)
			if err := info.staticErr(); err != nil {
				b.Fatal(err)
			}
			if err := info.digestErr(runsc + ".sha256"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("nftables", func(b *testing.B) {
		for b.Loop() {
			if _, err := checkNftables(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cgroup", func(b *testing.B) {
		for b.Loop() {
			if _, err := checkCgroup(cgroupRoot); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kernel", func(b *testing.B) {
		for b.Loop() {
			release, err := kernelRelease()
			if err == nil {
				err = checkKernel(release)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
