package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
)

// defaultRunsc is the pinned binary next to the paseo-policy executable
// (make runsc puts both in bin/).
func defaultRunsc() string {
	exe, err := os.Executable()
	if err != nil {
		return "runsc"
	}
	return filepath.Join(filepath.Dir(exe), "runsc")
}

func newLaunch(g *globals) *cobra.Command {
	var o launcher.Options
	var secretsDir string
	cmd := &cobra.Command{
		Use:   "launch DIR",
		Short: "Run a compiled bundle under the pinned runsc (root)",
		Long: `Launch runs preflight checks, copies the bundle into a private run dir (no
secret enters it: a bundle holding a secret placeholder is refused), hands
the model route's proxy the provider key from --secrets-dir,
<dir>/<deployment>/<secretRef> with the deployment from the verified
manifest (the MCP config carries no bearer: the route proxy adds the
daemon's, read once from the same directory under the route's tokenRef and
kept out of the sandbox), runs it under runsc with fixed flags while owning
its stdio, enforces wall time and output limits, and tears everything down.
When the sandbox cannot be enforced it exits 4 (sandbox-unavailable) and
nothing runs. When the agent exits non-zero, launch exits 7 and says the
agent's code on stderr ("the agent exited N"); with -o json it also writes
its result, the agent's code as exitCode, as one JSON line to stderr (stdout
is the agent's). docs/launcher.md, "Exit codes", has the table.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			o.BundleDir = args[0]
			o.Stdin, o.Stdout, o.Stderr = os.Stdin, g.stdout, g.stderr
			o.Log = g.stderr // a failed teardown step, a line each
			if secretsDir != "" {
				o.Secrets = launcher.SecretsDir(secretsDir)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			res, err := launcher.Launch(ctx, o)
			return g.launchEnd(res, err)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ID, "id", "", "container id (default: a fresh random id)")
	f.StringVar(&o.StateRoot, "state-root", launcher.DefaultStateRoot, "private state: run dirs and the runsc root")
	f.StringVar(&o.RunscPath, "runsc", defaultRunsc(), "the pinned runsc binary (with <path>.sha256 beside it)")
	f.StringVar(&secretsDir, "secrets-dir", "", "root-only directory holding <deployment-id>/<secretRef> files (root-owned, 0600)")
	f.StringVar(&o.Uplink, "uplink-netns", "", "network namespace (path) the sandbox veth peers live in, for network mode sandbox (default: this process's)")
	return cmd
}

// launchEnd is how launch ends: the launcher's refusal (4) or failure (6),
// or the sandbox's result, where the agent's non-zero exit is ExitAgent
// and its code is said on stderr, never passed on as launch's own: an
// agent exiting 4 is not "sandbox unavailable".
func (g *globals) launchEnd(res launcher.Result, err error) error {
	if err != nil {
		return err // exitCode: the launcher's refusal 4, anything else 6
	}
	if res.Reason != "" {
		fmt.Fprintf(g.stderr, "paseo-policy: sandbox %s ended: %s\n", res.ID, res.Reason)
	}
	if g.json() {
		line, err := json.Marshal(res)
		if err != nil {
			return exitWith(ExitInternal, err)
		}
		fmt.Fprintf(g.stderr, "%s\n", line)
	}
	if res.ExitCode != 0 {
		fmt.Fprintf(g.stderr, "paseo-policy: sandbox %s: the agent exited %d\n", res.ID, res.ExitCode)
		return exitWith(ExitAgent, nil)
	}
	return nil
}

func newDoctor(g *globals) *cobra.Command {
	var o preflight.Options
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check that this host can run sandboxes (and, with --bundle, that a bundle is launchable)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			r := preflight.Run(o)
			if g.json() {
				if err := g.printJSON(r); err != nil {
					return err
				}
			} else {
				for _, c := range r.Checks {
					if c.OK {
						fmt.Fprintf(g.stdout, "ok   %-16s %s\n", c.Name, c.Detail)
					} else {
						fmt.Fprintf(g.stdout, "FAIL %-16s %s: %s\n", c.Name, c.Code, c.Detail)
					}
				}
			}
			if err := r.Err(); err != nil {
				return printedError{err} // exitCode: unavailable
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.RunscPath, "runsc", defaultRunsc(), "the pinned runsc binary")
	cmd.Flags().StringVar(&o.BundleDir, "bundle", "", "also check this bundle")
	return cmd
}
