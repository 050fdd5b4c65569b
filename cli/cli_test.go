package cli

import (
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"paseo.dev/paseo-policy/internal/testkit/testtree"
)

func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"paseo-policy": func() { QuietLibraryLogs(); os.Exit(Run()) }, // as cmd/paseo-policy
	})
}

// TestScripts runs the CLI behaviour tests in testdata/script/*.txtar. Each
// script starts with the reference inputs in $WORK (facts.json,
// registry.json) and the reference host tree beneath $WORK/host.
func TestScripts(t *testing.T) {
	base := filepath.Join("..", "testdata", "base")
	testscript.Run(t, testscript.Params{
		Dir: filepath.Join("testdata", "script"),
		Setup: func(env *testscript.Env) error {
			for _, f := range []string{"facts.json", "registry.json"} {
				data, err := os.ReadFile(filepath.Join(base, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(env.WorkDir, f), data, 0o644); err != nil {
					return err
				}
			}
			tree, err := os.ReadFile(filepath.Join(base, "tree.txt"))
			if err != nil {
				return err
			}
			cleanup, err := testtree.Build(filepath.Join(env.WorkDir, "host"), string(tree))
			env.Defer(cleanup)
			return err
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			// exits N CMD ARGS...: run CMD and require exit code N.
			"exits": func(ts *testscript.TestScript, neg bool, args []string) {
				if neg || len(args) < 2 {
					ts.Fatalf("usage: exits N command [args...]")
				}
				want, err := strconv.Atoi(args[0])
				if err != nil {
					ts.Fatalf("exits: %v", err)
				}
				got := 0
				if err := ts.Exec(args[1], args[2:]...); err != nil {
					var ee *exec.ExitError
					if !errors.As(err, &ee) {
						ts.Fatalf("exits: %v", err)
					}
					got = ee.ExitCode()
				}
				if got != want {
					ts.Fatalf("%s exited %d, want %d", args[1], got, want)
				}
			},
			// listening ADDR: wait (30 s at most) until something accepts
			// TCP connections on ADDR, a background server's readiness.
			"listening": func(ts *testscript.TestScript, neg bool, args []string) {
				if neg || len(args) != 1 {
					ts.Fatalf("usage: listening host:port")
				}
				for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
					c, err := net.DialTimeout("tcp", args[0], time.Second)
					if err == nil {
						c.Close()
						return
					}
					if time.Now().After(deadline) {
						ts.Fatalf("nothing listens on %s: %v", args[0], err)
					}
				}
			},
			// patch SRC JSON DST: write SRC with an RFC 7396 merge patch applied.
			"patch": func(ts *testscript.TestScript, neg bool, args []string) {
				if neg || len(args) != 3 {
					ts.Fatalf("usage: patch src json dst")
				}
				out, err := testtree.MergePatch([]byte(ts.ReadFile(args[0])), []byte(args[1]))
				ts.Check(err)
				ts.Check(os.WriteFile(ts.MkAbs(args[2]), out, 0o644))
			},
		},
	})
}
