package cli

import (
	"context"
	"fmt"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/launcher"
	"paseo.dev/paseo-policy/schema"
	"paseo.dev/paseo-policy/supervisor"
)

func newSupervise(g *globals) *cobra.Command {
	var cfg supervisor.Config
	var registry, secretsDir string
	cmd := &cobra.Command{
		Use:   "supervise",
		Short: "Serve the sandbox protocol on a Unix socket (root; see docs/supervisor.md)",
		Long: `supervise is the root service a Paseo daemon talks to instead of runsc. It
listens on a pathname socket (mode 0660, group --socket-group, in a
root-owned directory), checks every peer's SO_PEERCRED against the
registry's peers for the deployment it names, compiles facts with the
embedded profiles, launches sandboxes with the launcher and keeps each
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
				cfg.Secrets = launcher.SecretsDir(secretsDir)
			}
			srv, err := supervisor.New(cfg)
			if err != nil {
				return exitWith(ExitUnavailable, err)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			fmt.Fprintf(g.stderr, "paseo-policy: supervising on %s\n", cfg.Socket)
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
	f.DurationVar(&cfg.HolderLinger, "holder-linger", 24*time.Hour, "how long an ended sandbox's unread output waits for a daemon, after the last connection, before its holder exits")
	return cmd
}
