package acceptance

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testcontainer"
	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

// Attacks from the official container's daemon on the supervisor's host
// side (threat 47), run as the container runs it (internal/testkit/testcontainer:
// its own mount, pid and network namespaces, uid 1000, the socket's GID as
// a supplementary group): reading the supervisor's private state through
// its socket mount, and being cut off from the supervisor by a restart.

func init() {
	// The container's first process is this test binary re-executed.
	testcontainer.MaybeEnter()
	registerOutside("container", containerAttacks)
}

const (
	containerGID        = 4244
	containerSocketPath = "/run/paseo-sandbox/supervisor.sock"
	envContainerAttack  = "PASEO_ACCEPTANCE_CONTAINER"
)

func containerAttacks(t *testing.T, _ *scene) []OutsideAttack {
	return []OutsideAttack{containerSeesState(t), containerStrandedByRestart(t)}
}

// supervisorDir is the supervisor's directory as the systemd units lay it
// out: the socket beside the state root.
func supervisorDir(t *testing.T) (dir, socket, state string, reg []byte) {
	reg, err := os.ReadFile(testbundle.Repo(t, "testdata/base/registry.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir, err = os.MkdirTemp("/run", "paseo-acceptance-container-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, filepath.Join(dir, "supervisor.sock"), filepath.Join(dir, "state"), reg
}

// serve runs a supervisor until the returned stop; ln, when set, is the
// socket systemd would pass.
func serve(t *testing.T, cfg supervisor.Config, ln *net.UnixListener) (stop func()) {
	if ln != nil {
		f, err := ln.File()
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listener = l.(*net.UnixListener)
	}
	srv, err := supervisor.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Listen(ctx) }()
	for i := 0; ; i++ {
		if _, err := os.Lstat(cfg.Socket); err == nil {
			break
		}
		if i == 200 {
			t.Fatal("the supervisor socket never came up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() { cancel(); srv.Close(); <-served }
}

// runContainer runs TestHelperContainerAttack in the container and
// returns its output.
func runContainer(t *testing.T, mode string, binds []testcontainer.Bind, extra []*os.File) string {
	spec := testcontainer.Spec{Root: t.TempDir(), Tmpfs: []string{"/run"}, Binds: binds, UID: 1000, GID: 1000,
		Groups: []uint32{containerGID}, ExtraFiles: extra,
		Argv: []string{"paseo-daemon", "-test.run=^TestHelperContainerAttack$", "-test.timeout=2m"},
		Env:  []string{"PATH=/usr/bin:/bin", envContainerAttack + "=" + mode}}
	out, err := testcontainer.Run(spec, 3*time.Minute)
	if err != nil {
		t.Fatalf("the container (%s): %v\n%s", mode, err, out)
	}
	return string(out)
}

// containerSeesState: from inside the container, look for the
// supervisor's state root, its holders', bundles' and spill dirs, and any
// entry of the socket's directory but the socket. The product binds the
// socket file alone; the control binds the socket's directory read-only
// (the compose snippet before issue 11).
func containerSeesState(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "container-sees-supervisor-state", Attacker: "daemon-user",
		Goal:    "from the official container, see the supervisor's state root (bundles, holders' sockets, spill, runsc's root) beside the socket",
		Control: "the socket's directory bound into the container read-only instead of the socket file alone"}
	dir, socket, state, reg := supervisorDir(t)
	stop := serve(t, supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: reg},
		Socket: socket, SocketGID: containerGID, StateRoot: state}, nil)
	defer stop()
	var evidence []string
	run := func(binds []testcontainer.Bind) (tally Tally) {
		out := runContainer(t, "view", binds, nil)
		for _, line := range strings.Split(out, "\n") {
			what, ok := strings.CutPrefix(line, "probe ")
			if !ok {
				continue
			}
			tally.Attempts++
			if strings.HasSuffix(what, " seen") {
				tally.Wins++
				evidence = append(evidence, what)
			}
		}
		return tally
	}
	a.Contained = run([]testcontainer.Bind{{Host: socket, Container: containerSocketPath}})
	a.ControlRun = run([]testcontainer.Bind{{Host: dir, Container: filepath.Dir(containerSocketPath), ReadOnly: true}})
	a.Evidence = "control saw: " + strings.Join(evidence, ", ")
	return a
}

// containerStrandedByRestart: the container binds the socket file alone
// and reconnects after each of two supervisor restarts; the attack (on
// availability) wins when the daemon can no longer reach any supervisor.
// The product is the socket unit holding the socket (the supervisor serves
// the one it inherits); the control is a supervisor making its own socket
// at each start.
func containerStrandedByRestart(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "supervisor-restart-strands-container", Attacker: "daemon-user",
		Goal:    "after a supervisor restart, find the official container's daemon cut off from the supervisor (its bound socket file dead)",
		Control: "a supervisor that makes its own socket at each start instead of serving the one systemd's socket unit keeps"}
	_, socket, state, reg := supervisorDir(t)
	cfg := supervisor.Config{Registry: schema.Input{Name: "registry.json", Data: reg}, Socket: socket, SocketGID: containerGID, StateRoot: state}
	run := func(activated bool) (tally Tally) {
		var ln *net.UnixListener
		if activated {
			var err error
			if ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"}); err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			if err := os.Chown(socket, 0, containerGID); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(socket, 0o660); err != nil {
				t.Fatal(err)
			}
		}
		stop := serve(t, cfg, ln)
		askR, askW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		doneR, doneW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		// The restarts happen on this goroutine; it hands the last
		// supervisor's stop back when the container has hung up.
		last := make(chan func())
		go func() {
			defer func() { last <- stop }()
			defer doneW.Close()
			br := bufio.NewReader(askR)
			for {
				if line, err := br.ReadString('\n'); err != nil || line != "restart\n" {
					return
				}
				stop()
				stop = serve(t, cfg, ln)
				doneW.WriteString("restarted\n")
			}
		}()
		out := runContainer(t, "restart", []testcontainer.Bind{{Host: socket, Container: containerSocketPath}}, []*os.File{askW, doneR})
		askW.Close()
		doneR.Close()
		(<-last)()
		askR.Close()
		for _, line := range strings.Split(out, "\n") {
			if r, ok := strings.CutPrefix(line, "after-restart "); ok {
				tally.Attempts++
				if r != "answered" {
					tally.Wins++
					a.Evidence = "control: " + r
				}
			}
		}
		if !activated {
			os.Remove(socket)
		}
		return tally
	}
	a.Contained = run(true)
	a.ControlRun = run(false)
	return a
}

