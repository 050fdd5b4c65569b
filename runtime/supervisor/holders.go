package supervisor

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
	"paseo.dev/paseo-policy/runtime/supervisor/holder"
	"paseo.dev/paseo-policy/runtime/supervisor/rpcerr"
)

// The supervisor's side of the holders: what it resolves for a new
// holder, and the adoption of holders an earlier supervisor started. The
// holder process and its protocol are package holder's.

// HolderDir holds the holders' sockets and logs (root-only, in the state root).
func HolderDir(stateRoot string) string { return holder.Dir(stateRoot) }

func holderSocket(stateRoot, id string) string { return holder.Socket(stateRoot, id) }

// typed passes a holder's typed refusal through to the client as it is
// (the codes are rpcerr's, one meaning in both protocols: a wake the
// holder refused is already sandbox-unavailable with startFresh) and wraps
// anything else.
func typed(err error, format string, a ...any) *Error {
	var he *rpcerr.Error
	if errors.As(err, &he) {
		return he
	}
	return fail(rpcerr.Internal, format+": %v", append(a, err)...)
}

// fromHolder is a holder's state as the client protocol reports it.
func fromHolder(st holder.State) Info {
	in := Info{Sandbox: st.Sandbox, Deployment: st.Deployment, Agent: st.Agent, Profile: st.Profile, Status: StatusRunning,
		ExitCode: st.ExitCode, Reason: st.Reason, Limit: st.Limit, Epoch: st.Epoch, NextSeq: st.NextSeq, Acked: st.Acked, Paused: st.Paused,
		Packets: st.Packets, Routes: st.Routes, Search: st.Search}
	switch {
	case st.Exited:
		in.Status = StatusExited
	case st.Hibernated:
		in.Status = StatusHibernated
	}
	return in
}

// prepare resolves, on the supervisor's side, what the launch will need
// from the supervisor's configuration: the secrets the bundle names and
// the egress host names to pin. files are the compile's bytes: the bundle
// directory is read by the launcher alone. What prepare takes from them
// only selects what to hand over; the launcher checks the bundle it reads
// against the same digests and refuses a launch whose key ref or hosts
// differ.
func (s *Server) prepare(spec *holder.Spec, files bundle.Files) *Error {
	m, err := files.Manifest()
	if err != nil {
		return fail(rpcerr.Internal, "bundle: %v", err)
	}
	if m.Deployment != spec.Deployment {
		return fail(rpcerr.Internal, "bundle compiled for deployment %q, the sandbox is %q's", m.Deployment, spec.Deployment)
	}
	refs, err := launcher.SecretRefs(files)
	if err != nil {
		return unavailable(diag.LaunchBundle, "bundle", "%v", err)
	}
	// Secrets are looked up in the deployment the peer is bound to and the
	// facts name (create checked both), never in another's.
	for _, ref := range refs {
		if s.cfg.Secrets == nil {
			return unavailable(diag.LaunchSecret, "secret", "the bundle needs secret %s and the supervisor has no secret source", ref)
		}
		v, err := s.cfg.Secrets(spec.Deployment, ref)
		if err != nil {
			return unavailable(diag.LaunchSecret, "secret", "%v", err)
		}
		if spec.Secrets == nil {
			spec.Secrets = map[string][]byte{}
		}
		spec.Secrets[ref] = v
	}
	spec.ModelRoots, spec.SecretsDir = s.cfg.ModelRoots, s.cfg.SecretsDir
	eg, err := files.Egress()
	if err != nil {
		return fail(rpcerr.Internal, "bundle: %v", err)
	}
	resolve := s.cfg.Resolve
	if resolve == nil {
		resolve = sandboxnet.SystemResolver
	}
	hosts := []string{}
	for _, r := range eg.Rules {
		hosts = append(hosts, r.Host)
	}
	for _, r := range eg.Routes {
		if r.Purpose != "model" {
			continue
		}
		// The holder keeps the provider key for the model route's proxy,
		// which dials the provider from the holder.
		spec.ModelKeyRef = r.TokenRef
		if u, err := url.Parse(r.Upstream); err == nil {
			hosts = append(hosts, u.Hostname())
		}
		// A login route (oauth-broker) also dials the token endpoint, and
		// reads its login from the deployment's auth.json itself: no key.
		if u, err := url.Parse(r.LoginRefresh); err == nil && r.LoginRefresh != "" {
			hosts = append(hosts, u.Hostname())
		}
	}
	for _, host := range hosts {
		if _, err := netip.ParseAddr(host); err == nil || spec.Pins[host] != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := resolve(ctx, host)
		cancel()
		if err != nil {
			// The launcher refuses the launch and names the host.
			continue
		}
		if spec.Pins == nil {
			spec.Pins = map[string][]netip.Addr{}
		}
		spec.Pins[host] = addrs
	}
	return nil
}

// unavailable is a launch the supervisor refuses before any holder runs,
// with the launch step's code as the launcher's own refusal carries it
// (launch.<step>).
func unavailable(code diag.Code, step, format string, a ...any) *Error {
	e := fail(rpcerr.Unavailable, format, a...)
	e.Diagnostics = diag.List{{Code: code, Path: "launch." + step, Message: e.Message}}
	return e
}

// spawn starts a holder for spec and waits until its sandbox runs (or the
// launch failed).
func (s *Server) spawn(spec holder.Spec) *Error {
	err := holder.Spawn(spec)
	var le *holder.LaunchError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &le) && le.Unavailable:
		// The preflight's codes pass through as they are (rpcerr's
		// Diagnostics), never remapped.
		return &Error{Code: rpcerr.Unavailable, Message: le.Message, Diagnostics: le.Diagnostics}
	default:
		return fail(rpcerr.Internal, "%v", err)
	}
}

// sandboxIDForm is the form of the ids newID makes.
var sandboxIDForm = regexp.MustCompile(`^pp-[0-9a-f]{16}$`)

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
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		in, err := holder.Inspect(ctx, sock)
		cancel()
		if err != nil && holder.Dead(err) {
			// Nothing can reach this sandbox any more: its bundle and the
			// holder's log go with the socket (the launcher's objects are
			// gc's). Only a name of this supervisor's own form is joined
			// into a path.
			if id := strings.TrimSuffix(name, ".sock"); sandboxIDForm.MatchString(id) {
				_ = os.RemoveAll(s.bundleDir(id))
				_ = os.Remove(holder.Log(s.cfg.StateRoot, id))
			}
			_ = os.Remove(sock)
			continue
		}
		if err != nil || in.Sandbox+".sock" != name {
			// Slow or confused: leave it for the next reconcile rather
			// than cut a live holder off from every supervisor.
			continue
		}
		first := stateRunningUnattached
		if in.Hibernated {
			first = stateHibernated // still the holder's, still wakeable
		}
		b, err := newBox(in.Sandbox, in.Deployment, in.Agent, in.Profile, sock, first)
		if err != nil {
			continue // cannot happen: a new box may always be adopted
		}
		b.deleteOnExit = in.DeleteOnExit
		s.boxes[in.Sandbox] = b
	}
}
