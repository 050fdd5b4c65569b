package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"paseo.dev/paseo-policy/grant"
)

func newDiff(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "diff OLD NEW",
		Short: "Compare two bundles grant by grant; exit 3 when anything widens",
		Long: `Diff matches grants by kind and subject and classifies each difference as
added, removed, widened, narrowed or changed. It exits 3 when any change
grants more authority or cannot be shown to grant less (a new egress host, a
read-only mount made writable, a raised limit, a removed namespace, a changed
argv word or environment value), so CI can require review for those.`,
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
				for _, c := range changes {
					mark := " "
					if c.Widens {
						mark = "!"
					}
					fmt.Fprintf(g.stdout, "%s %-8s %s\n", mark, c.Change, c.Key)
					if c.Old != nil {
						fmt.Fprintf(g.stdout, "    - %s %s %s\n", c.Old.Access(), detail(c.Old), c.Old.Why().Fact)
					}
					if c.New != nil {
						fmt.Fprintf(g.stdout, "    + %s %s %s\n", c.New.Access(), detail(c.New), c.New.Why().Fact)
					}
				}
				fmt.Fprintf(g.stdout, "%d change(s)", len(changes))
				if widens {
					fmt.Fprint(g.stdout, "; marked ! widen authority or need review")
				}
				fmt.Fprintln(g.stdout)
			}
			if widens {
				return exitWith(ExitWidened, nil)
			}
			return nil
		},
	}
}