// TestHelperContainerAttack is the daemon inside the container.
func TestHelperContainerAttack(t *testing.T) {
	mode := os.Getenv(envContainerAttack)
	switch mode {
	case "":
		return
	case "view":
		// What of the supervisor's side the container can name: each probe
		// is one attempt, "seen" a win.
		for _, p := range []string{"state", "state/holders", "state/bundles", "state/spill"} {
			_, err := os.Lstat(filepath.Join(filepath.Dir(containerSocketPath), p))
			fmt.Printf("probe %s %s\n", p, map[bool]string{true: "seen", false: "absent"}[err == nil])
		}
		entries, _ := os.ReadDir(filepath.Dir(containerSocketPath))
		var others []string
		for _, e := range entries {
			if e.Name() != filepath.Base(containerSocketPath) {
				others = append(others, e.Name())
			}
		}
		slices.Sort(others)
		fmt.Printf("probe entries-beside-the-socket[%s] %s\n", strings.Join(others, ","), map[bool]string{true: "seen", false: "absent"}[len(others) > 0])
	case "restart":
		ask, done := os.NewFile(3, "ask"), bufio.NewReader(os.NewFile(4, "done"))
		list := func() error {
			cl, err := supervisor.Dial(containerSocketPath)
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var none []supervisor.Info
			return cl.Call(ctx, supervisor.Request{Op: "list"}, &none)
		}
		if err := list(); err != nil {
			t.Fatalf("before any restart: %v", err)
		}
		for i := 0; i < 2; i++ {
			if _, err := ask.WriteString("restart\n"); err != nil {
				t.Fatal(err)
			}
			if line, err := done.ReadString('\n'); err != nil || line != "restarted\n" {
				t.Fatalf("waiting for the restart: %q %v", line, err)
			}
			if err := list(); err != nil {
				fmt.Printf("after-restart %v\n", err)
				continue
			}
			fmt.Println("after-restart answered")
		}
	default:
		t.Fatalf("unknown mode %q", mode)
	}
}
