package holder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// Hibernation, the holder's side (docs/supervisor.md "Hibernate")
//
// The holder stays alive while its sandbox is hibernated: it owns the
// bridge (the output log, the cursor, the epoch that fences writes, the
// input ids already applied), the route proxy's token and the pipes the
// woken sandbox writes into, so a hibernation loses none of them and a
// supervisor that restarts meanwhile adopts the holder as it would a
// running one. Its cost is one small process; the sandbox's memory,
// network, cgroup and run dir are released.

// WakeTimeout bounds a wake (a restore takes well under a second; the
// bound covers the image digest of a large agent on a slow disk).
const WakeTimeout = 60 * time.Second

func (h *holder) hibernator() (execution.Hibernator, *Error) {
	hp, ok := h.proc.(execution.Hibernator)
	if !ok {
		return nil, fail(rpcerr.State, "sandbox %s cannot hibernate", h.spec.ID)
	}
	return hp, nil
}

func (h *holder) hibernated() bool {
	hp, ok := h.proc.(execution.Hibernator)
	return ok && hp.Hibernated()
}

func (h *holder) hibernate() (any, *Error) {
	hp, e := h.hibernator()
	if e != nil {
		return nil, e
	}
	if err := hp.Hibernate(); err != nil {
		switch {
		case errors.Is(err, execution.ErrNotRunning):
			return nil, fail(rpcerr.State, "sandbox %s is not running", h.spec.ID)
		case errors.Is(err, execution.ErrInputPending):
			return nil, fail(rpcerr.InputPending, "sandbox %s has not taken the input it was given yet: it is busy and runs on; retry the hibernate once it has read it", h.spec.ID)
		}
		return nil, fail(rpcerr.Internal, "%v", err)
	}
	return h.state(), nil
}

// wake restores the sandbox with the secrets the supervisor resolved now;
// the holder's copy is cleared once the wake has used them (the model
// key is kept in modelKey).
func (h *holder) wake(secrets map[string][]byte) (any, *Error) {
	defer func() {
		for k := range secrets {
			clear(secrets[k])
		}
	}()
	hp, e := h.hibernator()
	if e != nil {
		return nil, e
	}
	if k := h.spec.ModelKey; k != nil {
		// The key as it is now: one rotated while the sandbox slept is the
		// one its next request carries. A bad one is forgotten, so the
		// wake's model route refuses it rather than keep the old key.
		if v, ok := secrets[k.Ref]; ok {
			if err := h.modelKey.Set(v); err != nil {
				h.modelKey.Clear()
			}
		}
	}
	src := func(deployment, ref string) ([]byte, error) {
		if v, ok := secrets[ref]; ok && deployment == h.spec.Deployment {
			return append([]byte(nil), v...), nil
		}
		return nil, fmt.Errorf("secret %s was not resolved by the supervisor", ref)
	}
	ctx, cancel := context.WithTimeout(context.Background(), WakeTimeout)
	defer cancel()
	if err := hp.Wake(ctx, src); err != nil {
		var ue *launcher.UnavailableError
		switch {
		case errors.Is(err, execution.ErrNotRunning):
			return nil, fail(rpcerr.State, "sandbox %s is not hibernated", h.spec.ID)
		case errors.As(err, &ue):
			return nil, &rpcerr.Error{Code: rpcerr.SandboxUnavailable, Message: err.Error(), Diagnostics: launchDiagnostics(err), StartFresh: true}
		}
		return nil, fail(rpcerr.Internal, "wake: %v", err)
	}
	h.touched()
	return h.state(), nil
}

// touched records input (or a wake) for the idle clock.
func (h *holder) touched() {
	h.mu.Lock()
	h.active = time.Now()
	h.mu.Unlock()
}

// idle is how long neither input nor output moved; next is the bridge's
// next sequence number, which moves with every output record.
func (h *holder) idle(next uint64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if next != h.seenSeq {
		h.seenSeq, h.active = next, time.Now()
	}
	return time.Since(h.active)
}

// Hibernate has the holder checkpoint its sandbox.
func Hibernate(ctx context.Context, sock string) (State, error) {
	var st State
	err := call(ctx, sock, Request{Op: OpHibernate}, &st)
	return st, err
}

// Wake has the holder restore its sandbox with these secret values (the
// deployment's, resolved by the supervisor now).
func Wake(ctx context.Context, sock string, secrets map[string][]byte) (State, error) {
	var st State
	err := call(ctx, sock, Request{Op: OpWake, Secrets: secrets}, &st)
	return st, err
}
