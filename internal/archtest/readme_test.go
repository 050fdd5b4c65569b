package archtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestReadmeLayout holds README's layout table to the tree: every package
// of the module has a row naming its directory, and every directory a row
// names exists. A package moved, added or removed without its row fails.
func TestReadmeLayout(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	root := moduleRoot(t, gobin)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := layoutPaths(t, string(readme))
	for _, p := range listModule(t) {
		if p.Path != "." && !named[p.Path+"/"] {
			t.Errorf("package %s has no row in README's layout table", p.Path)
		}
	}
	for p := range named {
		if st, err := os.Stat(filepath.Join(root, p)); err != nil || !st.IsDir() {
			t.Errorf("README's layout table names %s, which is not a directory of the tree", p)
		}
	}
}

// layoutPaths returns the `dir/` paths in the first column of the table
// under README's "## Layout".
func layoutPaths(t *testing.T, readme string) map[string]bool {
	t.Helper()
	_, section, ok := strings.Cut(readme, "\n## Layout\n")
	if !ok {
		t.Fatal("README has no \"## Layout\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	dir := regexp.MustCompile("`([a-z0-9./_-]+/)`")
	named := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range dir.FindAllStringSubmatch(cells[1], -1) {
			named[m[1]] = true
		}
	}
	if len(named) < 20 {
		t.Fatalf("README's layout table names %d directories; expected one row per package", len(named))
	}
	return named
}
