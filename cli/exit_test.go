package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/preflight"
)

// exitTableMarkdown is the table docs/launcher.md prints under "Exit codes".
func exitTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| code | name | when |\n| --- | --- | --- |\n")
	for _, e := range exitTable {
		fmt.Fprintf(&b, "| %d | `%s` | %s |\n", e.Code, e.Name, e.When)
	}
	return b.String()
}

// The codes are stable and the one table names each once, in order; the
// documentation prints that table.
func TestExitTable(t *testing.T) {
	want := []int{ExitOK, ExitRefused, ExitUsage, ExitWidened, ExitUnavailable, ExitDrift, ExitInternal, ExitAgent}
	for i, code := range want {
		if code != i {
			t.Errorf("exit code %d moved to %d: the codes are stable", i, code)
		}
		if i >= len(exitTable) || exitTable[i].Code != code {
			t.Errorf("exitTable[%d] does not describe code %d", i, code)
		}
	}
	if len(exitTable) != len(want) {
		t.Errorf("exitTable has %d rows, want %d", len(exitTable), len(want))
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "launcher.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), exitTableMarkdown()) {
		t.Errorf("docs/launcher.md does not print the exit table; its section \"Exit codes\" should hold:\n%s", exitTableMarkdown())
	}
}

// An agent that exits 4 is not "sandbox unavailable": launch exits
// ExitAgent and says the agent's code; the launcher's refusal is 4.
func TestLaunchEnd(t *testing.T) {
	for _, c := range []struct {
		name   string
		json   bool
		res    launcher.Result
		err    error
		code   int
		stderr []string
	}{
		{name: "the agent exits 0", res: launcher.Result{ID: "s1"}, code: ExitOK},
		{name: "the agent exits 4", res: launcher.Result{ID: "s1", ExitCode: 4}, code: ExitAgent,
			stderr: []string{"paseo-policy: sandbox s1: the agent exited 4\n"}},
		{name: "the agent exits 1", res: launcher.Result{ID: "s1", ExitCode: 1}, code: ExitAgent,
			stderr: []string{"the agent exited 1\n"}},
		{name: "the launcher ends it at its wall time", res: launcher.Result{ID: "s1", ExitCode: 137, Reason: "wall time exceeded", Limit: launcher.LimitWall}, code: ExitAgent,
			stderr: []string{"sandbox s1 ended: wall time exceeded\n", "the agent exited 137\n"}},
		{name: "json reports the agent's code", json: true, res: launcher.Result{ID: "s1", ExitCode: 4}, code: ExitAgent,
			stderr: []string{`{"id":"s1","exitCode":4}` + "\n"}},
		{name: "unavailable", err: fmt.Errorf("preflight: %w", &launcher.UnavailableError{Reason: "no runsc"}), code: ExitUnavailable},
		{name: "internal", err: errors.New("disk full"), code: ExitInternal},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			g := &globals{output: "text", stdout: &bytes.Buffer{}, stderr: &stderr}
			if c.json {
				g.output = "json"
			}
			err := g.launchEnd(c.res, c.err)
			if got := exitCode(err); got != c.code {
				t.Fatalf("exit %d (%v), want %d", got, err, c.code)
			}
			for _, s := range c.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr %q lacks %q", stderr.String(), s)
				}
			}
			if c.json {
				var res launcher.Result
				first, _, _ := strings.Cut(stderr.String(), "\n")
				if err := json.Unmarshal([]byte(first), &res); err != nil || res.ExitCode != c.res.ExitCode {
					t.Errorf("result line %q: %v, exit code %d", first, err, res.ExitCode)
				}
			}
		})
	}
}

// cobra's own argument and flag errors are usage errors by type, with no
// matching of their text.
func TestUsageByType(t *testing.T) {
	for _, args := range [][]string{
		{"bogus"},
		{"compil"},
		{"compile", "extra"},
		{"compile", "--out", "x"},
		{"launch"},
		{"git", "bogus"},
		{"ps", "--no-such-flag"},
		{"-o", "xml", "version"},
	} {
		var stdout, stderr bytes.Buffer
		if got := Main(args, &stdout, &stderr); got != ExitUsage {
			t.Errorf("%q: exit %d (%s), want %d", args, got, strings.TrimSpace(stderr.String()), ExitUsage)
		}
	}
	var stdout, stderr bytes.Buffer
	if got := Main(nil, &stdout, &stderr); got != ExitOK || !strings.Contains(stdout.String(), "Available Commands") {
		t.Errorf("no command: exit %d, stdout %q; want the help and 0", got, stdout.String())
	}
}

// A failed preflight is unavailable by its type, however it arrives: inside
// the launcher's refusal (launch), or as doctor's report, which doctor has
// printed already; the check's code stays in the chain.
func TestExitCodeOfPreflight(t *testing.T) {
	failed := preflight.Report{Checks: []preflight.Check{{Name: preflight.CheckRoot, OK: true}, {Name: preflight.CheckRunscDigest, Detail: "another digest"}}}.Err()
	for name, err := range map[string]error{
		"launch":  fmt.Errorf("launch: %w", &launcher.UnavailableError{Reason: failed.Error(), Err: failed}),
		"doctor":  printedError{failed},
		"wrapped": fmt.Errorf("x: %w", failed),
	} {
		if got := exitCode(err); got != ExitUnavailable {
			t.Errorf("%s: exit %d, want %d", name, got, ExitUnavailable)
		}
		if !errors.Is(err, diag.PreflightRunscDigest) || errors.Is(err, diag.PreflightRoot) {
			t.Errorf("%s: the chain does not carry exactly the failed check's code: %v", name, err)
		}
	}
	if got := exitCode(printedError{errors.New("other")}); got != ExitInternal {
		t.Errorf("a printed error of no known type: exit %d, want %d", got, ExitInternal)
	}
}
