package cli

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/policy/schema"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/supervisor"
)

func newSupervise(g *globals) *cobra.Command {
	var cfg supervisor.Config
	var registry, secretsDir, modelCA string
	cmd := &cobra.Command{
		Use:   "supervise",
		Short: "Serve the sandbox protocol on a Unix socket (root; see docs/supervisor.md)",
		Long: `supervise is the root service a Paseo daemon talks to instead of runsc. It
listens on a pathname socket (mode 0660, group --socket-group, in a
root-owned directory; under systemd socket activation, paseo-sandbox.socket,
it serves the socket it is passed, which outlives its restarts), checks
every peer's SO_PEERCRED against the registry's peers for the deployment
it names, compiles facts with the embedded profiles, launches sandboxes with the launcher and keeps each
sandbox's output in a bridge so a reattaching daemon misses nothing. Each
sandbox runs under a holder process of its own (this binary, re-executed)
that owns its stdio, so sandboxes and their turns outlive the supervisor:
SIGTERM or SIGINT stops the supervisor only, and the next one adopts the
running sandboxes (running-unattached until a daemon attaches). Delete a
sandbox through the protocol, or use kill/gc, to stop it.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			in, err := schema.ReadInput(registry, "registry")
			if err != nil {
				return exitWith(ExitUsage, err)
			}
			cfg.Registry = in
			if secretsDir != "" {
				cfg.Secrets, cfg.SecretsDir = launcher.SecretsDir(secretsDir), secretsDir
			}
			if modelCA != "" {
				if cfg.ModelRoots, err = readModelCA(modelCA); err != nil {
					return exitWith(ExitUsage, err)
				}
			}
			if cfg.Listener, err = activatedSocket(); err != nil {
				return exitWith(ExitUnavailable, err)
			}
			srv, err := supervisor.New(cfg)
			if err != nil {
				return exitWith(ExitUnavailable, err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			how := ""
			if cfg.Listener != nil {
				how = " (socket from systemd)"
			}
			fmt.Fprintf(g.stderr, "paseo-policy: supervising on %s%s\n", cfg.Socket, how)
			err = srv.Listen(ctx)
			srv.Close()
			if err != nil {
				return exitWith(ExitUnavailable, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&registry, "registry", "/etc/paseo-sandbox/registry.json", "the operator registry (root-owned)")
	f.StringVar(&cfg.Socket, "socket", "/run/paseo-sandbox/supervisor.sock", "the pathname socket daemons connect to")
	f.IntVar(&cfg.SocketGID, "socket-group", 0, "numeric group allowed to connect (the socket is 0660 root:GROUP)")
	f.StringVar(&cfg.StateRoot, "state-root", filepath.Join(launcher.DefaultStateRoot, "state"), "private state: bundles, run dirs, runsc root, spill files (not the socket's directory)")
	f.StringVar(&cfg.RunscPath, "runsc", defaultRunsc(), "the pinned runsc binary")
	f.StringVar(&secretsDir, "secrets-dir", "", "root-only directory holding <deployment-id>/<secretRef> files (root-owned, 0600)")
	f.StringVar(&cfg.Uplink, "uplink-netns", "", "network namespace (path) sandbox veth peers live in (default: this process's)")
	f.StringVar(&modelCA, "model-ca", "", "PEM file of the CA certificates the model route verifies providers against, instead of the system trust store (a private model gateway)")
	f.DurationVar(&cfg.HolderLinger, "holder-linger", 24*time.Hour, "how long an ended sandbox's unread output waits for a daemon, after the last connection, before its holder exits")
	return cmd
}

// activatedSocket is the listening socket systemd passed (socket
// activation: LISTEN_PID names this process, LISTEN_FDS is 1, the socket is
// fd 3), or nil when none was passed. systemd keeps the socket across
// supervisor restarts, so its inode stays the one a container bound. The
// fd is closed once dup'ed into the listener: holders, this binary
// re-executed, must not inherit it.
func activatedSocket() (*net.UnixListener, error) {
	if os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n := os.Getenv("LISTEN_FDS")
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(v)
	}
	if n != "1" {
		return nil, fmt.Errorf("systemd passed %q sockets; the supervisor serves exactly one (ListenStream= once)", n)
	}
	f := os.NewFile(3, "systemd-socket")
	defer f.Close()
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("the socket systemd passed: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, fmt.Errorf("systemd passed a %s socket, not a Unix stream socket", l.Addr().Network())
	}
	return ul, nil
}

// readModelCA reads --model-ca: PEM holding at least one CA certificate,
// and nothing that is not one (a key in it is refused, not ignored).
func readModelCA(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--model-ca: %w", err)
	}
	n := 0
	for rest := data; ; n++ {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return nil, fmt.Errorf("--model-ca %s: not PEM after %d certificates", path, n)
			}
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("--model-ca %s: a %s block; only CERTIFICATE blocks belong there", path, b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return nil, fmt.Errorf("--model-ca %s: %w", path, err)
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("--model-ca %s: no certificate", path)
	}
	return data, nil
}
