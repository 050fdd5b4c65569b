package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/compiler"
	"paseo.dev/paseo-policy/runtime/pilaunch"
)

// piOptions is what `paseo-policy pi` runs on: the operator's configuration
// path (its own flag, before Paseo's words) and Paseo's argv.
type piOptions struct {
	config string
	argv   []string
	stdin  io.Reader
}

// newPi is Paseo's Pi command (agents.providers.pi.command, mode replace):
// `paseo-policy pi [--config FILE]`, to which Paseo appends its own flags.
// Flag parsing is the command's own (pilaunch.ParseArgs), so that every
// flag Paseo passes reaches it and an unknown one is refused with a code.
func newPi(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pi [--config FILE] [Pi's flags as Paseo passes them]",
		Short: "Paseo's Pi command: run `pi --mode rpc` sandboxed through the supervisor",
		Long: `Name this command as Paseo's Pi command (agents.providers.pi.command, mode
replace; docs/paseo.md). It reads the operator's configuration (default
` + pilaunch.DefaultConfigPath + `, root-owned), builds the launch facts from it,
Paseo's argv and cwd, and bridges Pi RPC on its stdio to a sandbox the
supervisor runs. A refused or unavailable launch exits non-zero with one
stderr line per diagnostic (CODE path: message); no Pi runs on the host.`,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			o := piOptions{config: pilaunch.DefaultConfigPath, argv: args, stdin: os.Stdin}
			if len(args) >= 2 && args[0] == "--config" {
				o.config, o.argv = args[1], args[2:]
			}
			return runPi(g, o)
		},
	}
}

func runPi(g *globals, o piOptions) error {
	refuse := func(err error) error {
		var r *pilaunch.Refusal
		var l diag.List
		switch {
		case errors.As(err, &r):
			l = r.Diags
		case errors.As(err, &l):
		default:
			l = diag.List{{Code: pilaunch.CodeUnavailable, Path: "", Message: err.Error()}}
		}
		code := ExitRefused
		for _, d := range l.Sorted() {
			fmt.Fprintln(g.stderr, d.String())
			if d.Code == pilaunch.CodeUnavailable {
				code = ExitUnavailable
			}
		}
		return exitWith(code, nil)
	}
	args, err := pilaunch.ParseArgs(o.argv)
	if err != nil {
		return refuse(err)
	}
	if args.Version {
		// Paseo's diagnostic asks the binary for its version.
		fmt.Fprintf(g.stdout, "paseo-policy %s (Pi sandboxed through the supervisor)\n", compiler.Version)
		return nil
	}
	cfg, err := pilaunch.LoadConfig(o.config)
	if err != nil {
		return refuse(err)
	}
	cwd, err := unix.Getwd() // the kernel's answer, not $PWD
	if err != nil {
		return refuse(err)
	}
	ln, err := pilaunch.Plan(cfg, args, cwd)
	if err != nil {
		return refuse(err)
	}
	var store *pilaunch.Store
	if !ln.Probe {
		if store, err = pilaunch.OpenStore(cfg.State.BridgeDir); err != nil {
			return refuse(err)
		}
		defer store.Close()
	}
	// Writes to a closed stdout must come back as errors (Paseo gone), not
	// kill the process before it can leave the sandbox to its next spawn.
	signal.Ignore(syscall.SIGPIPE)
	term := make(chan os.Signal, 2)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(term)
	termed := make(chan struct{})
	go func() { <-term; close(termed) }()
	ppid := unix.Getppid()
	b := &pilaunch.Bridge{Socket: cfg.Socket, Store: store, Stdin: o.stdin, Stdout: g.stdout, Stderr: g.stderr,
		Sig:      pilaunch.Signals{Term: termed, Gone: func() bool { return unix.Getppid() != ppid }},
		EOFGrace: 500 * time.Millisecond}
	res, err := b.Run(ln)
	if err != nil {
		if res.Sandbox == "" {
			return refuse(err)
		}
		fmt.Fprintf(g.stderr, "%s sandbox: %v\n", pilaunch.CodeUnavailable, err)
		return exitWith(ExitUnavailable, nil)
	}
	switch res.Outcome {
	case pilaunch.Ended:
		if res.Code != 0 {
			return exitWith(res.Code&0xff, nil)
		}
		return nil
	default:
		// Nobody reads this status: the daemon is gone or a newer spawn
		// took over; the sandbox runs on.
		return exitWith(ExitUnavailable, nil)
	}
}
