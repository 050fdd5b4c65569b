package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"cuelang.org/go/cue"
	"cuelang.org/go/cue/ast"
	"cuelang.org/go/cue/cuecontext"
	cueerrors "cuelang.org/go/cue/errors"
	"cuelang.org/go/cue/parser"
	cuejson "cuelang.org/go/encoding/json"

	"paseo.dev/paseo-policy/diag"
)

// Input is one file the caller hands in: its name decides the format
// (.json is JSON, anything else CUE) and appears in syntax errors.
type Input struct {
	Name string
	Data []byte
}

// Loader checks inputs against the embedded schema. It holds one build of
// the schema, in a cue.Context that builds nothing else: each input is
// built in a context of its own (check), as cue's own mod/modfile keeps
// its schema's context apart from the module files it parses. The schema
// is only read after the build (looked up, unified with), but CUE
// evaluates lazily and does not promise that reading a value is safe
// for concurrent use, so a Loader is not safe for concurrent use either;
// separate Loaders share nothing of CUE's (CUE writes into the syntax
// trees it builds, so the schema is parsed afresh for each Loader). What
// they do share is checkedRegistries: bytes, behind a mutex.
type Loader struct {
	schema cue.Value
	err    error
	// defs are the definitions looked up so far: a lookup parsed its path
	// and walked the schema on every input.
	defs map[string]cue.Value
}

// NewLoader parses and builds the embedded schema.
func NewLoader() *Loader {
	ld := &Loader{}
	names, err := fs.Glob(files, "*.cue")
	if err != nil {
		ld.err = err
		return ld
	}
	sort.Strings(names)
	// The files form one package; their declarations go into one file so
	// a single BuildFile sees every definition.
	merged := &ast.File{}
	for i, n := range names {
		src, err := files.ReadFile(n)
		if err != nil {
			ld.err = err
			return ld
		}
		f, err := parser.ParseFile("schema/"+n, src, parser.ParseComments)
		if err != nil {
			ld.err = err
			return ld
		}
		for _, d := range f.Decls {
			if _, isPkg := d.(*ast.Package); isPkg && i > 0 {
				continue
			}
			merged.Decls = append(merged.Decls, d)
		}
	}
	ld.schema = cuecontext.New().BuildFile(merged)
	ld.err = ld.schema.Err()
	return ld
}

// definition returns one definition of the built schema.
func (ld *Loader) definition(name string) (cue.Value, error) {
	if ld.err != nil {
		return cue.Value{}, ld.err
	}
	if def, ok := ld.defs[name]; ok {
		return def, nil
	}
	def := ld.schema.LookupPath(cue.ParsePath(name))
	if !def.Exists() {
		return cue.Value{}, fmt.Errorf("schema has no %s", name)
	}
	if ld.defs == nil {
		ld.defs = map[string]cue.Value{}
	}
	ld.defs[name] = def
	return def, nil
}

// LoadRegistry decodes and checks one Registry input with a fresh Loader.
func LoadRegistry(in Input) (*Registry, diag.List) { return NewLoader().Registry(in) }

// LoadProfile decodes one profile with a fresh Loader.
func LoadProfile(fsys fs.FS, name string) (*Profile, diag.List) {
	return NewLoader().Profile(fsys, name)
}

// Facts decodes and checks one Facts input.
func (ld *Loader) Facts(in Input) (*Facts, diag.List) {
	var f Facts
	ds := ld.load(in, "#Facts", factsPrecheck, &f)
	if len(ds) > 0 {
		return nil, ds
	}
	return &f, nil
}

// Registry decodes and checks one Registry input. A registry that passed
// once is not checked again: every compile of a supervisor or a batch
// hands in the same operator registry, and checking it through CUE was
// a third of a compile. Only its canonical JSON is remembered (see
// checkedRegistries), so each call still decodes a Registry of its own.
func (ld *Loader) Registry(in Input) (*Registry, diag.List) {
	var r Registry
	if data, ok := checkedRegistries.get(in); ok {
		if ds := decodeCanonical(data, &r); len(ds) > 0 {
			return nil, ds
		}
		return &r, nil
	}
	data, ds := ld.check(in, "#Registry", registryPrecheck)
	if len(ds) > 0 {
		return nil, ds
	}
	if ds := decodeCanonical(data, &r); len(ds) > 0 {
		return nil, ds
	}
	checkedRegistries.put(in, data)
	return &r, nil
}

