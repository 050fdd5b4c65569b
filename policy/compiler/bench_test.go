package compiler

// Benchmarks for `make bench` (scripts/bench.sh). There are no Test
// functions here: `go test ./...` runs none of this, and the benchmarks run
// only with -bench.
//
//	BenchmarkCompileReference  one in-process Compile of the reference
//	                           pi-session facts (testdata/base), the figure
//	                           held to the 3 ms target.
//	BenchmarkCompileNewRegistry the same compile, but every iteration
//	                           hands in a registry the process has not
//	                           checked before (the reference one with
//	                           trailing spaces), as a one-shot CLI
//	                           compile does: the registry's schema check,
//	                           which a supervisor pays once, is in it.
//	BenchmarkCompileBatch      n = 1, 10, 100, 1000 distinct fact sets
//	                           compiled one after another; ns/factset should
//	                           stay flat as n grows (linear total cost).
//	BenchmarkCUEBaseline       what CUE alone costs for the same facts:
//	  /bare                    a fresh cue.Context, the schema built in it,
//	                           #Facts unified with the facts, validated
//	                           concrete and decoded into schema.Facts;
//	  /LoadFacts               schema.NewLoader().Facts, the compiler's own facts
//	                           stage (the above plus prechecks, the unknown
//	                           field walk and the JSON round trip).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/ast"
	"cuelang.org/go/cue/cuecontext"
	"cuelang.org/go/cue/parser"
	cuejson "cuelang.org/go/encoding/json"

	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/internal/testkit/testtree"
	"paseo.dev/paseo-policy/policy/schema"
)

// benchBase is the reference input set: the pi-session facts, the registry
// and the host tree every golden case starts from.
var benchBase = filepath.Join("..", "..", "testdata", "base")

func benchRead(b *testing.B, name string) []byte {
	b.Helper()
	data, err := os.ReadFile(filepath.Join(benchBase, name))
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// benchSetup builds the reference host tree beneath a temporary directory
// and returns the reference inputs and a resolver rooted at that tree.
func benchSetup(b *testing.B) (Inputs, pathsafe.Resolver) {
	b.Helper()
	root := b.TempDir()
	cleanup, err := testtree.Build(root, string(benchRead(b, "tree.txt")))
	b.Cleanup(cleanup)
	if err != nil {
		b.Fatal(err)
	}
	in := Inputs{
		Facts:    schema.Input{Name: "facts.json", Data: benchRead(b, "facts.json")},
		Registry: schema.Input{Name: "registry.json", Data: benchRead(b, "registry.json")},
	}
	return in, pathsafe.Resolver{Base: root}
}

// benchCompile compiles once and fails the benchmark on any refusal, so a
// benchmark never silently times the (cheaper) refusal path.
func benchCompile(b *testing.B, in Inputs, opts Options) {
	res, diags := Compile(in, opts)
	if res == nil || len(diags) > 0 {
		b.Fatalf("reference facts refused: %v", diags)
	}
}

func BenchmarkCompileReference(b *testing.B) {
	in, res := benchSetup(b)
	opts := Options{Resolver: res}
	benchCompile(b, in, opts) // warm: parse the embedded schema once
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		benchCompile(b, in, opts)
	}
}

func BenchmarkCompileNewRegistry(b *testing.B) {
	in, res := benchSetup(b)
	opts := Options{Resolver: res}
	benchCompile(b, in, opts)
	// More variants than schema remembers, used in turn, so each
	// iteration's registry bytes are new to the cache.
	variants := make([][]byte, 64)
	for i := range variants {
		variants[i] = append(bytes.Clone(in.Registry.Data), bytes.Repeat([]byte(" "), i+1)...)
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		in.Registry.Data = variants[i%len(variants)]
		i++
		benchCompile(b, in, opts)
	}
}

