package supervisor

import (
	"errors"
	"fmt"
	"testing"
)

var allStates = []state{stateNone, stateCreating, stateRunning, stateRunningUnattached, stateExited, stateOrphaned, stateDeleted, stateHibernated}

// The state diagram, written out here independently of the table in
// state.go: every move listed is allowed, every other one refused with the
// state left as it was.
func TestStateTransitions(t *testing.T) {
	want := map[[2]state]bool{
		{stateNone, stateCreating}:              true, // createSandbox
		{stateNone, stateRunningUnattached}:     true, // adoption of a live holder
		{stateNone, stateOrphaned}:              true, // found on start, runsc runs it
		{stateNone, stateExited}:                true, // found on start, runsc does not
		{stateCreating, stateRunning}:           true, // the holder reported started
		{stateCreating, stateDeleted}:           true, // the launch failed
		{stateRunning, stateExited}:             true,
		{stateRunning, stateOrphaned}:           true,
		{stateRunning, stateDeleted}:            true,
		{stateRunningUnattached, stateRunning}:  true, // a client attached
		{stateRunningUnattached, stateExited}:   true,
		{stateRunningUnattached, stateOrphaned}: true,
		{stateRunningUnattached, stateDeleted}:  true,
		{stateOrphaned, stateDeleted}:           true,
		{stateExited, stateDeleted}:             true,
		// Hibernation (docs/supervisor.md "Hibernate").
		{stateNone, stateHibernated}:              true, // adoption of a hibernated sandbox's holder
		{stateRunning, stateHibernated}:           true, // hibernate, idle
		{stateRunningUnattached, stateHibernated}: true,
		{stateHibernated, stateRunning}:           true, // a wake
		{stateHibernated, stateExited}:            true, // the holder found gone
		{stateHibernated, stateDeleted}:           true,
	}
	for _, from := range allStates {
		for _, to := range allStates {
			t.Run(fmt.Sprintf("%s->%s", from, to), func(t *testing.T) {
				b := &box{id: "pp-t", st: from}
				err := b.move(to)
				if want[[2]state{from, to}] {
					if err != nil || b.st != to {
						t.Fatalf("refused an allowed move: %v (now %s)", err, b.st)
					}
					return
				}
				var te *transitionError
				if !errors.As(err, &te) || te.from != from || te.to != to {
					t.Fatalf("an illegal move was not refused as one: %v", err)
				}
				if b.st != from {
					t.Fatalf("a refused move changed the state to %s", b.st)
				}
			})
		}
	}
}

// newBox starts a life only in a first state; a box made in any other is
// refused.
func TestNewBoxFirstStates(t *testing.T) {
	for _, first := range allStates {
		b, err := newBox("pp-t", "d", "a", "p", "", first)
		ok := first == stateCreating || first == stateRunningUnattached || first == stateOrphaned || first == stateExited || first == stateHibernated
		if ok != (err == nil) || (ok && b.state() != first) {
			t.Errorf("newBox(%s): %v", first, err)
		}
	}
}

// The moves requests make: an attach ends running-unattached and is a
// no-op when running, a holder found gone twice is recorded once, and
// neither revives a box whose holder is gone or that was deleted.
func TestStateMovesOfRequests(t *testing.T) {
	b := &box{id: "pp-t", st: stateRunningUnattached}
	if err := b.attached(); err != nil || b.st != stateRunning {
		t.Fatalf("attach of an adopted box: %v %s", err, b.st)
	}
	if err := b.attached(); err != nil || b.st != stateRunning {
		t.Fatalf("second attach: %v %s", err, b.st)
	}
	if err := b.holderGone(true); err != nil || b.st != stateOrphaned {
		t.Fatalf("holder gone, runsc runs it: %v %s", err, b.st)
	}
	if err := b.holderGone(false); err != nil || b.st != stateOrphaned {
		t.Fatalf("holder found gone again: %v %s", err, b.st)
	}
	if err := b.attached(); err == nil || b.st != stateOrphaned {
		t.Fatalf("attach revived an orphan: %v %s", err, b.st)
	}
	d := &box{id: "pp-d", st: stateDeleted}
	if err := d.holderGone(false); err == nil || d.st != stateDeleted {
		t.Fatalf("a deleted box lost its holder: %v %s", err, d.st)
	}
	for _, st := range []state{stateRunning, stateHibernated} {
		if s := (&box{st: st, sock: "x"}).holder(); s != "x" {
			t.Errorf("%s box's holder: %q", st, s)
		}
	}
	h := &box{id: "pp-h", st: stateHibernated}
	if err := h.holderGone(true); err != nil || h.st != stateExited {
		t.Fatalf("a hibernated box's holder gone: %v %s, want exited (nothing runs)", err, h.st)
	}
	for _, st := range []state{stateExited, stateOrphaned, stateDeleted, stateCreating} {
		if s := (&box{st: st, sock: "x"}).holder(); s != "" {
			t.Errorf("a %s box offers its holder %q", st, s)
		}
	}
}

// info reads the state (and the holder's report) and reports the wire
// statuses of protocol.go; it changes nothing.
func TestInfoReadsStateOnly(t *testing.T) {
	running := &Info{Sandbox: "pp-t", Status: StatusRunning, NextSeq: 7}
	ended := &Info{Sandbox: "pp-t", Status: StatusExited}
	cases := []struct {
		st     state
		report *Info
		askErr error
		status string
	}{
		{stateRunning, running, nil, StatusRunning},
		{stateRunningUnattached, running, nil, StatusRunningUnattached},
		{stateRunningUnattached, ended, nil, StatusExited},
		{stateRunningUnattached, nil, errors.New("slow"), StatusRunning},
		{stateRunning, nil, errors.New("slow"), StatusRunning},
		{stateOrphaned, nil, nil, StatusOrphaned},
		{stateExited, nil, nil, StatusExited},
		{stateHibernated, &Info{Sandbox: "pp-t", Status: StatusHibernated}, nil, StatusHibernated},
		{stateHibernated, nil, errors.New("slow"), StatusHibernated},
	}
	for _, c := range cases {
		b := &box{id: "pp-t", st: c.st}
		in := b.info(c.report, c.askErr)
		if in.Status != c.status || b.st != c.st {
			t.Errorf("%s with %+v: status %q (state now %s), want %q", c.st, c.report, in.Status, b.st, c.status)
		}
	}
	if in := (&box{st: stateExited}).info(nil, nil); in.Reason != "ended when its holder ended; its output is lost" {
		t.Errorf("exited reason: %q", in.Reason)
	}
}

// A box counts under maxSandboxes while it costs the host a holder or a
// sandbox runsc runs, and while hibernated (a wake must fit the cap).
func TestStateCounts(t *testing.T) {
	for _, st := range allStates {
		want := st == stateRunning || st == stateRunningUnattached || st == stateOrphaned || st == stateHibernated
		if st.counts() != want {
			t.Errorf("%s counts: %v, want %v", st, st.counts(), want)
		}
	}
}
