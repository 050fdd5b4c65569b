package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/policy/grant"
)

func newDiff(g *globals) *cobra.Command {
	var wide bool
	cmd := &cobra.Command{
		Use:   "diff OLD NEW",
		Short: "Compare two bundles grant by grant; exit 3 when anything widens",
		Long: `Diff matches grants by kind and subject and classifies each difference as
added, removed, widened, narrowed or changed. It exits 3 when any change
grants more authority or cannot be shown to grant less (a new egress host, a
read-only mount made writable, a raised limit, a removed namespace, a changed
argv word or environment value), so CI can require review for those.

The text fits the terminal (COLUMNS, else the terminal's width, else 100
columns): long lines wrap, indented. --wide prints each on one line.`,
		Args: cobra.ExactArgs(2),
		RunE: func(_ *cobra.Command, args []string) error {
			oldM, err := loadManifest(args[0])
			if err != nil {
				return err
			}
			newM, err := loadManifest(args[1])
			if err != nil {
				return err
			}
			changes := grant.Diff(oldM.Grants, newM.Grants)
			widens := false
			for _, c := range changes {
				widens = widens || c.Widens
			}
			if g.json() {
				if changes == nil {
					changes = []grant.Change{}
				}
				if err := g.printJSON(map[string]any{"widens": widens, "changes": changes}); err != nil {
					return err
				}
			} else {
				width := 0 // --wide: nothing wraps
				if !wide {
					width = outputWidth(g.stdout)
				}
				for _, c := range changes {
					mark := " "
					if c.Widens {
						mark = "!"
					}
					printFit(g.stdout, width, 11, fmt.Sprintf("%s %-8s %s", mark, c.Change, c.Key))
					if c.Old != nil {
						printFit(g.stdout, width, 6, fmt.Sprintf("    - %s %s %s", c.Old.Access(), detail(c.Old), c.Old.Why().Fact))
					}
					if c.New != nil {
						printFit(g.stdout, width, 6, fmt.Sprintf("    + %s %s %s", c.New.Access(), detail(c.New), c.New.Why().Fact))
					}
				}
				summary := fmt.Sprintf("%d change(s)", len(changes))
				if widens {
					summary += "; marked ! widen authority or need review"
				}
				printFit(g.stdout, width, 0, summary)
			}
			if widens {
				return exitWith(ExitWidened, nil)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&wide, "wide", false, "every change on one line, values in full")
	return cmd
}

// printFit prints line wrapped to width with a hanging indent, or as it is
// when width is 0.
func printFit(w io.Writer, width, indent int, line string) {
	if width == 0 {
		fmt.Fprintln(w, line)
		return
	}
	for _, l := range hang(line, width, indent) {
		fmt.Fprintln(w, l)
	}
}
