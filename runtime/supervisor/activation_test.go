package supervisor

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/policy/schema"
)

// An inherited socket (systemd socket activation) is served only when it
// is the configured path, a socket of mode 0660 owned by root:SocketGID;
// a restart keeps its inode, which is what a container binding the socket
// file alone holds, and a client that connects while no supervisor runs is
// answered by the next one.
func TestInheritedSocket(t *testing.T) {
	testbundle.Prerequisites(t)
	reg, err := os.ReadFile(testbundle.Repo(t, "testdata/base/registry.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/run", "paseo-activation-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "supervisor.sock")
	systemd, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer systemd.Close()
	if err := os.Chown(socket, 0, socketGID); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Registry: schema.Input{Name: "registry.json", Data: reg}, Socket: socket, SocketGID: socketGID, StateRoot: t.TempDir(), RunscPath: testbundle.Repo(t, "bin/runsc")}
	inherit := func() *net.UnixListener {
		f, err := systemd.File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		l, err := net.FileListener(f)
		if err != nil {
			t.Fatal(err)
		}
		return l.(*net.UnixListener)
	}
	refused := func(name string, mode os.FileMode, c Config) {
		t.Helper()
		if err := os.Chmod(socket, mode); err != nil {
			t.Fatal(err)
		}
		c.Listener = inherit()
		defer c.Listener.Close()
		srv, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Listen(context.Background()); err == nil {
			t.Errorf("%s: served", name)
		}
	}
	refused("mode 0666", 0o666, cfg)
	other := cfg
	other.SocketGID = socketGID + 1
	refused("another group", 0o660, other)
	other = cfg
	other.Socket = filepath.Join(dir, "other.sock")
	refused("another path", 0o660, other)

	var before unix.Stat_t
	if err := unix.Stat(socket, &before); err != nil {
		t.Fatal(err)
	}
	serve := func() (stop func()) {
		c := cfg
		c.Listener = inherit()
		srv, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- srv.Listen(ctx) }()
		return func() {
			cancel()
			if err := <-served; err != nil {
				t.Errorf("serving the inherited socket: %v", err)
			}
			srv.Close()
		}
	}
	list := func(cl *Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return cl.Call(ctx, Request{Op: "list"}, nil)
	}
	stop := serve()
	cl, err := Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	if err := list(cl); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	stop()

	// Between two supervisors: the socket is still there, the same inode,
	// and a connection waits in its backlog for the next supervisor.
	var after unix.Stat_t
	if err := unix.Stat(socket, &after); err != nil || after.Ino != before.Ino {
		t.Fatalf("the socket after a supervisor stopped: inode %d, was %d (%v)", after.Ino, before.Ino, err)
	}
	cl, err = Dial(socket)
	if err != nil {
		t.Fatalf("connecting while no supervisor runs: %v", err)
	}
	defer cl.Close()
	answered := make(chan error, 1)
	go func() { answered <- list(cl) }()
	stop = serve()
	defer stop()
	if err := <-answered; err != nil {
		t.Errorf("the next supervisor did not answer a connection made before it started: %v", err)
	}
}
