package compiler

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/schema"
)

// goldenCase is testdata/<case>/case.json: a patch over testdata/base.
type goldenCase struct {
	About    string          `json:"about"`
	Expect   []diag.Code     `json:"expect"` // empty: compiles
	Facts    json.RawMessage `json:"facts"`
	Registry json.RawMessage `json:"registry"`
	Tree     []string        `json:"tree"`
	// FactsFile, when set, is read verbatim from the case directory
	// instead of patching the base facts (CUE input, syntax errors).
	FactsFile string `json:"factsFile"`
	// Secrets must appear in no output, diagnostics included.
	Secrets []string `json:"secrets"`
	// KubernetesGateway renders the cluster renderings with the gateway
	// (kubernetesGatewayOptions): a case whose routes a gateway Pod can serve.
	KubernetesGateway bool `json:"kubernetesGateway"`
}

var update = os.Getenv("PASEO_UPDATE") == "1"

// testdata is the repository's testdata/: testdata/base and the cases.
var testdata = filepath.Join("..", "..", "testdata")

// goldenDir is where case name's outputs are.
func goldenDir(name string) string { return filepath.Join(testdata, name, "golden") }

// caseInputs assembles one case's inputs and host tree.
func caseInputs(t testing.TB, name string) (goldenCase, Inputs, pathsafe.Resolver) {
	t.Helper()
	dir := filepath.Join(testdata, name)
	var gc goldenCase
	data, err := os.ReadFile(filepath.Join(dir, "case.json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&gc); err != nil {
		t.Fatalf("%s/case.json: %v", name, err)
	}
	base := filepath.Join(testdata, "base")
	facts := patched(t, filepath.Join(base, "facts.json"), gc.Facts)
	factsName := "facts.json"
	if gc.FactsFile != "" {
		if facts, err = os.ReadFile(filepath.Join(dir, gc.FactsFile)); err != nil {
			t.Fatal(err)
		}
		factsName = gc.FactsFile
	}
	reg := patched(t, filepath.Join(base, "registry.json"), gc.Registry)
	tree, err := os.ReadFile(filepath.Join(base, "tree.txt"))
	if err != nil {
		t.Fatal(err)
	}
	spec := string(tree) + "\n" + strings.Join(gc.Tree, "\n")
	if testtree.Mounts(spec) {
		skip.UnlessRoot(t, "its host tree mounts a tmpfs")
	}
	root := t.TempDir()
	cleanup, err := testtree.Build(root, spec)
	t.Cleanup(cleanup)
	if err != nil {
		t.Fatal(err)
	}
	in := Inputs{Facts: schema.Input{Name: factsName, Data: facts}, Registry: schema.Input{Name: "registry.json", Data: reg}}
	return gc, in, pathsafe.Resolver{Base: root}
}

func patched(t testing.TB, basePath string, patch json.RawMessage) []byte {
	t.Helper()
	doc, err := os.ReadFile(basePath)
	if err != nil {
		t.Fatal(err)
	}
	if len(patch) == 0 {
		return doc
	}
	out, err := testtree.MergePatch(doc, patch)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func caseNames(t testing.TB) []string {
	t.Helper()
	entries, err := os.ReadDir(testdata)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(testdata, e.Name(), "case.json")); err == nil {
			names = append(names, e.Name())
		}
	}
	if len(names) == 0 {
		t.Fatal("no golden cases found under testdata/")
	}
	return names
}

// goldenFiles are the bundle files every compiled case has.
var goldenFiles = []string{bundle.ConfigFile, bundle.EgressFile, bundle.ManifestFile, bundle.HostsFile, bundle.ResolvFile}

// optionalGolden are bundle files only some launches get.
var optionalGolden = []string{bundle.MCPConfigFile, bundle.GitHeadFile, bundle.ModelsFile, bundle.FSMonitorHookFile, bundle.FSMonitorIndexFile, bundle.SearchClientFile, bundle.SearchSpoolFile}

