package supervisor

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// state is where a sandbox is in its life as this supervisor knows it. It
// says whether the sandbox's holder lives and, once the holder is gone,
// whether runsc still runs the sandbox. Whether a sandbox whose holder
// lives has ended is the holder's to report (inspect passes its answer
// through); the supervisor does not keep a copy of it.
type state uint8

const (
	// stateNone is a box not made yet: every life starts from it.
	stateNone state = iota
	// stateCreating: a createSandbox spawned the holder and waits for its
	// "started". A creating box is in no listing (its place under
	// maxSandboxes is held by the creation's reservation).
	stateCreating
	// stateRunning: the holder lives and this supervisor started it, or a
	// client attached through this supervisor.
	stateRunning
	// stateRunningUnattached: the holder lives, an earlier supervisor
	// started it, and no client has attached through this one yet.
	stateRunningUnattached
	// stateExited: the holder is gone and runsc no longer runs the sandbox;
	// its output went with the holder.
	stateExited
	// stateOrphaned: the holder is gone while runsc still runs the sandbox;
	// its stdio cannot be recovered (inspect, signal, delete only).
	stateOrphaned
	// stateDeleted: delete removed every trace; the box is out of the map.
	stateDeleted
	// stateHibernated: the holder lives and keeps the bridge; the sandbox
	// is checkpointed (hibernate.go) and released. attach, write and
	// closeInput wake it first.
	stateHibernated
)

var stateNames = [...]string{
	stateNone:              "none",
	stateCreating:          "creating",
	stateRunning:           StatusRunning,
	stateRunningUnattached: StatusRunningUnattached,
	stateExited:            StatusExited,
	stateOrphaned:          StatusOrphaned,
	stateDeleted:           "deleted",
	stateHibernated:        StatusHibernated,
}

func (s state) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", s)
}

// transitions lists every move a box may make; any other is refused. It
// is the state diagram of docs/supervisor.md ("Sandbox states").
var transitions = map[state][]state{
	// createSandbox; adoption of a live holder; a launch record whose
	// holder is gone, found on start (runsc runs it, or not).
	// + adoption of a holder whose sandbox is hibernated.
	stateNone:              {stateCreating, stateRunningUnattached, stateOrphaned, stateExited, stateHibernated},
	stateCreating:          {stateRunning, stateDeleted},                                              // started; the launch failed
	stateRunning:           {stateExited, stateOrphaned, stateDeleted, stateHibernated},               // holder found gone; delete; hibernate
	stateRunningUnattached: {stateRunning, stateExited, stateOrphaned, stateDeleted, stateHibernated}, // + an attach
	stateOrphaned:          {stateDeleted},
	stateExited:            {stateDeleted},
	// A wake; the holder found gone (nothing runs: exited); delete.
	stateHibernated: {stateRunning, stateExited, stateDeleted},
}

// allowed reports whether a box may move from one state to another.
func allowed(from, to state) bool { return slices.Contains(transitions[from], to) }

// transitionError is a move the table refuses: a request that raced
// another (a delete under way), or a bug. Callers answer it with rpcerr.State.
type transitionError struct {
	sandbox  string
	from, to state
}

func (e *transitionError) Error() string {
	return fmt.Sprintf("sandbox %s is %s: it cannot become %s", e.sandbox, e.from, e.to)
}

// holderLives reports whether a box in this state has a holder that owns
// its stdio.
func (s state) holderLives() bool {
	return s == stateRunning || s == stateRunningUnattached || s == stateHibernated
}

// counts reports whether a box in this state holds a place under its
// deployment's maxSandboxes: it costs the host a holder or a sandbox
// runsc runs. (A creating box's place is its creation's reservation.) A
// hibernated box counts: a wake must not take the deployment past its cap.
func (s state) counts() bool { return s.holderLives() || s == stateOrphaned }

// box is one sandbox the supervisor knows.
type box struct {
	id, deployment, agent, profile string
	// sock is the socket of the sandbox's holder, the process that owns
	// its stdio and bridge; it is used only while the state says the
	// holder lives.
	sock string

	hmu    sync.Mutex // serializes hibernate and wake (hibernate.go)
	gmu    sync.Mutex // serializes gitImport (gitimport.go)
	mu     sync.Mutex
	st     state              // only move() changes it
	detach context.CancelFunc // the current attachment's streamer
	// deleteOnExit: reap.go deletes the box once it exited and users is
	// empty. users are the open connections that created or attached it.
	deleteOnExit bool
	users        map[any]bool
}

// newBox makes a box in its first state (a move from stateNone).
func newBox(id, deployment, agent, profile, sock string, first state) (*box, error) {
	b := &box{id: id, deployment: deployment, agent: agent, profile: profile, sock: sock}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.moveLocked(first); err != nil {
		return nil, err
	}
	return b, nil
}

// moveLocked is the one place a box's state changes: it makes the move if
// the table allows it and refuses it otherwise, leaving the state as it
// was. b.mu is held.
func (b *box) moveLocked(to state) error {
	if !allowed(b.st, to) {
		return &transitionError{sandbox: b.id, from: b.st, to: to}
	}
	b.st = to
	return nil
}

// move is moveLocked under the box's lock.
func (b *box) move(to state) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.moveLocked(to)
}

// state is the box's current state.
func (b *box) state() state {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st
}

// holder is the holder's socket while the holder lives, or "".
func (b *box) holder() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.st.holderLives() {
		return ""
	}
	return b.sock
}

// attached records that a client attached through this supervisor: an
// adopted sandbox is running-unattached no longer.
func (b *box) attached() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st == stateRunning {
		return nil
	}
	return b.moveLocked(stateRunning)
}

// holderGone records that the holder stopped answering: orphaned if runsc
// still runs the sandbox, exited otherwise. A box already known to have
// lost its holder stays as it is (two requests may find the same death).
func (b *box) holderGone(runscRuns bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.st == stateExited || b.st == stateOrphaned {
		return nil
	}
	if runscRuns && b.st != stateHibernated {
		return b.moveLocked(stateOrphaned)
	}
	return b.moveLocked(stateExited)
}

// info is what inspect and list report, read from the box's state alone
// and, while its holder lives, the holder's own answer to inspect
// (report, or the error asking it gave). It changes nothing: a holder
// found gone was recorded (Server.lose) before this is called.
func (b *box) info(report *Info, askErr error) Info {
	b.mu.Lock()
	st := b.st
	b.mu.Unlock()
	in := Info{Sandbox: b.id, Deployment: b.deployment, Agent: b.agent, Profile: b.profile}
	switch {
	case st.holderLives() && report != nil:
		in = *report
		if in.Status == StatusRunning && st == stateRunningUnattached {
			in.Status = StatusRunningUnattached
		}
	case st == stateHibernated:
		// The holder is slow; what the box knows is enough.
		in.Status, in.Reason = StatusHibernated, fmt.Sprintf("its holder did not answer inspect: %v", askErr)
	case st.holderLives():
		// Slow, not gone: report what is known and keep the holder.
		in.Status, in.Reason = StatusRunning, fmt.Sprintf("its holder did not answer inspect: %v", askErr)
	case st == stateOrphaned:
		in.Status, in.Reason = StatusOrphaned, "runsc still runs it but its holder is gone: its stdio cannot be recovered"
	default:
		// Exited; and a box deleted or still creating under a request
		// that raced it reads as ended, as it is to that request.
		in.Status, in.Reason = StatusExited, "ended when its holder ended; its output is lost"
	}
	return in
}
