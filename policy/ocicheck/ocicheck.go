// Package ocicheck validates a compiled bundle on its own terms: its digests
// match its manifest, config.json passes the OCI runtime-tools checks (the
// local ones; the tools' JSON-schema check downloads its schema, so the
// schema that ships inside the runtime-spec module is used instead, when
// given), and it keeps the invariants runsc and this project rely on,
// re-checked on the artifact rather than trusted from the compiler.
package ocicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/opencontainers/runtime-tools/validate"

	"paseo.dev/paseo-policy/internal/netdest"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/grant"
)

// runtime-tools logs warnings through logrus's standard logger (for
// example that mount types are only checked host-specifically) and takes
// no logger value. ocicheck returns findings and leaves that logger alone:
// importing it changes nobody's log level. The program decides
// (cmd/paseo-policy keeps logrus to errors).

// Finding is one failed check.
type Finding struct {
	Check  string `json:"check"`
	Detail string `json:"detail"`
	// Err is the error the finding was read from (one error may give
	// several findings), kept for its codes and sentinels
	// (errors.Is(f.Err, diag.SecretMarker)); not part of the report.
	Err error `json:"-"`
}

// Options tune a validation run.
type Options struct {
	// SchemaDir holds config-schema.json from the runtime-spec module; when
	// empty the JSON-schema check is reported as not run.
	SchemaDir string
}

// Result lists what ran and what failed.
type Result struct {
	Ran      []string  `json:"ran"`
	Findings []Finding `json:"findings"`
}

// OK reports whether nothing failed.
func (r Result) OK() bool { return len(r.Findings) == 0 }

func (r *Result) run(name string, err error) {
	r.Ran = append(r.Ran, name)
	if err == nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(err.Error()), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "*"))
		if line == "" || strings.HasSuffix(line, "errors occurred:") || strings.HasSuffix(line, "error occurred:") {
			continue
		}
		r.Findings = append(r.Findings, Finding{Check: name, Detail: line, Err: err})
	}
}

// Check names (Finding.Check) that other reports map onto their own
// checks: doctor's and a launch's preflight report them under its
// bundle-* names (runtime/launcher/preflight).
const (
	CheckDigests  = "digests"
	CheckPins     = "pins"
	CheckDecode   = "decode"
	CheckNoHooks  = "invariant/" + invariantNoHooks
	CheckReadonly = "invariant/" + invariantReadonlyRoot
	// CheckSecretPlaceholders refuses a secret placeholder marker anywhere
	// in the bundle, a legacy secret slot included (bundle.MarkerError).
	CheckSecretPlaceholders = "secret-placeholders"
)

// Dir validates the bundle in dir, read once (bundle.Read).
func Dir(dir string, opts Options) (Result, error) {
	files, err := bundle.Read(dir)
	if err != nil {
		return Result{}, err
	}
	return Files(files, dir, opts), nil
}

// Files validates an in-memory bundle: the one validator behind
// `validate`, `doctor --bundle` and every launch (runtime/launcher/launchplan), so
// each invariant is checked in one place with one finding. dir is where
// the bundle lives (runtime-tools wants it); bundle-relative bind sources
// are looked up among files, never on disk again.
func Files(files bundle.Files, dir string, opts Options) Result {
	return Check(Decode(files), dir, opts)
}

// Decoded is a bundle with its documents decoded once, each with the
// reason it did not decode, and whether it holds a secret placeholder:
// what Check judges and what a launch plan keeps.
type Decoded struct {
	Files bundle.Files

	Spec        *specs.Spec // strictly decoded config.json
	SpecErr     error
	Manifest    *bundle.Manifest
	ManifestErr error
	Egress      *bundle.Egress
	EgressErr   error
	Pins        *bundle.Pins
	PinsErr     error

	// MarkersErr refuses a secret placeholder marker anywhere in Files
	// (a *bundle.MarkerError: a legacy secret slot, or a stray marker).
	MarkersErr error
}