// diagnosticsFile is a refused case's output.
const diagnosticsFile = "diagnostics.txt"

// compilerOutputs are every file this test writes under a case's golden/.
// One the compile did not produce must be absent, so a case that changed
// from refused to compiled (or lost an optional file) leaves nothing stale.
var compilerOutputs = append(append(slices.Clone(goldenFiles), optionalGolden...), diagnosticsFile)

// TestGolden compiles every golden case and compares the output with its
// golden files. A golden case is one directory, testdata/<case>/: its
// inputs at the top (case.json, a patch over testdata/base, and any file it
// names) and every output under golden/, which PASEO_UPDATE=1 rewrites and
// nothing else touches: the compiled bundle or diagnostics.txt (this test),
// explain.txt and diff.txt (cli's TestExplainDiffGolden). Directories, not
// one txtar per case as cue has: a compiled golden/ is a real bundle
// directory that other packages' tests read as one (ocicheck, launchplan,
// the launcher, the CLI's explain and diff, acceptance), and review sees
// each file as the compiler writes it. Another output of the compiler is
// one more name in goldenFiles or optionalGolden.
func TestGolden(t *testing.T) {
	for _, name := range caseNames(t) {
		t.Run(name, func(t *testing.T) {
			gc, in, res := caseInputs(t, name)
			res1, diags := Compile(in, Options{Resolver: res})
			got := map[string][]byte{}
			if res1 != nil {
				for _, f := range goldenFiles {
					got[f] = res1.Files[f]
				}
				for _, f := range optionalGolden {
					if data, ok := res1.Files[f]; ok {
						got[f] = data
					}
				}
			} else {
				var b strings.Builder
				for _, d := range diags {
					b.WriteString(d.String() + "\n")
				}
				got[diagnosticsFile] = []byte(b.String())
			}
			checkExpectation(t, gc, diags)
			for _, f := range compilerOutputs {
				data, ok := got[f]
				if !ok {
					refuseStale(t, filepath.Join(goldenDir(name), f))
					continue
				}
				for _, s := range gc.Secrets {
					if bytes.Contains(data, []byte(s)) {
						t.Errorf("%s contains a secret from the case input", f)
					}
				}
				compareGolden(t, filepath.Join(goldenDir(name), f), data)
			}
			// Determinism: a second compile of the same inputs gives the same bytes.
			res2, diags2 := Compile(in, Options{Resolver: res})
			if diff := cmp.Diff(diags, diags2); diff != "" {
				t.Errorf("second compile changed diagnostics (-first +second):\n%s", diff)
			}
			if res1 != nil && res2 != nil {
				for _, f := range res1.Files.Names() {
					if !bytes.Equal(res1.Files[f], res2.Files[f]) {
						t.Errorf("second compile changed %s", f)
					}
				}
			}
		})
	}
}

// refuseStale fails if path, an output the compile did not produce,
// exists; PASEO_UPDATE=1 removes it.
func refuseStale(t *testing.T, path string) {
	t.Helper()
	if update {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
	} else if _, err := os.Stat(path); err == nil {
		t.Errorf("%s exists but the compile produced no %s (PASEO_UPDATE=1 removes it)", path, filepath.Base(path))
	}
}

func checkExpectation(t *testing.T, gc goldenCase, diags diag.List) {
	t.Helper()
	if len(gc.Expect) == 0 {
		if len(diags) > 0 {
			t.Fatalf("expected a bundle, got diagnostics:\n%v", diags)
		}
		return
	}
	var codes []diag.Code
	for _, d := range diags {
		codes = append(codes, d.Code)
	}
	for _, want := range gc.Expect {
		if !slices.Contains(codes, want) {
			t.Errorf("expected code %s; got %v", want, codes)
		}
	}
}

func compareGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with PASEO_UPDATE=1 to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-golden +got):\n%s", path, diff)
	}
}
