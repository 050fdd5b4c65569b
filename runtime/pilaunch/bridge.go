package pilaunch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/supervisor"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Outcome is how a bridge run ended.
type Outcome int

const (
	// Ended: the sandbox ended (Pi exited, or a deliberate close ended it);
	// it is deleted and the agent's record removed. Code is its exit code.
	Ended Outcome = iota
	// Abandoned: Paseo went away without closing (its end of the pipes
	// died); the sandbox runs on under the supervisor with the agent's
	// record kept, for the next spawn with the same --session.
	Abandoned
	// Superseded: a newer spawn for the same agent took the attachment.
	Superseded
)

// Signals tell the bridge what happened on the Paseo side. The command
// (cli) wires them: Term on SIGTERM/SIGINT, EOF on stdin's end, Gone once
// the parent that spawned it is dead.
type Signals struct {
	Term <-chan struct{}
	Gone func() bool
}

// Bridge runs one spawn: create or reattach, then bytes both ways.
type Bridge struct {
	Socket string
	Store  *Store // nil for probes: nothing persists
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Sig    Signals
	// EOFGrace is how long stdin's end waits for Paseo's SIGTERM (its
	// close sends one at once) or the parent's death before it counts as
	// a deliberate close on its own.
	EOFGrace time.Duration
	// Deadline for the supervisor's answers.
	CallTimeout time.Duration
}

// Result of a run.
type Result struct {
	Outcome Outcome
	Code    int
	Sandbox string
	// Dropped counts the stdout lines not forwarded (frames.go).
	Dropped int
}

// Refusal is a launch that never started: every diagnostic, one stderr
// line each (`CODE path: message`).
type Refusal struct{ Diags diag.List }

func (r *Refusal) Error() string { return r.Diags.Error() }

func unavailable(format string, a ...any) *Refusal {
	return &Refusal{diag.List{{Code: CodeUnavailable, Path: "supervisor", Message: fmt.Sprintf(format, a...)}}}
}

type conn struct {
	mu     sync.Mutex
	c      *supervisor.Client
	epoch  uint64
	closed bool
}

func (b *Bridge) call(c *supervisor.Client, req supervisor.Request, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.CallTimeout)
	defer cancel()
	return c.Call(ctx, req, out)
}

