// Command paseo-gitplanter makes one plant of the gitplant catalogue
// (internal/testkit/gitplant) and prints how it went, one JSON line
// (gitplant.Outcome) per plant: run in a sandbox, it is the agent planting
// Git control data; run on the host as the deployment user, the
// catalogue's control. It plants where the plot says and wherever else
// the agent sees its repository: where its Git finds it, and where the
// sandbox shows the real Git dir (gitplant.PlantAsAgent).
//
// It takes the surface's name and the plot's paths as JSON (gitplant.Paths)
// as its two arguments or, run as "pi" (by the reviewed profile's own
// start script, which seeds the private Git dir first), from the job file
// /etc/paseo-gitplanter.json in its image, ignoring Pi's arguments. It
// uses plain file operations only: it runs no git, nor any other program.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"paseo.dev/paseo-policy/internal/testkit/gitplant"
)

// JobFile is where the planter run as pi finds its job.
const JobFile = "/etc/paseo-gitplanter.json"

// Job is the job file: the surface and the plot.
type Job struct {
	Surface string         `json:"surface"`
	Paths   gitplant.Paths `json:"paths"`
}

func main() {
	var job Job
	var err error
	switch {
	case filepath.Base(os.Args[0]) == "pi":
		var b []byte
		if b, err = os.ReadFile(JobFile); err == nil {
			err = json.Unmarshal(b, &job)
		}
	case len(os.Args) == 3:
		job.Surface = os.Args[1]
		err = json.Unmarshal([]byte(os.Args[2]), &job.Paths)
	default:
		fmt.Fprintln(os.Stderr, "usage: paseo-gitplanter SURFACE PATHS-JSON (or run as pi, with "+JobFile+")")
		os.Exit(2)
	}
	s, ok := gitplant.SurfaceNamed(job.Surface)
	if err != nil || !ok {
		fmt.Fprintf(os.Stderr, "paseo-gitplanter: surface %q known %t, job: %v\n", job.Surface, ok, err)
		os.Exit(2)
	}
	// PASEO_GIT_SEED is where a protected sandbox shows the worktree's real
	// Git dir (read-only); the host control runs with no environment.
	for _, o := range gitplant.PlantAsAgent(s, job.Paths.Plot(), os.Getenv("PASEO_GIT_SEED")) {
		line, _ := json.Marshal(o)
		fmt.Println(string(line))
	}
}
