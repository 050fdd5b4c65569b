// Package launchplan is a bundle read once and verified: the typed value
// every step of a launch works from. Load reads each bundle file once
// (bundle.Read: beneath a descriptor of the bundle dir, by descriptor),
// decodes config.json, egress.json, manifest.json and pins.json, pairs the
// bind mounts with their pins and runs the one validator (ocicheck) on
// those bytes. After Load nothing opens the bundle again: preflight, the
// EROFS check, bind staging, the network and runsc's start all read the
// Plan, so what was verified is what runs.
//
// doctor --bundle, validate and a launch all judge a bundle through
// ocicheck.Files, so the three report the same findings under the same
// check names.
package launchplan

import (
	"time"

	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/ocicheck"
)

// Plan is one bundle as read and judged. A decoded field is nil when its
// file does not decode; the finding saying why is in Verdict. A launch
// uses a Plan only once Verdict has no findings (preflight refuses it
// otherwise).
type Plan struct {
	// Dir is where the bundle was read from: for records and messages,
	// never to read from again.
	Dir string
	// Decoded holds the bytes as read, once (Files), each document decoded
	// once (Spec, Egress, Manifest, Pins) and the placeholder check
	// (MarkersErr): digests, pins and placeholders were checked on
	// exactly these.
	ocicheck.Decoded
	// Digests are the sha256 of each file as read ("sha256:<hex>"), the
	// values the manifest's outputs were compared with.
	Digests map[string]string
	// Binds pairs every bind with a host source with its pin: what the
	// launcher stages, by descriptor. BindsErr says why they cannot be
	// paired (also for a bundle without pins.json, which pins nothing).
	Binds    []bundle.BindPin
	BindsErr error

	// What a launch enforces besides the spec, typed and computed once
	// from the decoded documents, so no step reads a document for them:
	// the network mode and private routes (egress.json) and the limits
	// the launcher itself holds the sandbox to. Zero when their document
	// did not decode.
	Network string
	Routes  []bundle.Route
	Limits  Limits
	// FSMonitor is the workspace monitor the launch serves (the plan's
	// fsmonitor grant, when on), or nil.
	FSMonitor *grant.FSMonitor
	// Search is the native search the launch serves (the plan's search
	// grant, when on), or nil.
	Search *grant.Search

	// Verdict is ocicheck's judgement of Files: digests, secret
	// placeholders, pins, egress destinations, the OCI runtime-tools
	// checks and the invariants (no hooks, read-only root, …).
	Verdict ocicheck.Result
}

// Load reads the bundle in dir once and judges it. The error is only for
// a bundle that cannot be read at all; everything wrong with what was
// read is a finding in Verdict, so a report can name every problem.
func Load(dir string) (*Plan, error) {
	files, err := bundle.Read(dir)
	if err != nil {
		return nil, err
	}
	return FromFiles(dir, files), nil
}

// FromFiles is Load on a bundle already in memory.
func FromFiles(dir string, files bundle.Files) *Plan {
	p := &Plan{Dir: dir, Decoded: ocicheck.Decode(files), Digests: map[string]string{}}
	for name, data := range files {
		p.Digests[name] = bundle.Digest(data)
	}
	p.Binds, p.BindsErr = p.PinnedBinds()
	if p.Egress != nil {
		p.Network, p.Routes = p.Egress.Mode, p.Egress.Routes
	}
	p.Limits = limitsOf(p.Decoded)
	if p.Manifest != nil {
		for _, g := range p.Manifest.Grants {
			if m, ok := g.(grant.FSMonitor); ok && m.On {
				p.FSMonitor = &m
			}
			if s, ok := g.(grant.Search); ok && s.On {
				p.Search = &s
			}
		}
	}
	p.Verdict = ocicheck.Check(p.Decoded, dir, ocicheck.Options{})
	return p
}

// RunscFlags are the launcher's fixed runsc flags: a private state root,
// the bundle's network mode, the default platform, no directfs (the gofer
// serves every file). Nothing else, and nothing from the bundle but the
// network mode, reaches runsc's command line.
func RunscFlags(root, network string) []string {
	return []string{"--root", root, "--network=" + network, "--directfs=false"}
}

// Limits are the limits the launcher enforces itself (zero: none).
type Limits struct {
	// Wall and Output are the wallSeconds and outputBytes grants: the
	// launcher stops the sandbox at either.
	Wall   time.Duration
	Output int64
	// Memory is the spec's memory limit, the rendering of the memory
	// cgroup grant: on cgroup v1 the launcher makes the memory cgroup and
	// writes it there (runsc leaves a cgroup it did not make to its
	// maker), so it must be the very number runsc would apply.
	Memory int64
}

// limitsOf reads the limits from the typed grants, validated when the
// manifest was decoded, and the decoded spec.
func limitsOf(d ocicheck.Decoded) Limits {
	var l Limits
	if d.Manifest != nil {
		for _, g := range d.Manifest.Grants {
			switch g := g.(type) {
			case grant.WallLimit:
				l.Wall = g.Wall
			case grant.OutputLimit:
				l.Output = g.Bytes
			}
		}
	}
	if d.Spec != nil && d.Spec.Linux != nil {
		if r := d.Spec.Linux.Resources; r != nil && r.Memory != nil && r.Memory.Limit != nil {
			l.Memory = *r.Memory.Limit
		}
	}
	return l
}