// Run creates the sandbox for ln (or reattaches to the agent's live one)
// and bridges until the sandbox ends or Paseo goes.
func (b *Bridge) Run(ln *Launch) (Result, error) {
	if b.CallTimeout == 0 {
		b.CallTimeout = 60 * time.Second
	}
	cl, err := supervisor.Dial(b.Socket)
	if err != nil {
		return Result{}, unavailable("cannot reach the supervisor's socket: %v", errors.Unwrap(err))
	}
	defer func() { cl.Close() }()
	// The branch's value before anything of this spawn runs.
	git := b.prepareGit(ln)
	var rec *Record
	if b.Store != nil {
		if rec, err = b.Store.Load(ln.AgentID); err != nil {
			return Result{}, err
		}
	}
	sandbox := ""
	var cursor uint64
	if rec != nil {
		var in supervisor.Info
		err := b.call(cl, supervisor.Request{Op: "inspect", Sandbox: rec.Sandbox}, &in)
		switch {
		case err == nil && in.Status != supervisor.StatusExited && in.Status != supervisor.StatusOrphaned:
			sandbox, cursor = rec.Sandbox, rec.Cursor
		default:
			// Ended while nobody was attached: its output after the cursor
			// belongs to a daemon that is gone. Clean up and start again
			// from the session log.
			if err == nil {
				_ = b.call(cl, supervisor.Request{Op: "delete", Sandbox: rec.Sandbox}, nil)
			}
			_ = b.Store.Remove(ln.AgentID)
		}
	}
	if sandbox == "" {
		facts, err := json.Marshal(ln.Facts)
		if err != nil {
			return Result{}, err
		}
		undo := func() {}
		if ln.NewSession {
			if undo, err = MakeSessionDir(strings.TrimSuffix(ln.Facts.State.SessionDir, "/"+ln.AgentID), ln.AgentID); err != nil {
				return Result{}, &Refusal{diag.List{{Code: CodeState, Path: "state.sessionDir", Message: err.Error()}}}
			}
		}
		if st := ln.Facts.State.GitStore; st != "" {
			// The agent's Git store, kept across its spawns (an existing
			// one of the daemon user is kept).
			undoSession := undo
			undoStore, err := MakeSessionDir(strings.TrimSuffix(st, "/"+ln.AgentID), ln.AgentID)
			if err != nil {
				undoSession()
				return Result{}, &Refusal{diag.List{{Code: CodeState, Path: "state.gitStore", Message: err.Error()}}}
			}
			undo = func() { undoStore(); undoSession() }
		}
		var in supervisor.Info
		// A probe is nobody's session: if this spawn is killed before it
		// deletes the sandbox, the supervisor deletes it once it ended.
		err = b.call(cl, supervisor.Request{Op: "createSandbox", Deployment: ln.Facts.Deployment.ID, Facts: facts, MCPToken: ln.MCPToken,
			DeleteOnExit: b.Store == nil}, &in)
		if err != nil {
			undo() // a refused launch changes nothing
		}
		var re *rpcerr.Error
		if errors.As(err, &re) {
			if re.Code == rpcerr.Refused && len(re.Diagnostics) > 0 {
				return Result{}, &Refusal{re.Diagnostics}
			}
			return Result{}, unavailable("the supervisor did not start the sandbox: %s (%s)", re.Code, re.Message)
		}
		if err != nil {
			return Result{}, unavailable("createSandbox: %v", err)
		}
		sandbox = in.Sandbox
		if b.Store != nil {
			if err := b.Store.Save(ln.AgentID, Record{Sandbox: sandbox}); err != nil {
				_ = b.call(cl, supervisor.Request{Op: "delete", Sandbox: sandbox}, nil)
				return Result{}, err
			}
		}
	}
	pend := &pending{}
	s := &session{b: b, ln: ln, sandbox: sandbox, cursor: cursor, cn: &conn{c: cl}, pend: pend, out: &outLines{pend: pend}, resumed: rec != nil, git: git}
	if err := s.attach(); err != nil {
		var re *rpcerr.Error
		if rec != nil && errors.As(err, &re) && re.Code == rpcerr.SandboxUnavailable && re.StartFresh {
			// A hibernated sandbox that cannot be restored: the
			// supervisor's answer is to start again from the session log,
			// which the facts already name (--session).
			_ = b.call(cl, supervisor.Request{Op: "delete", Sandbox: sandbox}, nil)
			_ = b.Store.Remove(ln.AgentID)
			cl.Close()
			return b.Run(ln)
		}
		if rec == nil {
			// The sandbox this spawn made serves no one.
			_ = b.call(cl, supervisor.Request{Op: "delete", Sandbox: sandbox}, nil)
			if b.Store != nil {
				_ = b.Store.Remove(ln.AgentID)
			}
		}
		return Result{}, unavailable("attach: %v", err)
	}
	git.start()
	if s.resumed {
		// Everything the sandbox wrote before this spawn could write a
		// command answers no command of this spawn (frames.go).
		s.after = s.outputEnd()
	}
	res, err := s.run()
	res.Dropped = s.out.dropped
	if b.Store == nil && res.Outcome != Ended {
		// A probe is nobody's session: it ends with its spawn.
		_ = b.call(s.cn.c, supervisor.Request{Op: "delete", Sandbox: sandbox}, nil)
	}
	cl = s.cn.c
	return res, err
}

type session struct {
	b       *Bridge
	ln      *Launch
	sandbox string
	cursor  uint64
	cn      *conn
	inputN  int
	// seen and errSeen: the last stdout and stderr records handled; the
	// cursor stays at a line's start, behind seen while a line is held.
	seen, errSeen uint64
	in            inLines
	pend          *pending
	out           *outLines
	// resumed: this spawn reattached to a sandbox an earlier spawn made,
	// whose commands Pi may still answer; after is the output written
	// before this spawn wrote anything.
	resumed bool
	after   uint64
	// git imports the agent's Git work at turn ends (gitturn.go); nil
	// without a Git plan.
	git *gitTurns
}

// outputEnd is the last output record the sandbox has written, as far as
// the supervisor knows now.
func (s *session) outputEnd() uint64 {
	s.cn.mu.Lock()
	c := s.cn.c
	s.cn.mu.Unlock()
	var in supervisor.Info
	if s.b.call(c, supervisor.Request{Op: "inspect", Sandbox: s.sandbox}, &in) != nil || in.NextSeq == 0 {
		return s.after
	}
	return max(s.after, in.NextSeq-1)
}

// dropped tells Paseo's log (stderr) that lines were dropped, never what
// they held.
func (s *session) logDrops(n int) {
	if n > 0 {
		fmt.Fprintf(s.b.Stderr, "paseo-policy pi: dropped %d stdout line(s): a response frame to no request of this spawn (one the killed daemon sent, or one already answered) or a line Paseo could not route safely (%d so far)\n", n, s.out.dropped)
	}
}

