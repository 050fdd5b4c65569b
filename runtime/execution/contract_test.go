package execution_test

import (
	"context"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/localexec"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/execution"
	"paseo.dev/paseo-policy/runtime/launcher/ociexec"
)

// The same contract, checked against both adapters: stdio moves bytes with
// stdout and stderr apart, the exit status comes back, a signal reaches the
// process, Stop ends it and tears down, and each backend refuses the other
// kind of spec. The OCI adapter (runtime/launcher/ociexec) runs the
// compiled bundle under the pinned runsc (root, bin/runsc, busybox); the
// local one (test support, internal/testkit/localexec) the same script on
// the host, so the contract is checked against the seam, not against one
// adapter's habits.

// backendCase starts script under one backend.
type backendCase struct {
	name  string
	start func(t *testing.T, script string) execution.Process
	other execution.Spec // the kind of spec this backend must refuse
	b     execution.Backend
}

func cases(t *testing.T) []backendCase {
	local := localexec.Local{Grace: time.Second}
	return []backendCase{
		{name: "local", b: local, other: execution.Spec{Bundle: "/nonexistent"},
			start: func(t *testing.T, script string) execution.Process {
				p, err := local.Start(context.Background(), execution.Spec{Command: &execution.Command{Argv: testbundle.Script(script)}})
				if err != nil {
					t.Fatal(err)
				}
				return p
			}},
		{name: "oci", b: ociexec.OCI{}, other: execution.Spec{Command: &execution.Command{Argv: []string{"/bin/true"}}},
			start: func(t *testing.T, script string) execution.Process {
				sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(script)})
				oci := ociexec.OCI{StateRoot: sc.State, RunscPath: sc.Runsc, Secrets: func(_, _ string) ([]byte, error) { return []byte("k"), nil }}
				p, err := oci.Start(context.Background(), execution.Spec{Bundle: sc.Bundle})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					if left, err := oci.Cleanup(context.Background()); err != nil || len(left) > 0 {
						t.Errorf("left behind after the process ended: %v %v", left, err)
					}
				})
				return p
			}},
	}
}

func TestContract(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Run("stdio-and-exit", func(t *testing.T) {
				p := c.start(t, `read line; echo "out:$line"; echo "err:$line" >&2; exit 3`)
				if _, err := io.WriteString(p.Stdin(), "hello\n"); err != nil {
					t.Fatal(err)
				}
				out, errOut := readBoth(t, p)
				if out != "out:hello\n" || errOut != "err:hello\n" {
					t.Errorf("stdout %q stderr %q", out, errOut)
				}
				if e := p.Wait(); e.Code != 3 || e.Err != nil {
					t.Errorf("exit %+v, want code 3", e)
				}
			})
			t.Run("eof-on-stdin", func(t *testing.T) {
				p := c.start(t, `cat; echo done`)
				io.WriteString(p.Stdin(), "a\n")
				p.Stdin().Close()
				out, _ := readBoth(t, p)
				if out != "a\ndone\n" || p.Wait().Code != 0 {
					t.Errorf("stdout %q, exit %+v", out, p.Wait())
				}
			})
			t.Run("signal", func(t *testing.T) {
				p := c.start(t, `echo ready; exec sleep 100`)
				waitLine(t, p.Stdout(), "ready")
				go io.Copy(io.Discard, p.Stdout())
				go io.Copy(io.Discard, p.Stderr())
				if err := p.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if e := wait(t, p); e.Code != 128+int(syscall.SIGTERM) {
					t.Errorf("after SIGTERM: %+v, want exit 143", e)
				}
			})
			t.Run("stop", func(t *testing.T) {
				p := c.start(t, `trap "" TERM; echo ready; while :; do sleep 1; done`)
				waitLine(t, p.Stdout(), "ready")
				go io.Copy(io.Discard, p.Stdout())
				go io.Copy(io.Discard, p.Stderr())
				done := make(chan struct{})
				go func() { p.Stop(); close(done) }()
				select {
				case <-done:
				case <-time.After(60 * time.Second):
					t.Fatal("Stop did not end a process that ignores SIGTERM")
				}
				if e := p.Wait(); e.Reason != "cancelled" || e.Code != 128+int(syscall.SIGKILL) {
					t.Errorf("after Stop: %+v, want reason cancelled and exit 137", e)
				}
			})
			t.Run("refuses-the-other-kind", func(t *testing.T) {
				if p, err := c.b.Start(context.Background(), c.other); err == nil {
					p.Stop()
					t.Errorf("%s started %+v", c.b.Name(), c.other)
				}
			})
		})
	}
}

func readBoth(t *testing.T, p execution.Process) (string, string) {
	t.Helper()
	errc := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(p.Stderr())
		errc <- string(b)
	}()
	out, err := io.ReadAll(p.Stdout())
	if err != nil {
		t.Fatal(err)
	}
	return string(out), <-errc
}

func waitLine(t *testing.T, r io.Reader, want string) {
	t.Helper()
	var got strings.Builder
	buf := make([]byte, 1)
	for !strings.Contains(got.String(), want+"\n") {
		if _, err := r.Read(buf); err != nil {
			t.Fatalf("waiting for %q: %v (got %q)", want, err, got.String())
		}
		got.Write(buf)
	}
}

func wait(t *testing.T, p execution.Process) execution.Exit {
	t.Helper()
	c := make(chan execution.Exit, 1)
	go func() { c <- p.Wait() }()
	select {
	case e := <-c:
		return e
	case <-time.After(60 * time.Second):
		t.Fatal("the process did not end")
		return execution.Exit{}
	}
}