// Profile decodes one profile file (name.cue) from fsys.
func (ld *Loader) Profile(fsys fs.FS, name string) (*Profile, diag.List) {
	data, err := fs.ReadFile(fsys, name+".cue")
	if err != nil {
		var l diag.List
		l.Addf(diag.ProfileUnknown, "agent.profile", "no embedded profile named %q", name)
		return nil, l
	}
	var p Profile
	ds := ld.load(Input{Name: "profiles/" + name + ".cue", Data: data}, "#Profile", authorityPrecheck, &p)
	if len(ds) > 0 {
		// A broken profile is our bug, not the daemon's; say so distinctly.
		var l diag.List
		for _, d := range ds {
			l.Addf(diag.ProfileInvalid, "profile."+name+pathSuffix(d.Path), "%s (%s)", d.Message, d.Code)
		}
		return nil, l
	}
	if p.Name != name {
		var l diag.List
		l.Addf(diag.ProfileInvalid, "profile."+name, "profile file declares name %q", p.Name)
		return nil, l
	}
	return &p, nil
}

func pathSuffix(p string) string {
	if p == "" {
		return ""
	}
	return "." + p
}

type precheck func(raw any, l *diag.List)

func (ld *Loader) load(in Input, defName string, pre precheck, out any) diag.List {
	data, l := ld.check(in, defName, pre)
	if len(l) > 0 {
		return l
	}
	return decodeCanonical(data, out)
}

// check runs every check on one input and returns the unified value as
// JSON, or the refusals.
func (ld *Loader) check(in Input, defName string, pre precheck) ([]byte, diag.List) {
	var l diag.List
	def, err := ld.definition(defName)
	if err != nil {
		l.Addf(diag.Internal, "", "embedded schema: %v", err)
		return nil, l
	}
	if !checkSize(in, &l) {
		return nil, l
	}
	// A context per input, never the schema's, as cue's mod/modfile
	// builds each module file: a value holds memory for as long as the
	// context it was built with is alive, and a pooled Loader's context
	// lives across compiles. cuelang.org/go 0.17.1 happens to keep nothing
	// of a built input in its context (TestLoaderReuseMemoryBounded), but
	// that is what it does, not what it promises; built in its own context,
	// the input and the unified value (Unify evaluates in its receiver's
	// context) go with this call whatever a later CUE does, and the schema
	// is only read. A steady-state compile builds one input (the facts:
	// the registry's check and the embedded profiles are remembered), so
	// this is one context per compile; BenchmarkCUEBaseline/LoadFacts and
	// the compile benchmarks measure it (docs/benchmarks.md, "Compile").
	raw, ok := parseInput(cuecontext.New(), in, &l)
	if !ok {
		return nil, l
	}
	// Prechecks run on the raw input, before the schema, so that dangerous
	// requests get their own precise code even when the schema also fails.
	if generic, err := rawData(in, raw); err == nil {
		pre(generic, &l)
		unknownFields(def, generic, "", &l)
	}
	unified := raw.Unify(def)
	if err := unified.Validate(cue.Concrete(true), cue.Final()); err != nil {
		for _, d := range schemaDiagnostics(def, err) {
			if !l.Has(d.Path) {
				l = append(l, d)
			}
		}
	}
	if len(l) > 0 {
		return nil, l.Sorted()
	}
	data, err := unified.MarshalJSON()
	if err != nil {
		l.Addf(diag.Internal, "", "export: %v", err)
		return nil, l
	}
	return data, nil
}

// decodeCanonical decodes a checked input's JSON with unknown fields
// refused: the schema is closed, so this only catches a Go type that
// drifted from the CUE.
func decodeCanonical(data []byte, out any) diag.List {
	var l diag.List
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		l.Addf(diag.Internal, "", "decode: %v", err)
	}
	return l
}

// unknownFields reports every input field the schema does not define. CUE
// reports closedness errors too, but not at the top level of a unified
// definition and not alongside some other errors; this walk makes the
// report complete and independent of what else is wrong.
func unknownFields(def cue.Value, raw any, path string, l *diag.List) {
	switch x := raw.(type) {
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			p := joinPath(path, k)
			if !def.Allows(cue.Str(k)) {
				if !l.Has(p) {
					l.Addf(diag.SchemaUnknown, p, "field is not part of the contract")
				}
				continue
			}
			child := def.LookupPath(cue.MakePath(cue.Str(k)))
			if !child.Exists() {
				child = def.LookupPath(cue.MakePath(cue.AnyString))
			}
			if child.Exists() {
				unknownFields(child, x[k], p, l)
			}
		}
	case []any:
		elem := def.LookupPath(cue.MakePath(cue.AnyIndex))
		if !elem.Exists() {
			return
		}
		for i, e := range x {
			unknownFields(elem, e, path+"["+strconv.Itoa(i)+"]", l)
		}
	}
}

