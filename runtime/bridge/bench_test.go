package bridge

// Benchmarks for `make bench-bridge` (scripts/bench-bridge.sh,
// docs/benchmarks.md "Bridge"). Only Benchmark functions live here, so
// `go test ./runtime/bridge` never runs them.
//
//   - BenchmarkRawPipe: a producer writes throughputBytes in writeSize
//     writes into an os.Pipe and a consumer reads them all.
//   - BenchmarkBridgeThroughput: the same producer and pipe, but the read
//     end is a bridge output (Start) and the consumer is a client on
//     Session.Stream from cursor 0 that acknowledges every ackEvery
//     records. The target is >= 0.8 x the raw pipe's MB/s. It also
//     reports the largest spill file seen at an ack: records the client
//     had not acknowledged when memory filled.
//   - BenchmarkReplay1MiB: Stream(ctx, 0, ...) of a finished session
//     holding a 1 MiB backlog, in memory or mostly in the spill file.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
)

const (
	throughputBytes = 64 << 20
	writeSize       = 32 << 10
	ackEvery        = 64
	backlogBytes    = 1 << 20
)

// errAllReceived stops a Stream once the consumer has every byte.
var errAllReceived = errors.New("all bytes received")

// produce writes total bytes into w in writeSize writes, then closes w.
func produce(w *os.File, total int, done chan<- error) {
	buf := make([]byte, writeSize)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	var err error
	for left := total; left > 0 && err == nil; {
		n := min(left, len(buf))
		_, err = w.Write(buf[:n])
		left -= n
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	done <- err
}

func BenchmarkRawPipe(b *testing.B) {
	b.SetBytes(throughputBytes)
	b.ReportAllocs()
	buf := make([]byte, writeSize)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r, w, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		b.StartTimer()

		go produce(w, throughputBytes, done)
		got := 0
		for got < throughputBytes {
			n, err := r.Read(buf)
			got += n
			if err != nil {
				b.Fatalf("read after %d bytes: %v", got, err)
			}
		}

		b.StopTimer()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		r.Close()
	}
}

func BenchmarkBridgeThroughput(b *testing.B) {
	b.SetBytes(throughputBytes)
	b.ReportAllocs()
	lim := Limits{MemBytes: 4 << 20, SpillBytes: 64 << 20, SpillDir: b.TempDir()}
	var records int
	var spillMax int64 // largest spill file seen at an ack, over all runs
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r, w, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		s := Start(nopWriteCloser{}, map[string]io.Reader{"stdout": r}, lim)
		done := make(chan error, 1)
		got := 0
		var cursor uint64
		b.StartTimer()

		go produce(w, throughputBytes, done)
		err = s.Stream(context.Background(), 0, func(rec Record) error {
			if rec.Seq != cursor+1 || rec.Stream != "stdout" {
				return fmt.Errorf("record %d (%s) after %d", rec.Seq, rec.Stream, cursor)
			}
			cursor = rec.Seq
			got += len(rec.Data)
			if cursor%ackEvery == 0 {
				spillMax = max(spillMax, s.State().SpillBytes)
				s.Ack(cursor)
			}
			if got >= throughputBytes {
				return errAllReceived
			}
			return nil
		})

		b.StopTimer()
		if !errors.Is(err, errAllReceived) || got != throughputBytes {
			b.Fatalf("stream ended after %d of %d bytes: %v", got, throughputBytes, err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		s.Ack(cursor)
		s.Exited(0) // the pump has seen EOF: the producer closed w
		s.Release()
		r.Close()
		records += int(cursor)
	}
	b.ReportMetric(float64(records)/float64(b.N), "records/op")
	b.ReportMetric(float64(spillMax), "spill-max-bytes")
}

func BenchmarkReplay1MiB(b *testing.B) {
	for _, where := range []struct {
		name string
		mem  int64
	}{
		{"mem", 4 << 20},
		{"spill", 64 << 10}, // 97 to 99% of the backlog goes to the spill file
	} {
		for _, recSize := range []int{32 << 10, 512} {
			b.Run(fmt.Sprintf("%s/rec=%s", where.name, sizeName(recSize)), func(b *testing.B) {
				benchReplay(b, Limits{MemBytes: where.mem, SpillBytes: 64 << 20, SpillDir: b.TempDir()}, recSize)
			})
		}
	}
}

// benchReplay fills a finished session with backlogBytes of stdout in
// recSize records (plus the exit record) and times a full replay.
func benchReplay(b *testing.B, lim Limits, recSize int) {
	s := Start(nopWriteCloser{}, nil, lim)
	defer s.Release()
	chunk := make([]byte, recSize)
	for i := range chunk {
		chunk[i] = byte('a' + i%26)
	}
	for n := 0; n < backlogBytes; n += recSize {
		if _, err := s.log.Append("stdout", chunk); err != nil {
			b.Fatal(err)
		}
	}
	s.Exited(0)
	st := s.State()
	if spilled := lim.MemBytes < backlogBytes; spilled && st.SpillBytes < backlogBytes*3/4 || !spilled && st.SpillBytes != 0 {
		b.Fatalf("backlog not where it should be (MemBytes %d): %+v", lim.MemBytes, st)
	}
	b.SetBytes(backlogBytes)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		got := 0
		var cursor uint64
		err := s.Stream(context.Background(), 0, func(rec Record) error {
			if rec.Seq != cursor+1 {
				return fmt.Errorf("record %d after %d", rec.Seq, cursor)
			}
			cursor = rec.Seq
			if rec.Stream == "stdout" {
				got += len(rec.Data)
			}
			return nil
		})
		if err != nil || got != backlogBytes || cursor != st.Next-1 {
			b.Fatalf("replay: %d bytes, %d records: %v", got, cursor, err)
		}
	}
	b.ReportMetric(float64(st.SpillBytes), "spill-bytes")
	b.ReportMetric(float64(st.Next-1), "records")
}

func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

type nopWriteCloser struct{}

func (nopWriteCloser) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriteCloser) Close() error                { return nil }
