package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// launchCodes are the launch steps' codes and their diagnostic paths, in
// docs/launcher.md's order.
var launchCodes = []struct {
	code diag.Code
	step string
}{
	{diag.LaunchBundle, "bundle"},
	{diag.LaunchSecret, "secret"},
	{diag.LaunchResolve, "resolve"},
	{diag.LaunchID, "id"},
	{diag.LaunchAuthFileInUse, "authfile"},
	{diag.LaunchStateDir, "state-dir"},
	{diag.LaunchHibernatePath, "hibernate-path"},
	{diag.LaunchWake, "wake"},
	{diag.LaunchHost, "host"},
}

// docs/launcher.md's "Launch codes" table is the codes, and diag/codes.go
// defines no PP-LAUNCH- code the table lacks.
func TestLaunchCodesDocumented(t *testing.T) {
	var want []string
	for _, c := range launchCodes {
		want = append(want, fmt.Sprintf("| `%s` | `launch.%s` |", c.code, c.step))
	}
	data, err := os.ReadFile("../../docs/launcher.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(data), "\n## Launch codes\n")
	if !ok {
		t.Fatal(`docs/launcher.md has no "## Launch codes" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	var got []string
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "| `PP-") {
			f := strings.SplitN(line, "|", 4)
			got = append(got, "|"+f[1]+"|"+f[2]+"|")
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("docs/launcher.md's launch codes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	src, err := os.ReadFile("../../diag/codes.go")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(src), `Code = "PP-LAUNCH-`); n != len(launchCodes) {
		t.Errorf("diag/codes.go defines %d PP-LAUNCH- codes, the table %d", n, len(launchCodes))
	}
}

// coded keeps a step's code, gives a marked error its code, and leaves
// nothing without one; the text is the error's own.
func TestCodedRefusals(t *testing.T) {
	secret := refused(diag.LaunchSecret, "secret", fmt.Errorf("route model: %w", ErrSecretUnknown))
	for name, c := range map[string]struct {
		err  error
		code diag.Code
		step string
		is   error
	}{
		"step's own":       {secret, diag.LaunchSecret, "secret", ErrSecretUnknown},
		"recoded keeps":    {refused(diag.LaunchHost, "host", secret), diag.LaunchSecret, "secret", ErrSecretUnknown},
		"name":             {fmt.Errorf("sandbox network: %w", &sandboxnet.ResolveError{Err: errors.New("resolving egress host x: no such host")}), diag.LaunchResolve, "resolve", nil},
		"auth.json held":   {fmt.Errorf("%w: sandbox pp-1 is running with it", ErrAuthFileInUse), diag.LaunchAuthFileInUse, "authfile", ErrAuthFileInUse},
		"id taken":         {idRefused(fmt.Errorf("run dir for pp-1: %w", fs.ErrExist)), diag.LaunchID, "id", fs.ErrExist},
		"anything else":    {errors.New("starting runsc: exec format error"), diag.LaunchHost, "host", nil},
		"id, other errors": {idRefused(fmt.Errorf("run dir: %w", fs.ErrPermission)), diag.LaunchHost, "host", fs.ErrPermission},
	} {
		t.Run(name, func(t *testing.T) {
			err := coded(c.err)
			ue := &UnavailableError{Reason: err.Error(), Err: err}
			if !errors.Is(ue, c.code) || (c.is != nil && !errors.Is(ue, c.is)) {
				t.Errorf("%v: not %s / %v", ue, c.code, c.is)
			}
			d := ue.Diagnostics()
			if len(d) != 1 || d[0].Code != c.code || d[0].Path != "launch."+c.step || d[0].Message != c.err.Error() {
				t.Errorf("diagnostics %v, want %s at launch.%s with the error's text", d, c.code, c.step)
			}
		})
	}
}
