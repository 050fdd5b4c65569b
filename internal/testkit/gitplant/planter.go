package gitplant

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Outcome is how one plant went in a planter process (a sandbox's agent,
// or the same program on the host for the control).
type Outcome struct {
	Surface string `json:"surface"`
	// GitDir and Common are the Git dir and the common dir the plant took
	// as the worktree's and the repository's.
	GitDir string `json:"gitdir"`
	Common string `json:"common"`
	// Planted: every step of the plant succeeded.
	Planted bool `json:"planted"`
	// Step is the first operation that failed ("open /path", "rename /a
	// /b"), Errno its errno by name (EROFS, EBUSY, EACCES; "" when the
	// failure was no system call's), Error the whole message.
	Step  string `json:"step,omitempty"`
	Errno string `json:"errno,omitempty"`
	Error string `json:"error,omitempty"`
	// Panic is a plant that crashed (a bug of the harness, not a refusal).
	Panic string `json:"panic,omitempty"`
	// WorktreeWritable: a file could be made (and removed) in the agent's
	// worktree before the plant, as the agent's own work needs; a plant
	// refused everywhere for want of that would prove no protection.
	WorktreeWritable bool `json:"worktree_writable"`
}

// PlantOutside runs s's plant on p outside any test: a failing step stops
// the plant, as t.Fatal stops a test, and is reported, since a plant
// refused part way (a read-only file system, a busy mount point) is what
// a protected sandbox should see.
func PlantOutside(s Surface, p Plot) Outcome {
	writable := false
	if f, err := os.CreateTemp(p.WT, ".planter-probe-"); err == nil {
		f.Close()
		writable = os.Remove(f.Name()) == nil
	}
	rec := &recorder{}
	done := make(chan struct{})
	var crashed any
	go func() {
		defer close(done)
		defer func() { crashed = recover() }()
		s.Plant(rec, p)
	}()
	<-done
	for i := len(rec.cleanups) - 1; i >= 0; i-- {
		rec.cleanups[i]()
	}
	o := Outcome{Surface: s.Name, GitDir: p.GitDir, Common: p.Common, Planted: !rec.failed && crashed == nil, Step: rec.step, Errno: rec.errno, Error: rec.msg,
		WorktreeWritable: writable}
	if crashed != nil {
		o.Panic = fmt.Sprint(crashed)
	}
	return o
}

// PlantAsAgent plants s on p and then wherever else the agent sees its
// repository: where its Git finds it, when that is elsewhere than p has
// it (AsGitFinds, read before the first plant changes anything), and, when
// realGitDir is set, with the worktree's real Git dir at that path (a
// sandbox's read-only view of it). The host then sees every plant.
func PlantAsAgent(s Surface, p Plot, realGitDir string) []Outcome {
	found, elsewhere := p.AsGitFinds()
	out := []Outcome{PlantOutside(s, p)}
	if elsewhere {
		out = append(out, PlantOutside(s, found))
	}
	if realGitDir != "" && realGitDir != p.GitDir {
		out = append(out, PlantOutside(s, p.AtGitDir(realGitDir)))
	}
	return out
}

// recorder is the testing.TB a plant gets in a planter. testing.TB can
// only be implemented by embedding it; the nil one here panics on any
// method a plant calls that is not below, and PlantOutside reports it.
type recorder struct {
	testing.TB
	failed           bool
	step, errno, msg string
	cleanups         []func()
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return "planter" }
func (r *recorder) Failed() bool { return r.failed }

func (r *recorder) Fatal(args ...any) {
	r.fail(fmt.Sprint(args...), args)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...), args)
	runtime.Goexit()
}

func (r *recorder) FailNow() {
	r.fail("FailNow", nil)
	runtime.Goexit()
}

func (r *recorder) Error(args ...any)                 { r.fail(fmt.Sprint(args...), args) }
func (r *recorder) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...), args) }
func (r *recorder) Log(args ...any)                   { fmt.Fprintln(os.Stderr, args...) }
func (r *recorder) Logf(format string, args ...any)   { fmt.Fprintf(os.Stderr, format+"\n", args...) }
func (r *recorder) Cleanup(f func())                  { r.cleanups = append(r.cleanups, f) }

func (r *recorder) TempDir() string {
	dir, err := os.MkdirTemp("", "planter-")
	if err != nil {
		r.Fatal(err)
	}
	r.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// fail keeps the first failure: the step that stopped the plant.
func (r *recorder) fail(msg string, args []any) {
	if r.failed {
		return
	}
	r.failed, r.msg = true, msg
	for _, a := range args {
		err, ok := a.(error)
		if !ok {
			continue
		}
		var pe *fs.PathError
		var le *os.LinkError
		switch {
		case errors.As(err, &pe):
			r.step = pe.Op + " " + pe.Path
		case errors.As(err, &le):
			r.step = le.Op + " " + le.Old + " " + le.New
		}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			r.errno = unix.ErrnoName(errno)
		}
		return
	}
}
