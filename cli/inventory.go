package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/inventory"
)

// inventoryFlags are the state root and runsc every inventory command reads.
func inventoryFlags(cmd *cobra.Command, inv *inventory.Inventory) {
	cmd.Flags().StringVar(&inv.StateRoot, "state-root", launcher.DefaultStateRoot, "the launcher's private state")
	cmd.Flags().StringVar(&inv.RunscPath, "runsc", defaultRunsc(), "the pinned runsc binary")
}

func newPS(g *globals) *cobra.Command {
	var inv inventory.Inventory
	cmd := &cobra.Command{
		Use:   "ps",
		Short: "List sandboxes: the launcher's records joined with runsc's state (root)",
		Long: `ps lists every sandbox under the state root. LAUNCHER is alive while the
launcher that started it runs, dead when it is gone, none when runsc knows a
container no launcher record names. GARBAGE marks what gc would remove. A
sandbox whose teardown failed is garbage, its failed steps listed beneath it.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			entries, err := inv.PS()
			if err != nil {
				return exitWith(ExitInternal, err)
			}
			if g.json() {
				if entries == nil {
					entries = []inventory.Entry{}
				}
				return g.printJSON(entries)
			}
			fmt.Fprintf(g.stdout, "%-24s %-8s %-8s %-7s %-18s %-14s %s\n", "ID", "STATUS", "LAUNCHER", "GARBAGE", "PROFILE", "AGENT", "STARTED")
			for _, e := range entries {
				fmt.Fprintf(g.stdout, "%-24s %-8s %-8s %-7t %-18s %-14s %s\n", e.ID, e.Status, e.Launcher, e.Garbage, dash(e.Profile), dash(e.Agent), dash(e.Started))
				for _, f := range e.Teardown {
					fmt.Fprintf(g.stdout, "  teardown failed: %s\n", f)
				}
			}
			return nil
		},
	}
	inventoryFlags(cmd, &inv)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newKill(g *globals) *cobra.Command {
	var inv inventory.Inventory
	var sig string
	cmd := &cobra.Command{
		Use:   "kill ID",
		Short: "Signal a running sandbox; its launcher then tears it down (root)",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			s := unix.SignalNum("SIG" + strings.TrimPrefix(strings.ToUpper(sig), "SIG"))
			if s == 0 {
				return exitWith(ExitUsage, fmt.Errorf("unknown signal %q", sig))
			}
			if err := inv.Kill(args[0], s); err != nil {
				return exitWith(ExitRefused, err)
			}
			return nil
		},
	}
	inventoryFlags(cmd, &inv)
	cmd.Flags().StringVar(&sig, "signal", "KILL", "signal to send (KILL reaches every process in the container)")
	return cmd
}

func newGC(g *globals) *cobra.Command {
	var inv inventory.Inventory
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Remove stopped and half-created containers and every leftover no live launcher owns (root)",
		Long: `gc removes, for every sandbox under the state root whose launcher is gone
(or that no launcher record names): the runsc container (delete --force),
its network namespace, veth and nftables table, its address lease, its
cgroups, its run dir and its record; and a checkpoint (a hibernated sandbox)
whose holder process is gone, with its address lease. Live sandboxes, and
checkpoints whose holder lives or cannot be told, are never touched.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			rep, err := inv.GC()
			if err != nil {
				return exitWith(ExitInternal, err)
			}
			if g.json() {
				if rep.Removed == nil {
					rep.Removed = []string{}
				}
				if err := g.printJSON(rep); err != nil {
					return err
				}
			} else {
				for _, id := range rep.Removed {
					fmt.Fprintf(g.stdout, "removed %s\n", id)
				}
				for _, e := range rep.Errors {
					fmt.Fprintf(g.stderr, "paseo-policy: gc: %s\n", e)
				}
			}
			if len(rep.Errors) > 0 {
				return exitWith(ExitInternal, nil)
			}
			return nil
		},
	}
	inventoryFlags(cmd, &inv)
	return cmd
}
