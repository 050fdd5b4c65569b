package bridge

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
)

// ErrFenced refuses a write from an attachment that is no longer the
// newest: a half-dead old client may not interleave input with the new one.
var ErrFenced = errors.New("bridge: write from a superseded attachment (stale epoch)")

// ErrInputClosed refuses writes after the process's stdin was closed.
var ErrInputClosed = errors.New("bridge: input closed")

// rememberedInputs bounds the duplicate-suppression memory.
const rememberedInputs = 4096

// Session bridges one process: its output is pumped into a Log from the
// moment the session starts, whether or not a client is attached.
type Session struct {
	log *Log

	mu       sync.Mutex
	stdin    io.WriteCloser
	epoch    uint64
	applied  map[string]bool
	order    []string
	closedIn bool

	pumps sync.WaitGroup
}

// Start begins draining outputs (stream name -> reader) into a new log.
// The readers are read until EOF no matter what clients do, so the process
// never dies of a broken pipe and never blocks while the log has room.
func Start(stdin io.WriteCloser, outputs map[string]io.Reader, lim Limits) *Session {
	s := &Session{log: NewLog(lim), stdin: stdin, applied: map[string]bool{}}
	for name, r := range outputs {
		s.pumps.Add(1)
		go s.pump(name, r)
	}
	return s
}

// pump reads straight into its chunk (chunk.go): the kernel's copy is the
// only one.
func (s *Session) pump(name string, r io.Reader) {
	defer s.pumps.Done()
	var w writer
	defer s.log.closeWriter(&w)
	for {
		n, err := r.Read(s.log.space(&w))
		if n > 0 {
			if _, aerr := s.log.commit(&w, name, n); aerr != nil {
				// Closed log: keep draining so the writer never blocks.
				_, _ = io.Copy(io.Discard, r)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Exited records the process's exit status as the last record once every
// output has reached EOF, and closes the log.
func (s *Session) Exited(status int) {
	s.pumps.Wait()
	_, _ = s.log.Append("exit", []byte(strconv.Itoa(status)))
	s.log.Close()
}

// Attach starts a new attachment and returns its epoch; every earlier
// epoch is fenced from then on.
func (s *Session) Attach() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch++
	return s.epoch
}

// Epoch is the current attachment's epoch.
func (s *Session) Epoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// Stream sends every record after cursor to fn, in order, then follows
// new records until ctx ends, fn fails, or the log is closed and drained.
// A Record's Data is valid only until fn returns: it is the log's own
// memory, which is reused once the record is acknowledged or spilled and
// fn has returned. fn must copy what it keeps.
func (s *Session) Stream(ctx context.Context, cursor uint64, fn func(Record) error) error {
	var b batch
	defer s.log.unpin(&b)
	for {
		changed, done, err := s.log.read(&b, cursor, 256, false)
		if err != nil {
			return err
		}
		for _, r := range b.recs {
			if err := fn(r); err != nil {
				return err
			}
			cursor = r.Seq
		}
		if done {
			return nil
		}
		if len(b.recs) > 0 {
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Write sends input from the attachment with epoch. An input id already
// applied is acknowledged without writing again (applied=false), so a
// client that retries after a disconnect cannot duplicate a command.
func (s *Session) Write(epoch uint64, inputID string, data []byte) (applied bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if epoch != s.epoch {
		return false, ErrFenced
	}
	if s.applied[inputID] {
		return false, nil
	}
	if s.closedIn {
		return false, ErrInputClosed
	}
	if _, err := s.stdin.Write(data); err != nil {
		return false, err
	}
	s.applied[inputID] = true
	s.order = append(s.order, inputID)
	if len(s.order) > rememberedInputs {
		delete(s.applied, s.order[0])
		s.order = s.order[1:]
	}
	return true, nil
}

// Ack tells the bridge the client holds every record <= cursor.
func (s *Session) Ack(cursor uint64) { s.log.Ack(cursor) }

// CloseInput closes the process's stdin (Pi exits on EOF).
func (s *Session) CloseInput(epoch uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if epoch != s.epoch {
		return ErrFenced
	}
	if s.closedIn {
		return nil
	}
	s.closedIn = true
	return s.stdin.Close()
}

// State reports the log's state.
func (s *Session) State() State { return s.log.State() }

// Release frees the session's spill file and spare memory after the
// process is gone.
func (s *Session) Release() { s.log.Release() }
