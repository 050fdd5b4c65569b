// Package compiler turns trusted facts, the operator registry and a reviewed
// profile into a plan of grants (bundle.Plan), and renders the plan into a
// bundle with policy/render/oci: config.json (OCI), egress.json,
// manifest.json and the generated /etc files.
//
// It is pure apart from the path resolver: the same inputs on the same host
// tree give the same bytes.
package compiler

import (
	"io/fs"
	"sync"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/profiles"
	"paseo.dev/paseo-policy/policy/render/oci"
	"paseo.dev/paseo-policy/policy/schema"
)

// Version is recorded in every manifest. It changes when compiled output
// for the same inputs changes.
const Version = "0.1.0"

// Options are the compiler's seams.
type Options struct {
	// Resolver opens bind sources; the zero value resolves on the host.
	Resolver pathsafe.Resolver
	// Profiles to choose from; nil means the embedded, reviewed ones.
	Profiles fs.FS
}

// Inputs are the three things a compile reads.
type Inputs struct {
	Facts    schema.Input
	Registry schema.Input
}

// Result is a compiled launch.
type Result struct {
	Plan     *bundle.Plan
	Manifest *bundle.Manifest
	Files    bundle.Files
}

// Compile checks the inputs and, when nothing is refused, returns the plan
// and its rendered bundle. Every refusal is collected into the diag.List.
func Compile(in Inputs, opts Options) (*Result, diag.List) {
	ld := loaders.Get().(*schema.Loader)
	defer loaders.Put(ld)
	facts, fd := ld.Facts(in.Facts)
	reg, rd := ld.Registry(in.Registry)
	var l diag.List
	for _, d := range rd {
		// Registry paths are prefixed so they never read as fact paths.
		d.Path = prefixed("registry", d.Path)
		l = append(l, d)
	}
	l = append(l, fd...)
	if reg != nil {
		checkRegistry(&l, reg)
	}
	if facts == nil || reg == nil || len(l) > 0 {
		return nil, l.Sorted()
	}
	var prof *schema.Profile
	var pd diag.List
	if opts.Profiles == nil {
		prof, pd = embeddedProfile(facts.Agent.Profile)
	} else {
		prof, pd = ld.Profile(opts.Profiles, facts.Agent.Profile)
	}
	l = append(l, pd...)
	if prof == nil {
		return nil, l.Sorted()
	}
	c := newCompilation(facts, reg, prof, opts.Resolver, &l)
	if c == nil {
		return nil, l.Sorted()
	}
	// The phases run whatever newCompilation refused, so that every
	// refusal of the launch is reported at once.
	plan := c.plan()
	if len(l) > 0 {
		return nil, l.Sorted()
	}
	files, manifest, err := oci.Render(plan)
	if err != nil {
		l.Addf(diag.Internal, "", "render: %v", err)
		return nil, l
	}
	return &Result{Plan: plan, Manifest: manifest, Files: files}, nil
}

// loaders reuses built schemas across compiles. CUE does not promise that
// one context or value is safe for concurrent use (a shared schema raced
// in TestConcurrentCompiles), so a Loader is never shared: the pool hands
// each compile one for itself, and it goes back only when the compile is
// done. Building the schema was a third of an in-process compile.
var loaders = sync.Pool{New: func() any { return schema.NewLoader() }}

// The embedded profiles never change at run time, so each is decoded once
// per process; the compiler only reads them.
var (
	profileMu    sync.Mutex
	profileCache = map[string]profileEntry{}
)

type profileEntry struct {
	p *schema.Profile
	d diag.List
}

func embeddedProfile(name string) (*schema.Profile, diag.List) {
	profileMu.Lock()
	defer profileMu.Unlock()
	e, ok := profileCache[name]
	if !ok {
		e.p, e.d = schema.LoadProfile(profiles.FS, name)
		profileCache[name] = e
	}
	return e.p, e.d
}

func prefixed(prefix, p string) string {
	if p == "" {
		return prefix
	}
	return prefix + "." + p
}
