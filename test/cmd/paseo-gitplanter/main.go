// Command paseo-gitplanter makes one plant of the gitplant catalogue
// (internal/testkit/gitplant) and prints how it went as one JSON line
// (gitplant.Outcome): run in a sandbox, it is the agent planting Git
// control data; run on the host as the deployment user, the catalogue's
// control. It takes the surface's name and the plot's paths as JSON
// (gitplant.Paths), and uses plain file operations only: it runs no git,
// nor any other program.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"paseo.dev/paseo-policy/internal/testkit/gitplant"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: paseo-gitplanter SURFACE PATHS-JSON")
		os.Exit(2)
	}
	s, ok := gitplant.SurfaceNamed(os.Args[1])
	var paths gitplant.Paths
	if err := json.Unmarshal([]byte(os.Args[2]), &paths); err != nil || !ok {
		fmt.Fprintf(os.Stderr, "paseo-gitplanter: surface known %t, paths: %v\n", ok, err)
		os.Exit(2)
	}
	out, _ := json.Marshal(gitplant.PlantOutside(s, paths.Plot()))
	fmt.Println(string(out))
}
