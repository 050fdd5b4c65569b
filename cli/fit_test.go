package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// The explain and diff goldens are the text of every compiled golden case
// (the bundle in testdata/<case>/golden/, written by the compiler's golden
// test) at the default width: explain of each, and diff between the
// reference case and each other case, both ways. They sit beside the bundle
// as explain.txt and diff.txt, so each case is one directory (the compiler's
// golden_test.go says why). PASEO_UPDATE=1 rewrites them.

const referenceCase = "host-pi-session-api-key"

var updateGolden = os.Getenv("PASEO_UPDATE") == "1"

// bundleCases are the golden cases that compiled to a bundle.
func bundleCases(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join("..", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(caseDir(e.Name()), bundle.ManifestFile)); err == nil {
			names = append(names, e.Name())
		}
	}
	if len(names) < 2 {
		t.Fatalf("found %d compiled golden cases under testdata/*/golden/, want several", len(names))
	}
	return names
}

// caseDir is case name's golden/: its compiled bundle, and its explain and
// diff text.
func caseDir(name string) string { return filepath.Join("..", "testdata", name, "golden") }

// run runs the command line with COLUMNS set to columns ("" for none) and
// returns stdout and the exit code; anything on stderr fails the test.
func run(t *testing.T, columns string, args ...string) (string, int) {
	t.Helper()
	t.Setenv("COLUMNS", columns)
	var out, errb bytes.Buffer
	code := Main(args, &out, &errb)
	if errb.Len() > 0 {
		t.Fatalf("paseo-policy %s: stderr: %s", strings.Join(args, " "), errb.String())
	}
	return out.String(), code
}

// diffs are diff from the reference to the case and back: a "$ command"
// line for each (for the golden file), and its output.
func diffs(t *testing.T, columns, name string, extra ...string) (heads, outs []string) {
	t.Helper()
	for _, pair := range [][2]string{{referenceCase, name}, {name, referenceCase}} {
		args := append([]string{"diff"}, extra...)
		args = append(args, caseDir(pair[0]), caseDir(pair[1]))
		out, code := run(t, columns, args...)
		if code != ExitOK && code != ExitWidened {
			t.Fatalf("diff %s %s exited %d", pair[0], pair[1], code)
		}
		heads = append(heads, fmt.Sprintf("$ paseo-policy diff %s %s (exit %d)\n", pair[0], pair[1], code))
		outs = append(outs, out)
	}
	return heads, outs
}

// diffBoth is both diffs as one text.
func diffBoth(t *testing.T, columns, name string) string {
	t.Helper()
	heads, outs := diffs(t, columns, name)
	return heads[0] + outs[0] + heads[1] + outs[1]
}

func compareText(t *testing.T, path, got string) {
	t.Helper()
	if updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (PASEO_UPDATE=1 go test ./cli/ writes it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got); PASEO_UPDATE=1 rewrites it:\n%s", path, diff)
	}
}

func TestExplainDiffGolden(t *testing.T) {
	for _, name := range bundleCases(t) {
		t.Run(name, func(t *testing.T) {
			out, code := run(t, "", "explain", caseDir(name))
			if code != ExitOK {
				t.Fatalf("explain exited %d", code)
			}
			compareText(t, filepath.Join(caseDir(name), "explain.txt"), out)
			if name != referenceCase {
				compareText(t, filepath.Join(caseDir(name), "diff.txt"), diffBoth(t, "", name))
			}
		})
	}
}

// TestTextFits: every line of explain and diff on every golden case fits
// the width: 100 columns with no terminal and no COLUMNS, else COLUMNS.
func TestTextFits(t *testing.T) {
	for _, tc := range []struct {
		columns string
		width   int
	}{{"", 100}, {"100", 100}, {"72", 72}, {"50", 50}} {
		for _, name := range bundleCases(t) {
			explain, _ := run(t, tc.columns, "explain", caseDir(name))
			texts := map[string]string{"explain": explain}
			if name != referenceCase {
				_, outs := diffs(t, tc.columns, name)
				texts["diff"], texts["diff back"] = outs[0], outs[1]
			}
			for cmd, text := range texts {
				for i, line := range strings.Split(text, "\n") {
					if textWidth(line) > tc.width {
						t.Errorf("COLUMNS=%q %s %s line %d is %d columns, over %d: %q", tc.columns, cmd, name, i+1, textWidth(line), tc.width, line)
					}
				}
			}
		}
	}
}

