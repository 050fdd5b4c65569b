package launcher

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// Transport through the launcher with the deterministic fake Pi (no Node,
// so these run fast): JSONL framing both ways, stderr kept apart from the
// protocol stream, EOF ends the agent, its exit status comes back, and
// processes it started do not outlive the sandbox.
func fakePiScene(t *testing.T, env ...string) *sandbox {
	bin := testbundle.BuildStatic(t, "./test/cmd/fake-pi")
	argv := append([]string{"/bin/busybox", "env"}, env...)
	argv = append(argv, "/bin/pi", "--mode", "rpc", "--no-session")
	sc := testbundle.New(t, testbundle.Options{Argv: argv, RootfsFiles: map[string]string{"/bin/pi": bin}})
	return sceneSandbox(sc)
}

type launched struct {
	client *piproto.Client
	stdin  io.WriteCloser
	stderr *lineWaiter
	done   chan Result
}

func (s *sandbox) start(t *testing.T) *launched {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	l := &launched{client: piproto.New(outR, inW), stdin: inW, stderr: newLineWaiter("\x00never"), done: make(chan Result, 1)}
	go func() {
		res, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
			Secrets: staticSecret("v"), Stdin: inR, Stdout: outW, Stderr: l.stderr})
		if err != nil {
			t.Errorf("launch: %v", err)
		}
		outW.Close()
		l.done <- res
	}()
	return l
}

func (l *launched) wait(t *testing.T) Result {
	select {
	case r := <-l.done:
		return r
	case <-time.After(60 * time.Second):
		t.Fatal("the sandbox did not end")
		return Result{}
	}
}

func TestTransportTurnAndEOF(t *testing.T) {
	s := fakePiScene(t, "FAKE_PI_STDERR=diagnostic-line", "FAKE_PI_TURN_MS=300")
	l := s.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, _, err := l.client.Call(ctx, map[string]any{"type": "get_state"})
	if err != nil || !resp.OK() {
		t.Fatalf("get_state: %+v %v", resp, err)
	}
	resp, _, err = l.client.Call(ctx, map[string]any{"type": "prompt", "message": "hello"})
	if err != nil || !resp.OK() {
		t.Fatalf("prompt: %+v %v", resp, err)
	}
	_, events, err := l.client.Until(ctx, piproto.Event("agent_settled"))
	if err != nil {
		t.Fatal(err)
	}
	types := strings.Join(piproto.Types(events), ",")
	if !strings.HasPrefix(types, "agent_start,turn_start,message_start") || !strings.Contains(types, "agent_end") {
		t.Errorf("turn events: %s", types)
	}
	// Abort mid-turn: the aborted message and agent_settled, then the response.
	if _, _, err := l.client.Call(ctx, map[string]any{"type": "prompt", "message": "long"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.client.Until(ctx, piproto.Event("message_update")); err != nil {
		t.Fatal(err)
	}
	id, _ := l.client.Send(map[string]any{"type": "abort"})
	_, before, err := l.client.Until(ctx, piproto.Response(id))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(piproto.Types(before), ","); !strings.Contains(got, "agent_settled") {
		t.Errorf("abort: agent_settled did not come before the response: %s", got)
	}
	l.stdin.Close()
	res := l.wait(t)
	if res.ExitCode != 0 || res.Reason != "" {
		t.Errorf("after EOF: %+v", res)
	}
	l.stderr.mu.Lock()
	errText := l.stderr.buf.String()
	l.stderr.mu.Unlock()
	if !strings.Contains(errText, "diagnostic-line") {
		t.Errorf("stderr lost: %q", errText)
	}
	s.assertClean(t)
}

func TestTransportExitStatusAndDescendants(t *testing.T) {
	s := fakePiScene(t, "FAKE_PI_EXIT_CODE=3", "FAKE_PI_SPAWN=3", "FAKE_PI_SPAWN_SETSID=1", "FAKE_PI_CHILD_IGNORE_TERM=1", "FAKE_PI_CHILD_SECONDS=120")
	l := s.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, _, err := l.client.Call(ctx, map[string]any{"type": "get_state"}); err != nil {
		t.Fatal(err)
	}
	l.stdin.Close()
	res := l.wait(t)
	if res.ExitCode != 3 {
		t.Errorf("exit %d, want the agent's 3", res.ExitCode)
	}
	// Children in their own session that ignore SIGTERM are gone with the
	// sandbox: nothing is left in runsc, no run dir, no mount.
	s.assertClean(t)
}

// A signal from the caller (here: cancelling the launch, as the CLI does
// on SIGINT/SIGTERM) reaches the agent as SIGTERM; it exits 143 and the
// sandbox is torn down.
func TestTransportSignal(t *testing.T) {
	s := fakePiScene(t)
	inR, inW := io.Pipe()
	defer inW.Close()
	outR, outW := io.Pipe()
	client := piproto.New(outR, inW)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Result, 1)
	go func() {
		res, err := Launch(ctx, Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
			Secrets: staticSecret("v"), Stdin: inR, Stdout: outW})
		if err != nil {
			t.Errorf("launch: %v", err)
		}
		outW.Close()
		done <- res
	}()
	c, stop := context.WithTimeout(context.Background(), 60*time.Second)
	defer stop()
	if _, _, err := client.Call(c, map[string]any{"type": "get_state"}); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case res := <-done:
		if res.Reason != "cancelled" || res.ExitCode != 143 {
			t.Errorf("after cancel: %+v, want reason cancelled and exit 143 (SIGTERM)", res)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the sandbox did not end after cancel")
	}
	s.assertClean(t)
}