// Decode decodes every document of files once.
func Decode(files bundle.Files) Decoded {
	d := Decoded{Files: files}
	var spec specs.Spec
	dec := json.NewDecoder(bytes.NewReader(files[bundle.ConfigFile]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		d.SpecErr = fmt.Errorf("%s is not a valid OCI runtime config: %w", bundle.ConfigFile, err)
	} else {
		d.Spec = &spec
	}
	d.Manifest, d.ManifestErr = files.Manifest()
	d.Egress, d.EgressErr = files.Egress()
	d.Pins, d.PinsErr = files.Pins()
	if d.ManifestErr != nil {
		d.MarkersErr = d.ManifestErr
	} else {
		d.MarkersErr = bundle.CheckNoSecretMarkers(files, d.Manifest)
	}
	return d
}

// PinnedBinds is files.PinnedBinds on the decoded documents.
func (d Decoded) PinnedBinds() ([]bundle.BindPin, error) {
	if d.PinsErr != nil {
		return nil, d.PinsErr
	}
	if d.Spec == nil {
		return d.Files.PinnedBinds() // its own decode names the error
	}
	return bundle.PairBinds(d.Spec.Mounts, d.Pins.Pins)
}

// Check validates a decoded bundle; Files is Check(Decode(files)).
func Check(d Decoded, dir string, opts Options) Result {
	files := d.Files
	var r Result
	if d.ManifestErr != nil {
		r.run(CheckDigests, d.ManifestErr)
	} else {
		r.run(CheckDigests, files.VerifyAgainst(d.Manifest))
	}
	// The launcher fills no placeholder: a legacy slot or a marker anywhere is refused.
	r.run(CheckSecretPlaceholders, d.MarkersErr)
	// Every bind with a host source has exactly one pin and every pin a
	// bind: the launcher stages binds only through their pins. A bundle
	// without pins.json (golden files: pins are host state) is not bound
	// to a host yet; the launcher refuses its binds.
	if _, ok := files[bundle.PinsFile]; ok {
		_, err := d.PinnedBinds()
		r.run(CheckPins, err)
	}
	r.run("egress-destinations", egressDestinations(d))
	r.run(CheckFSMonitor, fsmonitorServed(d))
	r.run(CheckSearch, searchServed(d))
	r.run(CheckGateway, gatewayNamed(d))
	r.run(CheckAuthFile, authFileBind(d))
	if d.SpecErr != nil {
		r.run(CheckDecode, d.SpecErr)
		return r
	}
	r.run(CheckDecode, nil)
	spec := d.Spec
	v, err := validate.NewValidator(spec, dir, false, "linux")
	if err != nil {
		r.run("runtime-tools", err)
		return r
	}
	r.run("runtime-tools/mandatory", v.CheckMandatoryFields())
	r.run("runtime-tools/semver", v.CheckSemVer())
	r.run("runtime-tools/platform", v.CheckPlatform())
	// CheckRoot is not run: it insists root.path is a child of the bundle
	// dir (bundle.md's container format), while config.md allows an
	// absolute path. The image rootfs is shared, versioned and read-only,
	// so it lives outside per-launch bundles; invariant/readonly-root
	// checks root instead.
	r.run("runtime-tools/mounts", v.CheckMounts())
	r.run("runtime-tools/process", v.CheckProcess())
	r.run("runtime-tools/linux", v.CheckLinux())
	r.run("runtime-tools/annotations", v.CheckAnnotations())
	r.run("runtime-tools/hooks", v.CheckHooks())
	if opts.SchemaDir != "" {
		r.run("json-schema", Schema(opts.SchemaDir, files[bundle.ConfigFile]))
	}
	for _, c := range invariants {
		r.run("invariant/"+c.name, c.check(spec, files))
	}
	return r
}

// Err is nil when nothing failed and otherwise one error naming every
// finding by its check.
func (r Result) Err() error {
	if r.OK() {
		return nil
	}
	msgs := make([]string, len(r.Findings))
	for i, f := range r.Findings {
		msgs[i] = f.Check + ": " + f.Detail
	}
	return errors.New(strings.Join(msgs, "; "))
}

// Failed returns the findings of the named check.
func (r Result) Failed(check string) []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

// CheckFSMonitor is the check that a bundle granting the workspace
// monitor can be served as granted.
const CheckFSMonitor = "fsmonitor"

// fsmonitorServed checks a granted workspace monitor against the rest of
// the bundle: network mode sandbox (it is served on the gateway), a port
// no route has, the process's cwd as the watched path, and the hook the
// sandbox's git runs (bound read-only at bundle.FSMonitorHookPath, named
// by core.fsmonitor) exactly the one for that port and path, and the
// vouched index's file compiled empty and bound read-only at
// bundle.FSMonitorIndexPath.
func fsmonitorServed(d Decoded) error {
	if d.Manifest == nil {
		return nil
	}
	var g *grant.FSMonitor
	for _, x := range d.Manifest.Grants {
		if m, ok := x.(grant.FSMonitor); ok && m.On {
			g = &m
		}
	}
	if g == nil {
		return nil
	}
	problems := onTheGateway(d, "the monitor", g.Port, nil)
	if d.Spec != nil {
		if d.Spec.Process == nil || d.Spec.Process.Cwd != g.Path {
			problems = append(problems, "the watched path is not the process's working directory")
		}
		if !boundReadOnly(d, bundle.FSMonitorHookPath, bundle.FSMonitorHookFile) {
			problems = append(problems, "the hook is not bound read-only at "+bundle.FSMonitorHookPath)
		}
		if !boundReadOnly(d, bundle.FSMonitorIndexPath, bundle.FSMonitorIndexFile) {
			problems = append(problems, "the vouched index is not bound read-only at "+bundle.FSMonitorIndexPath)
		}
	}
	// Compiled empty: only the launcher writes the run dir's copy.
	if data, ok := d.Files[bundle.FSMonitorIndexFile]; !ok || len(data) != 0 {
		problems = append(problems, bundle.FSMonitorIndexFile+" is not the empty file the launcher writes the vouched index over")
	}
	if !bytes.Equal(d.Files[bundle.FSMonitorHookFile], bundle.FSMonitorHook(bundle.GatewayName, g.Port, g.Path)) {
		problems = append(problems, bundle.FSMonitorHookFile+" is not the hook for the grant's port and path")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// CheckSearch is the check that a bundle granting the native search can
// be served as granted.
const CheckSearch = "search"

// searchServed checks a granted native search against the rest of the
// bundle: network mode sandbox (it is served on the gateway), a port no
// route and not the monitor has, the process's cwd as the searched
// workspace, the client (bundle.SearchClientFile) exactly the one for
// that port and workspace and bound read-only at bundle.SearchDir under
// each of bundle.SearchClientNames, the spool (bundle.SearchSpoolFile)
// empty and bound read-only at bundle.SearchSpoolPath, and the process's
// PATH starting with bundle.SearchDir, so the sandbox's rg is the client.
func searchServed(d Decoded) error {
	if d.Manifest == nil {
		return nil
	}
	var g *grant.Search
	ports := map[int]string{}
	for _, x := range d.Manifest.Grants {
		switch x := x.(type) {
		case grant.Search:
			if x.On {
				g = &x
			}
		case grant.FSMonitor:
			if x.On {
				ports[x.Port] = "the workspace monitor's"
			}
		}
	}
	if g == nil {
		return nil
	}
	problems := onTheGateway(d, "the search", g.Port, ports)
	if d.Spec != nil {
		if d.Spec.Process == nil || d.Spec.Process.Cwd != g.Path {
			problems = append(problems, "the searched workspace is not the process's working directory")
		}
		for _, n := range bundle.SearchClientNames {
			dest := bundle.SearchDir + "/" + n
			if !boundReadOnly(d, dest, bundle.SearchClientFile) {
				problems = append(problems, "the client is not bound read-only at "+dest)
			}
		}
		if !boundReadOnly(d, bundle.SearchSpoolPath, bundle.SearchSpoolFile) {
			problems = append(problems, "the spool is not bound read-only at "+bundle.SearchSpoolPath)
		}
		if d.Spec.Process != nil {
			// The first PATH is the one a program's getenv finds.
			i := slices.IndexFunc(d.Spec.Process.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") })
			if i < 0 || !strings.HasPrefix(d.Spec.Process.Env[i], "PATH="+bundle.SearchDir+":") {
				problems = append(problems, "PATH does not start with "+bundle.SearchDir)
			}
		}
	}
	if !bytes.Equal(d.Files[bundle.SearchClientFile], bundle.SearchClient(bundle.GatewayName, g.Port, g.Path)) {
		problems = append(problems, bundle.SearchClientFile+" is not the client for the grant's port and workspace")
	}
	if data, ok := d.Files[bundle.SearchSpoolFile]; !ok || len(data) != 0 {
		problems = append(problems, bundle.SearchSpoolFile+" is not the empty file the launcher's server writes cat's bytes into")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// onTheGateway is what every host service on the gateway (the monitor,
// the search) needs of the bundle: network mode sandbox, and its port
// neither a route's nor one of taken's (port -> whose).
func onTheGateway(d Decoded, what string, port int, taken map[int]string) []string {
	if d.Egress == nil || d.Egress.Mode != "sandbox" {
		return []string{what + " is served on the sandbox network's gateway, and the network mode is not sandbox"}
	}
	if slices.ContainsFunc(d.Egress.Routes, func(r bundle.Route) bool { return r.Port == port }) {
		return []string{fmt.Sprintf("port %d is a route's", port)}
	}
	if who, ok := taken[port]; ok {
		return []string{fmt.Sprintf("port %d is %s", port, who)}
	}
	return nil
}

// boundReadOnly says whether the spec binds the bundle file source
// read-only at dest.
func boundReadOnly(d Decoded, dest, source string) bool {
	return slices.ContainsFunc(d.Spec.Mounts, func(m specs.Mount) bool {
		return m.Destination == dest && m.Type == "bind" && m.Source == source && slices.Contains(m.Options, "ro")
	})
}

// CheckGateway is the check that a bundle names its gateway exactly when
// it serves something there.
const CheckGateway = "gateway"

// gatewayNamed checks egress.json's gateway: named, as the generated
// files name it (bundle.GatewayName), by a bundle that serves a route or
// the workspace monitor there, and by no other. A bundle compiled before
// the gateway was typed (its name only a comment in files/hosts) is
// refused here, never launched with its gateway unnamed.
func gatewayNamed(d Decoded) error {
	if d.Egress == nil {
		return nil // egress-destinations reports why
	}
	serves := len(d.Egress.Routes) > 0
	if d.Manifest != nil {
		serves = serves || slices.ContainsFunc(d.Manifest.Grants, func(g grant.Grant) bool {
			switch x := g.(type) {
			case grant.FSMonitor:
				return x.On
			case grant.Search:
				return x.On
			}
			return false
		})
	}
	switch gw := d.Egress.Gateway; {
	case serves && gw == nil:
		return errors.New("egress.json serves a route, the workspace monitor or the native search on the gateway and names no gateway (compile the bundle again)")
	case !serves && gw != nil:
		return errors.New("egress.json names a gateway and serves nothing there")
	case gw != nil && gw.Name != bundle.GatewayName:
		return fmt.Errorf("egress.json names the gateway %q, not %q, the name the generated files address it by", gw.Name, bundle.GatewayName)
	}
	return nil
}

// CheckAuthFile is the check that the auth.json bind is typed.
const CheckAuthFile = "authfile"

// authFileBind checks that the launcher can find the auth.json bind it
// locks by its type: at most one mount marked AuthFile, and no other
// read-write bind of an auth.json. A bundle compiled before the bind was
// typed is refused here, never launched without its lock.
func authFileBind(d Decoded) error {
	if d.Manifest == nil {
		return nil
	}
	n := 0
	for _, g := range d.Manifest.Grants {
		m, ok := g.(grant.Mount)
		switch {
		case !ok || !m.IsBind():
		case m.AuthFile:
			n++
		case !m.ReadOnly() && path.Base(m.Destination) == "auth.json":
			return fmt.Errorf("the read-write bind %s of an auth.json is not the auth.json bind the launcher locks (compile the bundle again)", m.Destination)
		}
	}
	if n > 1 {
		return errors.New("more than one mount is the auth.json bind")
	}
	return nil
}

// egressDestinations refuses an egress rule to a host the compiler would
// have refused (netdest): a hand-edited or foreign bundle.
func egressDestinations(d Decoded) error {
	if d.EgressErr != nil {
		return d.EgressErr
	}
	for _, rule := range d.Egress.Rules {
		if v := netdest.Host(rule.Host); v.Unsafe() {
			return fmt.Errorf("egress rule %s:%d: unsafe destination: %s", rule.Host, rule.Port, v.Why)
		}
	}
	// The model route's proxy dials its upstream from the host: the same
	// classes are refused there, and the key travels over TLS only.
	for _, r := range d.Egress.Routes {
		if r.Purpose != grant.RouteModel {
			continue
		}
		u, err := url.Parse(r.Upstream)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" {
			return fmt.Errorf("model route: the upstream must be an https URL")
		}
		if v := netdest.Host(u.Hostname()); v.Unsafe() {
			return fmt.Errorf("model route %s: unsafe destination: %s", u.Hostname(), v.Why)
		}
		// A login route's token endpoint is dialled from the host too,
		// with the refresh token.
		if r.LoginRefresh != "" {
			u, err := url.Parse(r.LoginRefresh)
			if err != nil || u.Scheme != "https" || u.Hostname() == "" {
				return fmt.Errorf("model route: the login's token endpoint must be an https URL")
			}
			if v := netdest.Host(u.Hostname()); v.Unsafe() {
				return fmt.Errorf("model route's token endpoint %s: unsafe destination: %s", u.Hostname(), v.Why)
			}
		}
	}
	return nil
}

// invariant is a property every paseo-policy bundle must have, whatever
// the compiler's version: these are what makes it a sandbox.
type invariant struct {
	name  string
	check func(s *specs.Spec, files bundle.Files) error
}

const (
	invariantNoHooks      = "no-hooks"
	invariantReadonlyRoot = "readonly-root"
)

var invariants = []invariant{
	{invariantNoHooks, func(s *specs.Spec, _ bundle.Files) error { return noHooks(s.Hooks) }},
	{invariantReadonlyRoot, func(s *specs.Spec, _ bundle.Files) error {
		if s.Root == nil || !s.Root.Readonly || !filepath.IsAbs(s.Root.Path) {
			return fmt.Errorf("root must be an absolute, read-only image rootfs")
		}
		return nil
	}},
	{"unprivileged", func(s *specs.Spec, _ bundle.Files) error {
		p := s.Process
		switch {
		case p == nil:
			return fmt.Errorf("process is missing")
		case p.User.UID == 0 || p.User.GID == 0:
			return fmt.Errorf("process runs as uid or gid 0")
		case !p.NoNewPrivileges:
			return fmt.Errorf("noNewPrivileges must be true")
		case p.Capabilities != nil && (len(p.Capabilities.Bounding)+len(p.Capabilities.Effective)+len(p.Capabilities.Permitted)+len(p.Capabilities.Inheritable)+len(p.Capabilities.Ambient)) > 0:
			return fmt.Errorf("capability sets must be empty")
		case len(p.User.AdditionalGids) > 0:
			return fmt.Errorf("no supplementary groups")
		}
		return nil
	}},
	{"namespaces", func(s *specs.Spec, _ bundle.Files) error {
		if s.Linux == nil {
			return fmt.Errorf("linux section is missing")
		}
		want := map[specs.LinuxNamespaceType]bool{specs.PIDNamespace: false, specs.IPCNamespace: false, specs.UTSNamespace: false, specs.MountNamespace: false, specs.NetworkNamespace: false}
		for _, ns := range s.Linux.Namespaces {
			if ns.Path != "" {
				return fmt.Errorf("namespace %s joins an existing namespace (%s); every namespace must be new", ns.Type, ns.Path)
			}
			want[ns.Type] = true
		}
		for t, seen := range want {
			if !seen {
				return fmt.Errorf("namespace %s is missing", t)
			}
		}
		return nil
	}},
	{"no-devices-sysctl", func(s *specs.Spec, _ bundle.Files) error {
		if s.Linux != nil && (len(s.Linux.Devices) > 0 || len(s.Linux.Sysctl) > 0 || s.Linux.Resources != nil && len(s.Linux.Resources.Devices) > 0) {
			return fmt.Errorf("no host devices, device rules or sysctls")
		}
		return nil
	}},
	{"limits", func(s *specs.Spec, _ bundle.Files) error {
		if s.Linux == nil {
			return fmt.Errorf("memory, pids and cpu limits are required")
		}
		r := s.Linux.Resources
		if r == nil || r.Memory == nil || r.Memory.Limit == nil || r.Pids == nil || r.CPU == nil || r.CPU.Quota == nil {
			return fmt.Errorf("memory, pids and cpu limits are required")
		}
		return nil
	}},
	{"no-gvisor-annotations", func(s *specs.Spec, _ bundle.Files) error {
		for k := range s.Annotations {
			if strings.HasPrefix(k, "dev.gvisor.") {
				return fmt.Errorf("annotation %s changes runsc behaviour; bundles carry none", k)
			}
		}
		return nil
	}},
	{"mounts", checkMounts},
}

var mountTypes = map[string]bool{"bind": true, "tmpfs": true, "proc": true, "sysfs": true, "devpts": true, "mqueue": true, "erofs": true}

func checkMounts(s *specs.Spec, files bundle.Files) error {
	var problems []string
	for _, m := range s.Mounts {
		if !mountTypes[m.Type] {
			problems = append(problems, fmt.Sprintf("%s: type %q is not one runsc supports here", m.Destination, m.Type))
		}
		has := map[string]bool{}
		for _, o := range m.Options {
			has[o] = true
		}
		if m.Type == "erofs" && (!filepath.IsAbs(m.Source) || !has["ro"] || !has["nosuid"] || !has["nodev"]) {
			problems = append(problems, fmt.Sprintf("%s: an EROFS image must be an absolute file mounted ro, nosuid, nodev", m.Destination))
		}
		if m.Type != "bind" {
			continue
		}
		if !has["bind"] || has["rbind"] || !(has["ro"] || has["rw"]) || !has["nosuid"] || !has["nodev"] {
			problems = append(problems, fmt.Sprintf("%s: binds must be non-recursive, nosuid, nodev, with explicit ro or rw", m.Destination))
		}
		if !filepath.IsAbs(m.Source) {
			if _, ok := files[m.Source]; !ok {
				problems = append(problems, fmt.Sprintf("%s: bundle-relative source %s is missing", m.Destination, m.Source))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return nil
}

// noHooks refuses an OCI config with a hooks object at all, even an empty
// one: hooks run on the host, outside the sandbox, and paseo bundles never
// contain them. Only hook kinds and counts are reported, never paths,
// arguments or environment.
func noHooks(h *specs.Hooks) error {
	if h == nil {
		return nil
	}
	counts := map[string]int{
		"prestart":        len(h.Prestart), //nolint:staticcheck // deprecated, still run by runtimes
		"createRuntime":   len(h.CreateRuntime),
		"createContainer": len(h.CreateContainer),
		"startContainer":  len(h.StartContainer),
		"poststart":       len(h.Poststart),
		"poststop":        len(h.Poststop),
	}
	var kinds []string
	for k, n := range counts {
		if n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
	}
	sort.Strings(kinds)
	if len(kinds) == 0 {
		return fmt.Errorf("%s has a hooks object (empty); hooks run on the host and are refused", bundle.ConfigFile)
	}
	return fmt.Errorf("%s has hooks (%s); hooks run on the host and are refused", bundle.ConfigFile, strings.Join(kinds, ", "))
}
