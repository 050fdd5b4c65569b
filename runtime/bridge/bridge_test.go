package bridge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestLogSpillsAndReplaysInOrder(t *testing.T) {
	l := NewLog(Limits{MemBytes: 1024, SpillBytes: 1 << 20, SpillDir: t.TempDir()})
	defer l.Release()
	for i := 1; i <= 100; i++ {
		if seq, err := l.Append("stdout", []byte(fmt.Sprintf("line %03d %s", i, strings.Repeat("x", 90)))); err != nil || seq != uint64(i) {
			t.Fatalf("append %d: seq %d %v", i, seq, err)
		}
	}
	if st := l.State(); st.SpillBytes == 0 || st.MemBytes > 1024 {
		t.Fatalf("nothing spilled: %+v", st)
	}
	recs, _, _, err := l.Read(0, 1000)
	if err != nil || len(recs) != 100 {
		t.Fatalf("read %d records, %v", len(recs), err)
	}
	for i, r := range recs {
		if r.Seq != uint64(i+1) || !strings.HasPrefix(string(r.Data), fmt.Sprintf("line %03d ", i+1)) || r.Stream != "stdout" {
			t.Fatalf("record %d: %+v", i, r)
		}
	}
	l.Ack(50)
	if _, _, _, err := l.Read(10, 10); !errors.Is(err, ErrBehind) {
		t.Errorf("read behind the ack: %v", err)
	}
	recs, _, _, _ = l.Read(50, 1000)
	if len(recs) != 50 || recs[0].Seq != 51 {
		t.Errorf("after ack: %d records from %d", len(recs), recs[0].Seq)
	}
}

// When memory and spill are full, Append waits for an acknowledgement
// (back-pressure on the process) and loses nothing.
func TestLogBackPressure(t *testing.T) {
	l := NewLog(Limits{MemBytes: 256, SpillBytes: 512, SpillDir: t.TempDir()})
	defer l.Release()
	appended := make(chan uint64, 100)
	go func() {
		for i := 0; i < 40; i++ {
			seq, err := l.Append("stdout", bytes.Repeat([]byte{'a' + byte(i%26)}, 40))
			if err != nil {
				return
			}
			appended <- seq
		}
		close(appended)
	}()
	time.Sleep(200 * time.Millisecond)
	if !l.State().Paused {
		t.Fatalf("the log never filled: %+v", l.State())
	}
	var got uint64
	for got < 40 {
		recs, changed, _, err := l.Read(got, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Seq != got+1 || r.Data[0] != 'a'+byte((r.Seq-1)%26) {
				t.Fatalf("record %d out of order or wrong: %+v", got+1, r)
			}
			got = r.Seq
		}
		l.Ack(got)
		if len(recs) == 0 {
			select {
			case <-changed:
			case <-time.After(5 * time.Second):
				t.Fatalf("stalled at %d: %+v", got, l.State())
			}
		}
	}
}

// The process keeps running with no client attached: its output is drained
// into the log and it is never blocked or killed by a missing reader.
func TestProcessRunsUnattached(t *testing.T) {
	cmd := exec.Command("/bin/busybox", "sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo line-$i-abcdefghijklmnopqrstuvwxyz; i=$((i+1)); done; echo end >&2")
	stdin, outs := startWithPipes(t, cmd, 2)
	s := Start(stdin, map[string]io.Reader{"stdout": outs[0], "stderr": outs[1]}, Limits{MemBytes: 8 << 10, SpillBytes: 8 << 20, SpillDir: t.TempDir()})
	defer s.Release()
	s.Exited(exitStatus(cmd.Wait()))
	var out, errs bytes.Buffer
	var exit string
	if err := s.Stream(context.Background(), 0, func(r Record) error {
		switch r.Stream {
		case "stdout":
			out.Write(r.Data)
		case "stderr":
			errs.Write(r.Data)
		case "exit":
			exit = string(r.Data)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 2000 || errs.String() != "end\n" || exit != "0" {
		t.Fatalf("got %d lines, stderr %q, exit %q", n, errs.String(), exit)
	}
}

// Twenty disconnects in the middle of a streaming process: each reattach
// from the last acknowledged cursor continues exactly where the client
// stopped, with no gap and no duplicate; the old epoch is fenced, and a
// retried input id is not written twice.
func TestReattachReplaysWithoutGapsOrDuplicates(t *testing.T) {
	// cat echoes input; the loop streams for a few seconds.
	cmd := exec.Command("/bin/busybox", "sh", "-c", "(i=0; while [ $i -lt 300 ]; do echo tick-$i; i=$((i+1)); /bin/busybox usleep 10000; done) & cat; wait")
	stdin, outs := startWithPipes(t, cmd, 1)
	s := Start(stdin, map[string]io.Reader{"stdout": outs[0]}, Limits{SpillDir: t.TempDir()})
	defer s.Release()
	go func() { s.Exited(exitStatus(cmd.Wait())) }()

	var all bytes.Buffer
	var cursor uint64
	prevEpoch := uint64(0)
	for i := 0; i < 20; i++ {
		epoch := s.Attach()
		if prevEpoch != 0 {
			if _, err := s.Write(prevEpoch, fmt.Sprintf("stale-%d", i), []byte("stale\n")); !errors.Is(err, ErrFenced) {
				t.Fatalf("write with a superseded epoch: %v", err)
			}
		}
		prevEpoch = epoch
		id := fmt.Sprintf("in-%d", i)
		for try := 0; try < 2; try++ { // a client retrying after a disconnect
			applied, err := s.Write(epoch, id, []byte(fmt.Sprintf("input-%d\n", i)))
			if err != nil || applied != (try == 0) {
				t.Fatalf("write %s try %d: applied %v %v", id, try, applied, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
		_ = s.Stream(ctx, cursor, func(r Record) error {
			if r.Seq != cursor+1 {
				return fmt.Errorf("gap or duplicate: got %d after %d", r.Seq, cursor)
			}
			if r.Stream == "stdout" {
				all.Write(r.Data)
			}
			cursor = r.Seq
			return nil
		})
		cancel()
		s.Ack(cursor) // the client acknowledges what it holds, then "dies"
	}
	if err := s.CloseInput(prevEpoch); err != nil {
		t.Fatal(err)
	}
	if err := s.Stream(context.Background(), cursor, func(r Record) error {
		if r.Seq != cursor+1 {
			return fmt.Errorf("gap or duplicate: got %d after %d", r.Seq, cursor)
		}
		if r.Stream == "stdout" {
			all.Write(r.Data)
		}
		cursor = r.Seq
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	text := all.String()
	for i := 0; i < 300; i++ {
		if strings.Count(text, fmt.Sprintf("tick-%d\n", i)) != 1 {
			t.Fatalf("tick-%d seen %d times", i, strings.Count(text, fmt.Sprintf("tick-%d\n", i)))
		}
	}
	for i := 0; i < 20; i++ {
		if strings.Count(text, fmt.Sprintf("input-%d\n", i)) != 1 {
			t.Fatalf("input-%d echoed %d times", i, strings.Count(text, fmt.Sprintf("input-%d\n", i)))
		}
	}
	if strings.Contains(text, "stale") {
		t.Fatal("a fenced write reached the process")
	}
}