// TestWideKeepsValues: --wide prints each grant on one line with every value
// in full, and each diff change and its old and new grant on one line each.
func TestWideKeepsValues(t *testing.T) {
	for _, name := range bundleCases(t) {
		m, err := loadManifest(caseDir(name))
		if err != nil {
			t.Fatal(err)
		}
		// Narrow COLUMNS must not matter to --wide.
		out, _ := run(t, "50", "explain", "--wide", caseDir(name))
		lines := strings.Split(out, "\n")
		const headLines = 4 // profile, image, blank, column header
		if len(lines) < headLines+len(m.Grants) {
			t.Fatalf("%s: explain --wide printed %d lines for %d grants", name, len(lines), len(m.Grants))
		}
		for _, v := range []string{m.Image.Version, m.Image.Digest, m.Image.Rootfs} {
			if !strings.Contains(out, v) {
				t.Errorf("%s: explain --wide lacks %q", name, v)
			}
		}
		for i, g := range m.Grants {
			line := lines[headLines+i]
			for _, v := range []string{string(g.Kind()), string(g.Access()), g.Subject(), detail(g), g.Why().Fact, g.Why().Reason} {
				if !strings.Contains(line, v) {
					t.Errorf("%s: explain --wide line for grant %d lacks %q: %q", name, i, v, line)
				}
			}
		}
		if name == referenceCase {
			continue
		}
		ref, err := loadManifest(caseDir(referenceCase))
		if err != nil {
			t.Fatal(err)
		}
		out, _ = run(t, "50", "diff", "--wide", caseDir(referenceCase), caseDir(name))
		lines = strings.Split(out, "\n")
		n := 0
		for _, c := range grant.Diff(ref.Grants, m.Grants) {
			want := []string{c.Key}
			for _, g := range []grant.Grant{c.Old, c.New} {
				if g != nil {
					want = append(want, string(g.Access())+" "+detail(g)+" "+g.Why().Fact)
				}
			}
			for _, w := range want {
				if n >= len(lines) || !strings.Contains(lines[n], w) {
					t.Errorf("%s: diff --wide line %d lacks %q", name, n+1, w)
				}
				n++
			}
		}
	}
}

// TestWrap: wrapped lines fit, and only spaces at the breaks are lost.
func TestWrap(t *testing.T) {
	long := "mkdir -p /tmp/jiti; chmod -R u+rwX /tmp/jiti 2>/dev/null || :; exec pi \"$@\"  " +
		"<- /srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs sha256:" + strings.Repeat("0", 64) +
		" nosuid,nodev,noexec,mode=0700,uid=1000,gid=1000,size=16777216"
	squash := func(s string) string { return strings.ReplaceAll(s, " ", "") }
	for width := 1; width <= 120; width++ {
		for _, indent := range []int{0, 4} {
			lines := hang("  "+long, width, indent)
			got := ""
			for i, l := range lines {
				if textWidth(l) > max(width, indent+1, 3) {
					t.Fatalf("width %d indent %d: line %d is %d wide: %q", width, indent, i, textWidth(l), l)
				}
				got += l
			}
			if squash(got) != squash(long) {
				t.Fatalf("width %d indent %d: text changed:\n%q\n%q", width, indent, squash(got), squash(long))
			}
		}
	}
	// An arrow stays with what it points at; a path breaks after a slash.
	if got, want := wrap("tmpfs <- /srv/paseo/state", 20), []string{"tmpfs", "<- /srv/paseo/state"}; !cmp.Equal(got, want) {
		t.Errorf("wrap: got %q, want %q", got, want)
	}
	if got, want := wrap("tmpfs <- /srv/paseo/state/pi-agent", 24), []string{"tmpfs <- /srv/paseo/", "state/pi-agent"}; !cmp.Equal(got, want) {
		t.Errorf("wrap: got %q, want %q", got, want)
	}
	// Spacing within a line is kept.
	if got, want := wrap("! widened  mount /a/b", 16), []string{"! widened  mount", "/a/b"}; !cmp.Equal(got, want) {
		t.Errorf("wrap: got %q, want %q", got, want)
	}
}