func (s *session) attach() error {
	var att supervisor.AttachResult
	if err := s.b.call(s.cn.c, supervisor.Request{Op: "attach", Sandbox: s.sandbox, Cursor: s.cursor, MCPToken: s.ln.MCPToken}, &att); err != nil {
		return err
	}
	s.cn.mu.Lock()
	s.cn.epoch = att.Epoch
	s.cn.mu.Unlock()
	// The replay starts after the cursor, at a line's start.
	s.seen = s.cursor
	s.out.reset()
	return nil
}

// reconnect dials again after a dropped connection (a supervisor restart)
// and reattaches from the cursor, for up to a minute.
func (s *session) reconnect() error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		cl, err := supervisor.Dial(s.b.Socket)
		if err == nil {
			s.cn.mu.Lock()
			old := s.cn.c
			s.cn.c = cl
			s.cn.mu.Unlock()
			old.Close()
			if err = s.attach(); err == nil {
				return nil
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the supervisor did not come back")
}

func (s *session) run() (Result, error) {
	eof := make(chan struct{})
	inErr := make(chan error, 1)
	go s.pump(eof, inErr)
	acks := make(chan uint64, 1)
	ackDone := make(chan struct{})
	go s.acker(acks, ackDone)
	defer func() { close(acks); <-ackDone }()

	var eofTimer <-chan time.Time
	// deliberate is Paseo's close: input closed, TERM for a Pi busy in a
	// turn, then delete, which waits for the sandbox's end. Paseo sends
	// SIGKILL 2 s after its SIGTERM, so the command does not wait for the
	// stream's end first: once the delete is sent the supervisor finishes
	// it whether or not the command lives; the record goes after it (a
	// record left behind is cleaned up by the agent's next spawn).
	deliberate := func() Result {
		s.cn.mu.Lock()
		c, epoch := s.cn.c, s.cn.epoch
		s.cn.mu.Unlock()
		_ = s.b.call(c, supervisor.Request{Op: "closeInput", Sandbox: s.sandbox, Epoch: epoch}, nil)
		_ = s.b.call(c, supervisor.Request{Op: "signal", Sandbox: s.sandbox, Signal: "TERM"}, nil)
		var in supervisor.Info
		_ = s.b.call(c, supervisor.Request{Op: "inspect", Sandbox: s.sandbox}, &in)
		res := s.finish(in)
		if in.ExitCode == nil {
			res.Code = 143 // ended by the close, as Pi's own SIGTERM exit
		}
		return res
	}
	for {
		s.cn.mu.Lock()
		events := s.cn.c.Events
		s.cn.mu.Unlock()
		select {
		case ev, ok := <-events:
			if !ok {
				if err := s.reconnect(); err != nil {
					return Result{Outcome: Abandoned, Sandbox: s.sandbox}, unavailable("%v", err)
				}
				continue
			}
			switch ev.Event {
			case "output":
				if ev.Seq <= s.seen {
					continue
				}
				s.seen = ev.Seq
				if ev.Stream == "stderr" {
					if ev.Seq > s.errSeen {
						s.errSeen = ev.Seq
						_, _ = s.b.Stderr.Write(ev.Data)
					}
				} else {
					out, drops := s.out.feed(ev.Seq, ev.Data)
					s.logDrops(drops)
					if s.out.turnEnds > 0 {
						// The import comes before Paseo sees the turn end, so
						// the branch has the turn's commits when it does.
						s.out.turnEnds = 0
						s.git.run("turn-end")
					}
					if len(out) > 0 {
						if _, err := s.b.Stdout.Write(out); err != nil {
							// Paseo's end of stdout is gone: it died without closing.
							return Result{Outcome: Abandoned, Sandbox: s.sandbox}, nil
						}
					}
				}
				if !s.out.boundary() {
					continue // a line is held: the cursor stays at its start
				}
				s.cursor = ev.Seq
				select {
				case <-acks:
				default:
				}
				acks <- s.cursor
			case "detached":
				if strings.HasPrefix(ev.Reason, "superseded") {
					var in supervisor.Info
					if s.b.call(s.cn.c, supervisor.Request{Op: "inspect", Sandbox: s.sandbox}, &in) == nil && in.Status != supervisor.StatusExited && in.Epoch > s.cn.epoch {
						return Result{Outcome: Superseded, Sandbox: s.sandbox}, nil
					}
				}
				var in supervisor.Info
				err := s.b.call(s.cn.c, supervisor.Request{Op: "inspect", Sandbox: s.sandbox}, &in)
				var re *rpcerr.Error
				if err == nil && in.Status == supervisor.StatusExited || errors.As(err, &re) && re.Code == rpcerr.NotFound {
					// Ended (not-found: a deleteOnExit sandbox the
					// supervisor deleted after its end).
					return s.finish(in), nil
				}
				if err := s.attach(); err != nil {
					if err := s.reconnect(); err != nil {
						return Result{Outcome: Abandoned, Sandbox: s.sandbox}, unavailable("%v", err)
					}
				}
			}
		case <-s.b.Sig.Term:
			return deliberate(), nil
		case <-eof:
			eof = nil
			eofTimer = time.After(s.b.EOFGrace)
		case <-eofTimer:
			eofTimer = nil
			if s.b.Sig.Gone != nil && s.b.Sig.Gone() {
				// The pipe ended because the daemon died: not a close.
				return Result{Outcome: Abandoned, Sandbox: s.sandbox}, nil
			}
			// Input ended with the parent alive and no SIGTERM: pass the
			// end on (Pi ends on it) and bridge until the sandbox ends.
			s.cn.mu.Lock()
			c, epoch := s.cn.c, s.cn.epoch
			s.cn.mu.Unlock()
			_ = s.b.call(c, supervisor.Request{Op: "closeInput", Sandbox: s.sandbox, Epoch: epoch}, nil)
		case err := <-inErr:
			return Result{Outcome: Abandoned, Sandbox: s.sandbox}, err
		}
		if eofTimer == nil && eof == nil && s.b.Sig.Gone != nil && s.b.Sig.Gone() {
			return Result{Outcome: Abandoned, Sandbox: s.sandbox}, nil
		}
	}
}

// finish deletes an ended sandbox and its record; the exit code is Pi's.
func (s *session) finish(in supervisor.Info) Result {
	code := 0
	if in.ExitCode != nil {
		code = *in.ExitCode
	}
	// A last line without its newline, decided as every other.
	out, drops := s.out.flush()
	s.logDrops(drops)
	_, _ = s.b.Stdout.Write(out)
	_ = s.b.call(s.cn.c, supervisor.Request{Op: "delete", Sandbox: s.sandbox}, nil)
	// Once more with the sandbox gone: what the last turn left after its
	// agent_end (a killed command leaves it to the agent's next spawn).
	s.out.turnEnds = 0
	s.git.run("sandbox-end")
	if s.b.Store != nil {
		_ = s.b.Store.Remove(s.ln.AgentID)
	}
	return Result{Outcome: Ended, Code: code, Sandbox: s.sandbox}
}

// pump writes Paseo's stdin to the sandbox byte for byte, each chunk
// under a fresh input id (the bridge applies an id once, so a write
// retried after a reconnect is not doubled).
func (s *session) pump(eof chan<- struct{}, inErr chan<- error) {
	buf := make([]byte, 256<<10)
	for {
		n, err := s.b.Stdin.Read(buf)
		if n > 0 {
			s.inputN++
			// The ids of the commands this chunk completes are registered
			// before Pi can read them (it reads whole lines).
			for _, cid := range s.in.feed(buf[:n]) {
				after := s.after
				if s.resumed {
					after = s.outputEnd()
				}
				if !s.pend.add(cid, after) {
					fmt.Fprintf(s.b.Stderr, "paseo-policy pi: a command's id was not registered (longer than %d bytes, or %d commands outstanding): its response will be dropped\n", maxIDBytes, maxPending)
				}
			}
			id := fmt.Sprintf("%s-%d-%d", s.ln.AgentID, time.Now().UnixNano(), s.inputN)
			data := append([]byte(nil), buf[:n]...)
			for try := 0; ; try++ {
				s.cn.mu.Lock()
				c, epoch := s.cn.c, s.cn.epoch
				s.cn.mu.Unlock()
				werr := s.b.call(c, supervisor.Request{Op: "write", Sandbox: s.sandbox, Epoch: epoch, InputID: id, Data: data}, nil)
				if werr == nil {
					break
				}
				var re *rpcerr.Error
				if errors.As(werr, &re) && re.Code == rpcerr.State {
					break // input closed or the sandbox ended: nothing to deliver to
				}
				if try > 300 {
					inErr <- werr
					return
				}
				time.Sleep(200 * time.Millisecond) // a reconnect is under way
			}
		}
		if err != nil {
			close(eof)
			return
		}
	}
}

// acker acknowledges and persists the newest cursor written to Paseo,
// coalescing: the record says what Paseo has been given.
func (s *session) acker(acks <-chan uint64, done chan<- struct{}) {
	defer close(done)
	for cur := range acks {
		s.cn.mu.Lock()
		c := s.cn.c
		s.cn.mu.Unlock()
		// The record first: an attach may start at or after the
		// acknowledged cursor, never behind it (out-of-order), so a kill
		// between the two steps must leave the record ahead, not behind.
		if s.b.Store != nil {
			_ = s.b.Store.Save(s.ln.AgentID, Record{Sandbox: s.sandbox, Cursor: cur})
		}
		_ = s.b.call(c, supervisor.Request{Op: "ack", Sandbox: s.sandbox, Cursor: cur}, nil)
	}
}