// batchFacts returns n distinct fact sets: the reference facts with agent.id
// and model.id merge-patched to unique values, and the agent's session and
// cache dirs and Git store named for it (PP-STATE-SHARED otherwise) and
// made under the host tree at root. Every set compiles.
func batchFacts(b *testing.B, base []byte, root string, n int) [][]byte {
	b.Helper()
	out := make([][]byte, n)
	for i := range out {
		id := fmt.Sprintf("agent-%04x", i)
		sessions := "/srv/paseo/state/pi-sessions/" + id
		cache := "/srv/paseo/state/pi-cache/" + id
		store := "/srv/paseo/state/pi-git/" + id
		for _, d := range []string{sessions, cache, store} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				b.Fatal(err)
			}
		}
		patch, err := json.Marshal(map[string]any{
			"agent": map[string]any{"id": id},
			"model": map[string]any{"id": fmt.Sprintf("fake-%d", i+1)},
			"state": map[string]any{"sessionDir": sessions, "cacheDir": cache, "gitStore": store},
		})
		if err != nil {
			b.Fatal(err)
		}
		if out[i], err = testtree.MergePatch(base, patch); err != nil {
			b.Fatal(err)
		}
	}
	return out
}

func BenchmarkCompileBatch(b *testing.B) {
	in, res := benchSetup(b)
	opts := Options{Resolver: res}
	all := batchFacts(b, in.Facts.Data, res.Base, 1000)
	inputs := make([]Inputs, len(all))
	for i, f := range all {
		inputs[i] = Inputs{Facts: schema.Input{Name: "facts.json", Data: f}, Registry: in.Registry}
	}
	benchCompile(b, inputs[0], opts) // warm, and prove the patched facts compile
	for _, n := range []int{1, 10, 100, 1000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			batch := inputs[:n]
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				for _, in := range batch {
					benchCompile(b, in, opts)
				}
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(elapsed)/float64(n*b.N), "ns/factset")
		})
	}
}

// benchSchemaDecls parses policy/schema/*.cue from the source tree and returns
// their declarations as one package. These are the files schema embeds
// (//go:embed *.cue); the package exports no accessor for its embedded
// copy, so the bare baseline reads the same bytes from disk, once, outside
// the timed loop, as schema does with its sync.Once.
func benchSchemaDecls(b *testing.B) []ast.Decl {
	b.Helper()
	names, err := filepath.Glob(filepath.Join("..", "schema", "*.cue"))
	if err != nil || len(names) == 0 {
		b.Fatalf("schema files: %v (%d found)", err, len(names))
	}
	sort.Strings(names)
	var decls []ast.Decl
	for i, n := range names {
		src, err := os.ReadFile(n)
		if err != nil {
			b.Fatal(err)
		}
		f, err := parser.ParseFile(n, src, parser.ParseComments)
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range f.Decls {
			if _, isPkg := d.(*ast.Package); isPkg && i > 0 {
				continue
			}
			decls = append(decls, d)
		}
	}
	return decls
}

// bareLoadFacts is unify-validate-decode and nothing else, built the way
// schema.load builds it: a fresh context per call, so nothing is cached
// between iterations but the parsed schema declarations.
//
// The *ast.File around the declarations must be fresh per build, as
// schema.definition makes it: BuildFile appends the file's unresolved
// references to File.Unresolved on every call (40 per build of this
// schema), so building one *ast.File over and over gets slower each time
// and a benchmark of it measures its own iteration count.
func bareLoadFacts(decls []ast.Decl, facts []byte) (*schema.Facts, error) {
	ctx := cuecontext.New()
	sv := ctx.BuildFile(&ast.File{Decls: decls})
	if err := sv.Err(); err != nil {
		return nil, err
	}
	def := sv.LookupPath(cue.ParsePath("#Facts"))
	expr, err := cuejson.Extract("facts.json", facts)
	if err != nil {
		return nil, err
	}
	v := def.Unify(ctx.BuildExpr(expr))
	if err := v.Validate(cue.Concrete(true), cue.Final()); err != nil {
		return nil, err
	}
	var f schema.Facts
	if err := v.Decode(&f); err != nil {
		return nil, err
	}
	return &f, nil
}

func BenchmarkCUEBaseline(b *testing.B) {
	facts := benchRead(b, "facts.json")
	b.Run("bare", func(b *testing.B) {
		decls := benchSchemaDecls(b)
		if _, err := bareLoadFacts(decls, facts); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := bareLoadFacts(decls, facts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("LoadFacts", func(b *testing.B) {
		in := schema.Input{Name: "facts.json", Data: facts}
		if _, ds := schema.NewLoader().Facts(in); len(ds) > 0 {
			b.Fatal(ds)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if f, ds := schema.NewLoader().Facts(in); f == nil || len(ds) > 0 {
				b.Fatal(ds)
			}
		}
	})
}
