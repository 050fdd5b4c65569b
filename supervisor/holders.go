package supervisor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/launcher"
	"paseo.dev/paseo-policy/launcher/sandboxnet"
)

// The supervisor's side of the holders (see holder.go).

// holderExe is what the supervisor re-executes as a holder. /proc/self/exe
// is this very binary even after an upgrade replaced the file on disk, so
// a holder always speaks the protocol of the supervisor that started it.
const holderExe = "/proc/self/exe"

// dialHolder connects to a holder's socket. events bounds the events
// buffered for a stream connection (control calls need none).
func dialHolder(sock string, events int) (*Client, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	return newClient(c, events), nil
}

// holderCall runs one request on a fresh connection to the holder. A
// holder's typed refusal comes back as *Error.
func holderCall(ctx context.Context, sock string, req Request, result any) error {
	c, err := dialHolder(sock, 1)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(ctx, req, result)
}

// typed passes a holder's typed refusal through and wraps anything else.
func typed(err error, format string, a ...any) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return fail(ErrInternal, format+": %v", append(a, err)...)
}

// prepare resolves, on the supervisor's side, what the launch will need
// from the supervisor's configuration: the secrets the bundle names and
// the egress host names to pin.
func (s *Server) prepare(spec *holderSpec) *Error {
	files, err := bundle.Read(spec.BundleDir)
	if err != nil {
		return fail(ErrInternal, "bundle: %v", err)
	}
	m, err := files.Manifest()
	if err != nil {
		return fail(ErrInternal, "bundle: %v", err)
	}
	if m.Deployment != spec.Deployment {
		return fail(ErrInternal, "bundle compiled for deployment %q, the sandbox is %q's", m.Deployment, spec.Deployment)
	}
	refs, err := launcher.SecretRefs(files)
	if err != nil {
		return fail(ErrUnavailable, "%v", err)
	}
	// Secrets are looked up in the deployment the peer is bound to and the
	// facts name (create checked both), never in another's.
	for _, ref := range refs {
		if s.cfg.Secrets == nil {
			return fail(ErrUnavailable, "the bundle needs secret %s and the supervisor has no secret source", ref)
		}
		v, err := s.cfg.Secrets(spec.Deployment, ref)
		if err != nil {
			return fail(ErrUnavailable, "%v", err)
		}
		if spec.Secrets == nil {
			spec.Secrets = map[string][]byte{}
		}
		spec.Secrets[ref] = v
	}
	eg, err := files.Egress()
	if err != nil {
		return fail(ErrInternal, "bundle: %v", err)
	}
	resolve := s.cfg.Resolve
	if resolve == nil {
		resolve = sandboxnet.SystemResolver
	}
	for _, r := range eg.Rules {
		if _, err := netip.ParseAddr(r.Host); err == nil || spec.Pins[r.Host] != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := resolve(ctx, r.Host)
		cancel()
		if err != nil {
			// The launcher refuses the launch and names the host.
			continue
		}
		if spec.Pins == nil {
			spec.Pins = map[string][]netip.Addr{}
		}
		spec.Pins[r.Host] = addrs
	}
	return nil
}

// spawn starts a holder for spec and waits until its sandbox runs (or the
// launch failed). The holder runs in a session of its own, so signals for
// the supervisor's process group do not reach it; this process reaps it if
// it is still the parent when the holder ends.
func (s *Server) spawn(spec holderSpec) *Error {
	dir := HolderDir(spec.StateRoot)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(ErrInternal, "%v", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, spec.ID+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fail(ErrInternal, "holder log: %v", err)
	}
	defer logf.Close()
	specR, specW, err := os.Pipe()
	if err != nil {
		return fail(ErrInternal, "%v", err)
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return fail(ErrInternal, "%v", err)
	}
	defer readyR.Close()
	cmd := exec.Command(holderExe)
	cmd.Args = []string{"paseo-sandbox-holder", spec.ID}
	cmd.Env = []string{HolderEnv + "=1", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stderr = specR, logf
	cmd.ExtraFiles = []*os.File{readyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	specR.Close()
	readyW.Close()
	if err != nil {
		specW.Close()
		return fail(ErrInternal, "starting the holder: %v", err)
	}
	go func() { _ = cmd.Wait() }()
	err = json.NewEncoder(specW).Encode(spec)
	specW.Close()
	for _, v := range spec.Secrets {
		clear(v) // the holder has them now; no copy stays here
	}
	if err != nil {
		return fail(ErrInternal, "holder spec: %v", err)
	}
	line, rerr := bufio.NewReader(readyR).ReadBytes('\n')
	var ready holderReady
	if json.Unmarshal(line, &ready) != nil {
		return fail(ErrInternal, "the holder ended before its sandbox started (%v); see %s", rerr, logf.Name())
	}
	switch {
	case ready.OK:
		return nil
	case ready.Unavailable:
		return fail(ErrUnavailable, "%s", ready.Error)
	default:
		return fail(ErrInternal, "%s", ready.Error)
	}
}

// adoptHolders finds the holders an earlier supervisor started. Each one
// answers inspect with its sandbox's identity and state; a socket nothing
// listens on is a holder that died, and is removed.
func (s *Server) adoptHolders() {
	ents, _ := os.ReadDir(HolderDir(s.cfg.StateRoot))
	for _, e := range ents {
		name := e.Name()
		if filepath.Ext(name) != ".sock" {
			continue
		}
		sock := filepath.Join(HolderDir(s.cfg.StateRoot), name)
		var in Info
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := holderCall(ctx, sock, Request{Op: "inspect"}, &in)
		cancel()
		if err != nil && holderDead(err) {
			_ = os.Remove(sock)
			continue
		}
		if err != nil || in.Sandbox+".sock" != name {
			// Slow or confused: leave it for the next reconcile rather
			// than cut a live holder off from every supervisor.
			continue
		}
		b, err := newBox(in.Sandbox, in.Deployment, in.Agent, in.Profile, sock, stateRunningUnattached)
		if err != nil {
			continue // cannot happen: a new box may always be adopted
		}
		s.boxes[in.Sandbox] = b
	}
}

// holderDead tells a holder that is gone (nothing listens on its socket,
// or the socket is gone) from one that is only slow to answer.
func holderDead(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}