// rawData is the input as plain data for the prechecks. JSON is decoded
// directly (cheaper than a walk through CUE); CUE input through CUE.
func rawData(in Input, raw cue.Value) (any, error) {
	var generic any
	if strings.EqualFold(path.Ext(in.Name), ".json") {
		return generic, json.Unmarshal(in.Data, &generic)
	}
	return generic, raw.Decode(&generic)
}

func parseInput(ctx *cue.Context, in Input, l *diag.List) (cue.Value, bool) {
	var v cue.Value
	if strings.EqualFold(path.Ext(in.Name), ".json") {
		if !jsonShape(in.Data, l) {
			return v, false
		}
		expr, err := cuejson.Extract(in.Name, in.Data)
		if err != nil {
			l.Addf(diag.InputSyntax, "", "%s is not valid JSON: %s", in.Name, syntaxMessage(err))
			return v, false
		}
		v = ctx.BuildExpr(expr)
	} else {
		f, err := parser.ParseFile(in.Name, in.Data)
		if err != nil {
			l.Addf(diag.InputSyntax, "", "%s is not valid CUE: %s", in.Name, syntaxMessage(err))
			return v, false
		}
		hasImports := false
		for range f.ImportSpecs() {
			hasImports = true
		}
		if hasImports {
			l.Addf(diag.InputSyntax, "", "%s imports packages; inputs must be plain data", in.Name)
			return v, false
		}
		if !cueData(f, l) {
			return v, false
		}
		v = ctx.BuildFile(f)
	}
	if err := v.Err(); err != nil {
		l.Addf(diag.InputSyntax, "", "%s does not evaluate: %s", in.Name, syntaxMessage(err))
		return v, false
	}
	return v, true
}

// syntaxMessage keeps the position of a parse error but not the offending
// token, which could be part of a secret pasted in the wrong place.
func syntaxMessage(err error) string {
	errs := cueerrors.Errors(err)
	if len(errs) == 0 {
		return "unreadable input"
	}
	return errs[0].Position().String() + ": syntax error"
}

// schemaDiagnostics turns CUE errors into diagnostics. CUE's own messages
// quote the offending value, which may be a misplaced secret, so the message
// is rebuilt from the schema's constraint instead.
func schemaDiagnostics(def cue.Value, err error) diag.List {
	var l diag.List
	for _, e := range cueerrors.Errors(err) {
		sel := trimDefinition(e.Path())
		p := factPath(sel)
		format, _ := e.Msg()
		switch {
		case p == "apiVersion" || p == "kind":
			l.Addf(diag.InputKind, p, "must be %s", constraint(def, sel))
		case strings.Contains(format, "not allowed"):
			l.Addf(diag.SchemaUnknown, p, "field is not part of the contract")
		case strings.Contains(format, "incomplete") || strings.Contains(format, "non-concrete"):
			l.Addf(diag.SchemaIncomplete, p, "required field is missing; expected %s", constraint(def, sel))
		default:
			l.Addf(diag.SchemaInvalid, p, "value does not satisfy %s", constraint(def, sel))
		}
	}
	return l
}

func constraint(def cue.Value, p []string) string {
	sel := make([]cue.Selector, 0, len(p))
	for _, s := range p {
		if n, err := strconv.Atoi(s); err == nil {
			sel = append(sel, cue.Index(n))
		} else {
			sel = append(sel, cue.Str(s))
		}
	}
	v := def.LookupPath(cue.MakePath(sel...))
	if !v.Exists() {
		if len(p) > 0 {
			// A list element or pattern field: describe the parent.
			return constraint(def, p[:len(p)-1]) + " element"
		}
		return "the schema"
	}
	s := fmt.Sprint(v)
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return s
}

// trimDefinition drops the leading #Facts/#Registry selector CUE puts on
// paths of a unified definition, leaving the path as the input spells it.
func trimDefinition(p []string) []string {
	for len(p) > 0 && strings.HasPrefix(p[0], "#") {
		p = p[1:]
	}
	return p
}

// factPath renders CUE path elements as workspace.git.alternates[0].
func factPath(p []string) string {
	var b strings.Builder
	for _, s := range p {
		if _, err := strconv.Atoi(s); err == nil {
			b.WriteString("[" + s + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	return b.String()
}
