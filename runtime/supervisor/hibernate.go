package supervisor

import (
	"context"
	"time"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Hibernate and wake, the supervisor's side (docs/supervisor.md "Hibernate")
//
// The holder checkpoints and restores; the supervisor decides when (an
// explicit hibernate, or idle for the deployment's hibernateAfterSeconds),
// moves the box between running and hibernated, resolves the secrets a
// wake injects again, and wakes a hibernated box before anything that
// needs its process: attach, write, closeInput, or an explicit wake. A
// wake that fails leaves the box hibernated and answers
// sandbox-unavailable with StartFresh: the caller deletes it and creates
// it again, never a silent cold start with different state.

// hibernating serializes hibernate and wake per box (and the wake a write
// or attach needs), so two requests never checkpoint or restore at once.
func (b *box) hibernation() func() {
	b.hmu.Lock()
	return b.hmu.Unlock
}

// hibernate checkpoints a running box.
func (s *Server) hibernate(ctx context.Context, b *box) (any, *Error) {
	defer b.hibernation()()
	st := b.state()
	if st == stateHibernated {
		in, _ := s.inspect(b)
		return in, nil
	}
	if st != stateRunning && st != stateRunningUnattached {
		return nil, fail(rpcerr.State, "sandbox %s is %s: only a running sandbox hibernates", b.id, st)
	}
	if _, err := holder.Hibernate(ctx, b.sock); err != nil {
		if holder.Dead(err) {
			_ = s.lose(b)
		}
		return nil, typed(err, "hibernate")
	}
	if err := b.move(stateHibernated); err != nil {
		return nil, fail(rpcerr.State, "%v", err)
	}
	in, _ := s.inspect(b)
	return in, nil
}

// awake wakes a hibernated box (a box that is not hibernated is left as
// it is) and holds off any hibernation until release: the request that
// needed the agent's process (a write, an attach) reaches the holder
// before an idle hibernation can begin.
func (s *Server) awake(ctx context.Context, b *box) (release func(), e *Error) {
	release = b.hibernation()
	if e := s.wakeLocked(ctx, b); e != nil {
		release()
		return func() {}, e
	}
	return release, nil
}

// wakeLocked restores a hibernated box; b.hmu is held.
func (s *Server) wakeLocked(ctx context.Context, b *box) *Error {
	if b.state() != stateHibernated {
		return nil
	}
	secrets, e := s.wakeSecrets(b)
	if e != nil {
		return e
	}
	ctx, cancel := context.WithTimeout(ctx, holder.WakeTimeout+5*time.Second)
	defer cancel()
	_, err := holder.Wake(ctx, b.sock, secrets)
	for k := range secrets {
		clear(secrets[k])
	}
	if err != nil {
		if holder.Dead(err) {
			_ = s.lose(b)
		}
		return typed(err, "wake")
	}
	if err := b.move(stateRunning); err != nil {
		return fail(rpcerr.State, "%v", err)
	}
	return nil
}

// wakeSecrets resolves the secrets the box's bundle names (its model
// route's key), now, in its deployment: a key rotated while the sandbox
// slept is the one the woken route adds.
func (s *Server) wakeSecrets(b *box) (map[string][]byte, *Error) {
	files, err := bundle.Read(s.bundleDir(b.id))
	if err != nil {
		return nil, &Error{Code: rpcerr.SandboxUnavailable, Message: "the sandbox's bundle: " + err.Error(), StartFresh: true}
	}
	refs, err := launcher.SecretRefs(files)
	if err != nil {
		return nil, &Error{Code: rpcerr.SandboxUnavailable, Message: err.Error(), StartFresh: true}
	}
	out := map[string][]byte{}
	for _, ref := range refs {
		if s.cfg.Secrets == nil {
			return nil, &Error{Code: rpcerr.SandboxUnavailable, Message: "the bundle needs secret " + ref + " and the supervisor has no secret source", StartFresh: true}
		}
		v, err := s.cfg.Secrets(b.deployment, ref)
		if err != nil {
			return nil, &Error{Code: rpcerr.SandboxUnavailable, Message: err.Error(), StartFresh: true}
		}
		out[ref] = v
	}
	return out, nil
}

// idleHibernation hibernates, every tick, the running boxes of each
// deployment with hibernateAfterSeconds whose holder reports neither input
// nor output for that long. It ends with ctx.
func (s *Server) idleHibernation(ctx context.Context, tick time.Duration) {
	idle := func(b *box) bool { return s.idleLimit(b.deployment) > 0 }
	s.everyTick(ctx, tick, idle, func(b *box) {
		if st := b.state(); st != stateRunning && st != stateRunningUnattached {
			return
		}
		hs, err := inspectBox(ctx, b)
		if err != nil || hs.Exited || hs.Hibernated || time.Duration(hs.IdleMillis)*time.Millisecond < s.idleLimit(b.deployment) {
			return
		}
		_, _ = s.hibernate(ctx, b) // refused (input-pending): next tick
	})
}

func (s *Server) idleLimit(deployment string) time.Duration {
	return time.Duration(s.reg.Deployments[deployment].HibernateAfterSeconds) * time.Second
}
