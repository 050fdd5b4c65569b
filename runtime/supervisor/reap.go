package supervisor

import (
	"context"
	"time"

	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

// Deleting on exit (createSandbox deleteOnExit)
//
// A client that creates a sandbox only for one spawn (paseo-policy pi's
// probes) deletes it when the spawn ends, unless it is killed first. Such
// a sandbox then ends at its wall limit and would stay listed, its holder
// keeping its output and its place under maxSandboxes, until someone
// deleted it. With deleteOnExit, the supervisor deletes it once it has
// exited and no connection that created or attached it is still open: a
// client that lives reads the end and deletes it itself. The holder keeps
// the flag, so a restarted supervisor adopts and reaps it the same way.

// use records that the connection cn created or attached the box, until
// ctx (the connection's) ends.
func (b *box) use(ctx context.Context, cn any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.deleteOnExit || b.users[cn] {
		return
	}
	if b.users == nil {
		b.users = map[any]bool{}
	}
	b.users[cn] = true
	context.AfterFunc(ctx, func() {
		b.mu.Lock()
		delete(b.users, cn)
		b.mu.Unlock()
	})
}

// unused reports whether the box asked to be deleted on exit and nobody
// holds it.
func (b *box) unused() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.deleteOnExit && len(b.users) == 0
}

// reapExited deletes, every tick, the exited boxes that asked for it and
// that no open connection holds. It ends with ctx.
func (s *Server) reapExited(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		var boxes []*box
		for _, b := range s.boxes {
			if b.unused() {
				boxes = append(boxes, b)
			}
		}
		s.mu.Unlock()
		for _, b := range boxes {
			switch b.state() {
			case stateExited:
			case stateRunning, stateRunningUnattached:
				ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
				hs, err := holder.Inspect(ictx, b.sock)
				cancel()
				if err != nil || !hs.Exited {
					continue // running, or slow: the next tick
				}
			default:
				continue // hibernated (asleep, not ended), orphaned (runsc runs it), being deleted
			}
			if b.unused() {
				_ = s.delete(b)
			}
		}
	}
}
