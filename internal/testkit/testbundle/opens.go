package testbundle

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// WatchOpens counts, with inotify, every open of a file in dir and in its
// subdirectories (as they are when it is called), by any process
// (directories themselves are not counted): the
// kernel reports the open, so no reader can be missed by wrapping the
// wrong one. The returned function stops watching and returns the counts
// by slash-separated name relative to dir.
func WatchOpens(t testing.TB, dir string) func() map[string]int {
	t.Helper()
	return watch(t, dir, unix.IN_OPEN)
}

// WatchWrites is WatchOpens for writes: it counts every close of a file
// opened for writing, so each complete write of a file counts once.
func WatchWrites(t testing.TB, dir string) func() map[string]int {
	t.Helper()
	return watch(t, dir, unix.IN_CLOSE_WRITE)
}

func watch(t testing.TB, dir string, mask uint32) func() map[string]int {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	prefix := map[int]string{}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		wd, err := unix.InotifyAddWatch(fd, p, mask)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		prefix[wd] = strings.TrimPrefix(filepath.ToSlash(rel)+"/", "./")
		return nil
	})
	if err != nil {
		unix.Close(fd)
		t.Fatalf("watching %s: %v", dir, err)
	}
	return func() map[string]int {
		t.Helper()
		defer unix.Close(fd)
		counts := map[string]int{}
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				return counts
			}
			if err != nil {
				t.Fatalf("reading inotify events: %v", err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				off += unix.SizeofInotifyEvent + int(ev.Len)
				if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
					t.Fatal("inotify queue overflowed; events were lost")
				}
				if ev.Mask&mask == 0 || ev.Mask&unix.IN_ISDIR != 0 || ev.Len == 0 {
					continue // directories (the walk above lists them) are not bundle files
				}
				counts[prefix[int(ev.Wd)]+string(bytes.TrimRight(name, "\x00"))]++
			}
		}
	}
}
