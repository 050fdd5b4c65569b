package ociexec

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher"
)

// Hibernation of an OCI process (docs/supervisor.md "Hibernate")
//
// The process outlives its sandbox's hibernation: its pipes, and so the
// bridge reading them, stay open while runsc is checkpointed and stopped,
// and the woken sandbox writes into the same ones. Each launch (the start,
// then each wake) reads its stdin through its own reader of one relay, so
// the reader of a launch that ended cannot swallow input meant for the
// next one, and Hibernate checkpoints only once every byte handed to the
// sandbox was written into its stdin pipe.

// inputQuiesce bounds how long Hibernate waits for the sandbox to take
// input already handed to it: an agent that does not read its stdin is not
// idle.
const inputQuiesce = 2 * time.Second

// hibernateEnd bounds how long the checkpointed launch takes to tear down.
const hibernateEnd = 60 * time.Second

func (p *ociProcess) Hibernated() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hibernating
}

func (p *ociProcess) Hibernate() error {
	p.hibernation.Lock()
	defer p.hibernation.Unlock()
	p.mu.Lock()
	r, running := p.cur, !p.hibernating && !isClosed(p.done)
	p.mu.Unlock()
	if !running {
		return execution.ErrNotRunning
	}
	if err := p.input.pause(inputQuiesce); err != nil {
		return err
	}
	p.mu.Lock()
	p.hibernating = true // the launch's end is not the process's
	p.mu.Unlock()
	_, err := launcher.Checkpoint(launcher.CheckpointOptions{ID: p.id, StateRoot: p.oci.StateRoot, RunscPath: p.oci.RunscPath})
	if err != nil {
		p.mu.Lock()
		p.hibernating = false
		if isClosed(r.done) {
			// The checkpoint got as far as stopping the sandbox.
			p.finish(execution.Exit{Code: r.res.ExitCode, Reason: "hibernate failed: " + err.Error(), Err: r.err})
		}
		p.mu.Unlock()
		p.input.resume()
		return fmt.Errorf("hibernate: %w", err)
	}
	select {
	case <-r.done:
	case <-time.After(hibernateEnd):
		return fmt.Errorf("hibernate: the checkpointed sandbox %s did not end", p.id)
	}
	p.input.cut()
	return nil
}

func (p *ociProcess) Wake(ctx context.Context, secrets execution.SecretSource) error {
	p.hibernation.Lock()
	defer p.hibernation.Unlock()
	if !p.Hibernated() {
		return execution.ErrNotRunning
	}
	return p.begin(ctx, launcher.Wake, secrets)
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// inputRelay is the process's stdin: its Write hands the bytes to the
// current launch's reader one chunk at a time, the writer's chunk held
// until a reader takes it, and a reader that took one has written it on
// when it next reads. The writer hands its chunk to the relay itself, under
// the relay's lock, not through a pipe to a goroutine: with a pipe, the
// writer's Write returned once the relay's pump had read the bytes but
// before it held them, and a hibernate in that window saw nothing held and
// nothing in flight and checkpointed with input not taken (the flake of
// TestHibernateRefusedInputPending this design ends).
type inputRelay struct {
	wmu      sync.Mutex // one Write at a time, its chunks in order
	mu       sync.Mutex
	cond     *sync.Cond
	held     []byte // written, not yet handed to a launch
	err      error  // the input's end: io.EOF once the writer closed it
	dead     bool   // the process ended: a Write fails
	gen      int    // readers of older generations read EOF
	paused   bool   // no chunk is handed out (a checkpoint is under way)
	inflight bool   // the current reader has not yet read after its last chunk
}

// relayChunk is the most a reader is handed at once (the pipe's chunk it
// replaced).
const relayChunk = 64 << 10

func newInputRelay() *inputRelay {
	r := &inputRelay{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Write holds p for the readers, a chunk at a time, and returns once its
// last chunk is held: what a hibernate sees as input not yet taken.
func (r *inputRelay) Write(p []byte) (int, error) {
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for len(p) > 0 {
		for r.held != nil && !r.dead && r.err == nil {
			r.cond.Wait()
		}
		if r.dead || r.err != nil {
			return n, io.ErrClosedPipe
		}
		c := min(len(p), relayChunk)
		r.held = append([]byte(nil), p[:c]...)
		p, n = p[c:], n+c
		r.cond.Broadcast()
	}
	return n, nil
}

// Close ends the input (the writer's side): a reader reads EOF once the
// held chunk is taken.
func (r *inputRelay) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = io.EOF
	}
	r.cond.Broadcast()
	return nil
}

// closeBackend is the process's end: a Write waiting or to come fails,
// and readers read EOF.
func (r *inputRelay) closeBackend() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dead = true
	if r.err == nil {
		r.err = io.EOF
	}
	r.cond.Broadcast()
}

// open starts a new generation: its reader is the only one handed input.
func (r *inputRelay) open() io.Reader {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	r.paused, r.inflight = false, false
	r.cond.Broadcast()
	return &relayReader{r: r, gen: r.gen}
}

// pause waits until the sandbox has taken every byte of input it was
// given (none held by the relay, none handed out and not yet written on),
// then stops handing out input; it fails, handing out on, if that takes
// longer than d. Input the relay still holds counts as not taken: pausing
// first would have let a hibernate through whenever the relay had not yet
// handed the sandbox the chunk it would block on (a flake of
// TestHibernateRefusedInputPending).
func (r *inputRelay) pause(d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The deadline before the timer: a timer set first could fire before
	// the deadline passes, and its one broadcast would leave the loop
	// waiting for good.
	deadline := time.Now().Add(d)
	t := time.AfterFunc(time.Until(deadline), func() {
		r.mu.Lock()
		r.cond.Broadcast()
		r.mu.Unlock()
	})
	defer t.Stop()
	for (r.inflight || r.held != nil) && time.Now().Before(deadline) {
		r.cond.Wait()
	}
	if r.inflight || r.held != nil {
		return fmt.Errorf("hibernate: %w", execution.ErrInputPending)
	}
	r.paused = true
	return nil
}

func (r *inputRelay) resume() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paused = false
	r.cond.Broadcast()
}

// cut ends the current generation: its reader reads EOF. Input stays held
// for the next open.
func (r *inputRelay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	r.inflight = false
	r.cond.Broadcast()
}

type relayReader struct {
	r   *inputRelay
	gen int
}

func (rr *relayReader) Read(p []byte) (int, error) {
	r := rr.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if rr.gen == r.gen && r.inflight {
		r.inflight = false // the last chunk was written on
		r.cond.Broadcast()
	}
	for rr.gen == r.gen && (r.paused || (r.held == nil && r.err == nil)) {
		r.cond.Wait()
	}
	if rr.gen != r.gen {
		return 0, io.EOF
	}
	if r.held != nil {
		n := copy(p, r.held)
		if r.held = r.held[n:]; len(r.held) == 0 {
			r.held = nil
		}
		r.inflight = true
		r.cond.Broadcast()
		return n, nil
	}
	return 0, io.EOF
}

// countingWriter counts what passes through it into n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
