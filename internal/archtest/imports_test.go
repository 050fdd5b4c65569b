package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestModuleImports checks the rules against the module as it is: every
// package `go list ./...` reports, with its direct, transitive and test
// imports.
func TestModuleImports(t *testing.T) {
	pkgs := listModule(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list reported %d packages; expected the whole module", len(pkgs))
	}
	for _, v := range Check(pkgs) {
		t.Error(v)
	}
}

// listModule runs `go list -json ./...` at the module root. It uses the go
// command rather than golang.org/x/tools/go/packages, which the module does
// not depend on.
func listModule(t *testing.T) []Package {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	root := moduleRoot(t, gobin)
	cmd := exec.Command(gobin, "list", "-json=ImportPath,Dir,GoFiles,TestGoFiles,XTestGoFiles,Imports,Deps,TestImports,XTestImports", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v\n%s", root, err, stderr.Bytes())
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath, Dir                          string
			GoFiles, TestGoFiles, XTestGoFiles       []string
			Imports, Deps, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, Package{
			Path:        relative(p.ImportPath),
			Imports:     relativeAll(p.Imports),
			Deps:        relativeAll(p.Deps),
			TestImports: relativeAll(append(p.TestImports, p.XTestImports...)),
			Skips:       skipCalls(t, p.Dir, append(append(p.GoFiles, p.TestGoFiles...), p.XTestGoFiles...)),
		})
	}
	return pkgs
}

// skipCall is a call of testing's Skip, Skipf or SkipNow on any receiver
// (written in two pieces, so this file does not match it).
var skipCall = regexp.MustCompile(`\.Skip` + `(f|Now)?\(`)

// skipCalls returns the files of dir that call a Skip method.
func skipCalls(t *testing.T, dir string, files []string) []string {
	t.Helper()
	var out []string
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if skipCall.Match(src) {
			out = append(out, f)
		}
	}
	return out
}

func moduleRoot(t *testing.T, gobin string) string {
	t.Helper()
	out, err := exec.Command(gobin, "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == "/dev/null" {
		t.Fatalf("go env GOMOD: %q, %v; run the test inside the module", gomod, err)
	}
	return filepath.Dir(gomod)
}

func relative(path string) string {
	if path == Module {
		return "."
	}
	return strings.TrimPrefix(path, Module+"/")
}

func relativeAll(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = relative(p)
	}
	return out
}
