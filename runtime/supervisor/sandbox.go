package supervisor

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

// What the server does to one sandbox, for the ops and for itself
// (reconciliation, Shutdown).

// lose records that a box's holder stopped answering, in the request that
// found it out: runsc may still run its sandbox (orphaned) or it ended
// with the holder (exited).
func (s *Server) lose(b *box) error {
	runs := false
	if entries, err := s.inventory().PS(); err == nil {
		for _, e := range entries {
			if e.ID == b.id {
				runs = e.Status == "running" || e.Status == "created"
			}
		}
	}
	return b.holderGone(runs)
}

// inspect asks a live holder for its sandbox's state, records a holder it
// finds gone (lose), and then answers from the box's state. The error is a
// move the state table refused (the box was deleted meanwhile).
func (s *Server) inspect(b *box) (Info, error) {
	sock := b.holder()
	if sock == "" {
		return b.info(nil, nil), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	st, err := holder.Inspect(ctx, sock)
	cancel()
	if err == nil {
		in := fromHolder(st)
		return b.info(&in, nil), nil
	}
	if holder.Dead(err) {
		if lerr := s.lose(b); lerr != nil {
			return b.info(nil, nil), lerr
		}
	}
	return b.info(nil, err), nil
}

// delete stops the sandbox if it runs and removes everything it had.
func (s *Server) delete(b *box) error {
	b.mu.Lock()
	st, sock := b.st, b.sock
	if b.detach != nil {
		b.detach()
	}
	b.mu.Unlock()
	if st == stateDeleted {
		return nil // a delete that raced this one did the work
	}
	gone := !st.holderLives()
	if !gone {
		// The holder's launcher stops runsc and tears everything down;
		// release then ends the holder.
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		_, err := holder.Stop(ctx, sock)
		if err == nil {
			err = holder.Release(ctx, sock)
		}
		if err != nil {
			if !holder.Dead(err) {
				return err
			}
			// The holder died meanwhile: remove as gc would.
			if err := s.lose(b); err != nil {
				return err
			}
			gone = true
		}
	}
	if gone {
		s.awaitLauncherEnd(b.id, 10*time.Second)
		rep, err := s.inventory().Remove(b.id)
		if err != nil {
			return err
		}
		if len(rep.Errors) > 0 {
			return fmt.Errorf("%s", strings.Join(rep.Errors, "; "))
		}
	}
	_ = os.RemoveAll(s.bundleDir(b.id))
	_ = os.Remove(s.gitRecordPath(b.id))
	_ = launcher.RemoveHibernation(s.cfg.StateRoot, b.id) // the holder's stop removed it, unless the holder was gone
	_ = os.Remove(holder.Log(s.cfg.StateRoot, b.id))
	_ = os.Remove(holderSocket(s.cfg.StateRoot, b.id))
	s.mu.Lock()
	delete(s.boxes, b.id)
	s.mu.Unlock()
	if err := b.move(stateDeleted); err != nil && b.state() != stateDeleted {
		return err
	}
	return nil
}

// awaitLauncherEnd gives a holder that just died the moment it takes to be
// reaped (a zombie still counts as a live launcher), so that delete does
// not refuse it.
func (s *Server) awaitLauncherEnd(id string, d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		r, ok, err := statedir.Lookup(s.cfg.StateRoot, id)
		if err != nil || !ok || !r.LauncherAlive() {
			return
		}
	}
}
