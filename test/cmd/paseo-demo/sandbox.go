package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// session is the demo as a Paseo daemon: a supervisor on a private socket
// and one client connection to it.
type session struct {
	t      *demoT
	dir    string // the socket's directory
	cl     *supervisor.Client
	id     string
	epoch  uint64
	tr     supervisor.Transcript
	inputs int
}

// supervise starts a supervisor over stateRoot on a socket in a fresh
// root-only directory, and connects to it. Its cleanup deletes every
// sandbox it still knows (holders included) and removes the socket.
func supervise(t *demoT, sc *scene, w *world, stateRoot, runsc string, secrets map[string][]byte) *session {
	dir, err := os.MkdirTemp("", "paseo-demo-")
	t.check(err, "supervisor socket dir")
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The supervisor's peers (here root) must be able to search it.
	t.check(os.Chmod(dir, 0o755), "supervisor socket dir")
	socket := filepath.Join(dir, "supervisor.sock")
	srv, err := supervisor.New(supervisor.Config{
		Registry: schema.Input{Name: "registry.json", Data: sc.registry},
		Socket:   socket, SocketGID: 0, StateRoot: stateRoot, RunscPath: runsc,
		Secrets: func(deployment, ref string) ([]byte, error) {
			if v, ok := secrets[ref]; ok && deployment == "host-alice" {
				return v, nil
			}
			return nil, fmt.Errorf("unknown secret %s for %s", ref, deployment)
		},
		Uplink:     w.net.Uplink,
		Resolve:    func(_ context.Context, host string) ([]netip.Addr, error) { return w.resolve(host) },
		ModelRoots: w.ca.PEM,
		// An ended sandbox's holder need not keep its output for a day.
		HolderLinger: 10 * time.Second,
	})
	t.check(err, "supervisor")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	var listenErr error
	go func() { listenErr = srv.Listen(ctx); close(served) }()
	t.Cleanup(func() { cancel(); srv.Shutdown(); <-served })
	s := &session{t: t, dir: dir}
	for i := 0; i < 200 && s.cl == nil; i++ {
		select {
		case <-served:
			t.fail("the supervisor stopped: %v", listenErr)
		default:
		}
		if s.cl, err = supervisor.Dial(socket); err != nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if s.cl == nil {
		t.fail("the supervisor socket never came up: %v", err)
	}
	t.Cleanup(func() { s.cl.Close() })
	return s
}

func (s *session) call(ctx context.Context, req supervisor.Request, result any) {
	if err := s.cl.Call(ctx, req, result); err != nil {
		s.t.fail("%s: %v", req.Op, err)
	}
}

// create makes the sandbox from the deployment and the facts alone, as a
// daemon does, handing over its MCP bearer.
func (s *session) create(ctx context.Context, facts []byte, mcpToken string) {
	var in supervisor.Info
	s.call(ctx, supervisor.Request{Op: "createSandbox", Deployment: "host-alice", Facts: facts, MCPToken: mcpToken}, &in)
	s.id = in.Sandbox
	var att struct{ Epoch uint64 }
	s.call(ctx, supervisor.Request{Op: "attach", Sandbox: s.id}, &att)
	s.epoch = att.Epoch
}

// send writes one RPC command line to Pi's stdin.
func (s *session) send(ctx context.Context, cmd map[string]any) {
	s.inputs++
	line, _ := json.Marshal(cmd)
	s.call(ctx, supervisor.Request{Op: "write", Sandbox: s.id, Epoch: s.epoch,
		InputID: fmt.Sprintf("demo-%d", s.inputs), Data: append(line, '\n')}, nil)
}

// until reads output until Pi's stdout holds want, acknowledging what it
// read.
func (s *session) until(ctx context.Context, want string) {
	for !strings.Contains(s.tr.Stdout.String(), want) {
		select {
		case e, ok := <-s.cl.Events:
			if !ok {
				s.t.fail("the supervisor connection closed before %s", want)
			}
			s.t.check(s.tr.Add(e), "transcript")
		case <-ctx.Done():
			s.t.fail("waiting for %s: %v; Pi's output ends: %q; its stderr ends: %q", want, ctx.Err(), tail(s.tr.Stdout.String(), 600), tail(s.tr.Stderr.String(), 600))
		}
	}
	_ = s.cl.Call(ctx, supervisor.Request{Op: "ack", Sandbox: s.id, Cursor: s.tr.Cursor}, nil)
}

// finish ends Pi's input, waits for the sandbox to exit, and returns what
// the supervisor reports of it then: its exit and its network counters.
func (s *session) finish(ctx context.Context) supervisor.Info {
	s.call(ctx, supervisor.Request{Op: "closeInput", Sandbox: s.id, Epoch: s.epoch}, nil)
	for {
		var in supervisor.Info
		s.call(ctx, supervisor.Request{Op: "inspect", Sandbox: s.id}, &in)
		if in.Status == supervisor.StatusExited {
			return in
		}
		select {
		case <-ctx.Done():
			s.t.fail("the sandbox did not exit after its input closed: %+v", in)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *session) delete(ctx context.Context) {
	s.call(ctx, supervisor.Request{Op: "delete", Sandbox: s.id}, nil)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
