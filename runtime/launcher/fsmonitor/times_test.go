package fsmonitor

import (
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A close after a write that was already named, and a close of that file
// opened for writing again and not written, name nothing: the case of gVisor's
// gofer closing its host descriptor long after the agent's write. What
// a close or attribute event can stand for alone is still named: a write
// through a shared mapping (no write event at all), a chmod, times set.
// The control: with nothing kept, the closes are named, as before.
func TestUnchangedClosesNameNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		times int
	}{{"kept", DefaultLimits.Times}, {"control-nothing-kept", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			ws := t.TempDir()
			mustWrite(t, ws+"/a.txt", "a")
			mustWrite(t, ws+"/sub/b.txt", "b")
			lim := DefaultLimits
			lim.Times = tc.times
			w := watch(t, ws, lim)
			tok := first(t, w)

			// A write, named; its close, later, after the answer.
			f, err := os.OpenFile(ws+"/sub/b.txt", os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteString("more"); err != nil {
				t.Fatal(err)
			}
			tok, names := w.Since(tok)
			if !slices.Equal(names, []string{"sub/b.txt"}) {
				t.Fatalf("a write: %q, want sub/b.txt", names)
			}
			f.Close()
			// The same file opened for writing again and closed unwritten.
			g, err := os.OpenFile(ws+"/sub/b.txt", os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			g.Close()
			tok, names = w.Since(tok)
			if tc.times == 0 {
				if !slices.Equal(names, []string{"sub/b.txt"}) {
					t.Fatalf("control: the closes named %q, want sub/b.txt", names)
				}
				return
			}
			if len(names) != 0 {
				t.Fatalf("closes that changed nothing named %q, want nothing", names)
			}
			if st := w.Stats(); st.Unchanged == 0 {
				t.Fatalf("stats: %+v, want the closes left out (the kernel merges two alike in its queue)", st)
			}

			// A file not named since the watch began: its close is named
			// (nothing was kept of it).
			h, err := os.OpenFile(ws+"/a.txt", os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			h.Close()
			if tok, names = w.Since(tok); !slices.Equal(names, []string{"a.txt"}) {
				t.Fatalf("the close of a file not named before: %q, want a.txt", names)
			}

			steps := []struct {
				what string
				do   func() error
				name string
			}{
				{"a write through a shared mapping", func() error { return mappedWrite(ws + "/a.txt") }, "a.txt"},
				{"chmod", func() error { return os.Chmod(ws+"/sub/b.txt", 0o755) }, "sub/b.txt"},
				{"times set", func() error { return os.Chtimes(ws+"/a.txt", time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)) }, "a.txt"},
			}
			for _, s := range steps {
				if err := s.do(); err != nil {
					t.Fatal(err)
				}
				tok, names = w.Since(tok)
				if !slices.Contains(names, s.name) {
					t.Errorf("%s: %q, want %s", s.what, names, s.name)
				}
			}
		})
	}
}

// mappedWrite changes a file's first byte through a shared mapping: no
// write event, only the close.
func mappedWrite(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	m, err := unix.Mmap(int(f.Fd()), 0, 1, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	m[0] = 'Z'
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		return err
	}
	return unix.Munmap(m)
}
