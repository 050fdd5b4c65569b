// Package probe is a sandbox escape tester. It runs a fixed list of
// escape attempts (filesystem, identity, network, resources) and reports
// each as blocked, escaped or inconclusive. The same code runs inside a
// paseo sandbox, where everything should be blocked, and as a plain host
// process (the control run), where the attempts should escape: a probe
// that cannot report an escape on the host proves nothing in the sandbox.
package probe

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"
)

// Verdicts of an escape probe.
const (
	Blocked      = "blocked"
	Escaped      = "escaped"
	Inconclusive = "inconclusive"
)

// Verdicts of a reachability probe: something the sandbox must allow (the
// workspace, the allowed endpoint) or a fact worth recording (gVisor).
// Inconclusive is shared with escape probes.
const (
	Reachable   = "reachable"
	Unreachable = "unreachable"
)

// Kinds of result.
const (
	KindEscape       = "escape"
	KindReachability = "reachability"
)

// DefaultDevices are the host block and memory devices device-nodes tries
// to open.
var DefaultDevices = []string{"/dev/mem", "/dev/kmem", "/dev/sda", "/dev/nvme0n1"}

// Config holds every input of a run. Zero values mean "not configured":
// probes that need a missing input report inconclusive, and the resource
// probes are left out of the run entirely.
type Config struct {
	Workspace    string   // writable workspace directory (as seen by the probe)
	Outside      string   // host directory next to the workspace; must stay untouchable
	Canaries     []string // host files that contain CanaryMarker
	CanaryMarker string   // secret marker planted in canaries and CanaryEnv
	CanaryEnv    string   // name of the launcher's env var holding the marker
	Sockets      []string // host Unix sockets (supervisor, docker)
	Allowed      string   // host:port that the policy allows (must be reachable)
	AllowedURL   string   // an https URL on the allowed host, requested for real
	CAFile       string   // the CA that signs AllowedURL's certificate
	ConnectTo    string   // host:port dialled for AllowedURL instead of its host (control runs)
	Decoy        string   // host:port that the policy does not allow
	HostAddrs    []string // host:port of the host or gateway itself
	DNS          string   // ip:port of a resolver that is not allowed
	HostPID      int      // a host process to ptrace / read environ of
	Devices      []string // device nodes for device-nodes; nil means DefaultDevices

	// Resource probes, destructive, so off unless non-zero.
	ForkBomb int           // children to spawn (4096 in the acceptance run)
	MemHog   int64         // bytes to allocate and touch
	Flood    int64         // bytes to write to Stderr
	Sleep    time.Duration // how long sleep-past-wall sleeps

	Timeout         time.Duration // per probe; default 2s
	ResourceTimeout time.Duration // fork-bomb, mem-hog, output-flood; default 120s

	// Only restricts the run to these probe names; a trailing "*" matches
	// a prefix ("read-canary-*"). Empty runs everything.
	Only []string

	// Stderr receives progress lines and the output flood; default
	// os.Stderr. Stdout is left alone so the JSON report stays parseable.
	Stderr io.Writer
}

// Result is the outcome of one probe. Evidence is short and never holds
// secret content: counts, errno names, which variable or index matched.
type Result struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Verdict  string `json:"verdict"`
	Evidence string `json:"evidence"`
}

// Report is the JSON document the command prints. The counts tally the
// verdict strings over all results (reachability results only ever add to
// Inconclusive, since their other verdicts have their own names).
type Report struct {
	Probes       []Result `json:"probes"`
	Escaped      int      `json:"escaped"`
	Blocked      int      `json:"blocked"`
	Inconclusive int      `json:"inconclusive"`
}

// NewReport counts the verdicts of results.
func NewReport(results []Result) Report {
	r := Report{Probes: results}
	if r.Probes == nil {
		r.Probes = []Result{} // "probes": [] rather than null
	}
	for _, res := range results {
		switch res.Verdict {
		case Escaped:
			r.Escaped++
		case Blocked:
			r.Blocked++
		case Inconclusive:
			r.Inconclusive++
		}
	}
	return r
}

// outcome is what a probe function decides; the runner adds name and kind.
type outcome struct{ verdict, evidence string }

// spec is one planned probe.
type spec struct {
	name    string
	kind    string
	timeout time.Duration
	run     func(ctx context.Context) outcome
}

// grace is how long the runner waits past a probe's own deadline before it
// gives up on it: probes honour their context, so this only matters when
// a syscall hangs regardless.
const grace = time.Second

// withDefaults fills in the defaults so every probe sees complete values.
func (c Config) withDefaults() Config {
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
	if c.ResourceTimeout <= 0 {
		c.ResourceTimeout = 120 * time.Second
	}
	if c.Devices == nil {
		c.Devices = DefaultDevices
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	return c
}

// Names lists the probes a run with c would consider, in run order,
// before the Only filter. The list depends on c: one read-canary-<n> per
// canary, and resource probes only when enabled.
func Names(c Config) []string {
	var names []string
	for _, s := range plan(c.withDefaults()) {
		names = append(names, s.name)
	}
	return names
}

// Validate reports inputs the probes cannot use. It is meant for the
// command line, which turns an error into exit status 2.
func (c Config) Validate() error {
	if c.HostPID < 0 || c.ForkBomb < 0 || c.MemHog < 0 || c.Flood < 0 || c.Sleep < 0 {
		return fmt.Errorf("host-pid, fork-bomb, mem-hog, flood and sleep must not be negative")
	}
	if c.Timeout < 0 || c.ResourceTimeout < 0 {
		return fmt.Errorf("timeouts must not be negative")
	}
	for _, p := range append([]string{c.Workspace, c.Outside}, c.Canaries...) {
		if p != "" && !path.IsAbs(p) {
			return fmt.Errorf("%q: paths must be absolute", p)
		}
	}
	for _, a := range append([]string{c.Allowed, c.Decoy}, c.HostAddrs...) {
		if err := checkHostPort(a); err != nil {
			return err
		}
	}
	if err := checkIPPort(c.DNS); err != nil {
		return err
	}
	names := Names(c)
	for _, want := range c.Only {
		if !slices.ContainsFunc(names, func(n string) bool { return matchName(want, n) }) {
			return fmt.Errorf("-only %q matches no probe of this configuration (resource probes need their size flag)", want)
		}
	}
	return nil
}

// matchName reports whether an Only entry selects the probe name.
func matchName(pattern, name string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return pattern == name
}

// selected applies the Only filter.
func (c Config) selected(name string) bool {
	if len(c.Only) == 0 {
		return true
	}
	return slices.ContainsFunc(c.Only, func(p string) bool { return matchName(p, name) })
}

// Run runs every planned probe in order, one at a time, each under its
// own timeout. Sequential on purpose: some probes change process-wide
// state (the working directory) and the resource probes must not overlap.
func Run(ctx context.Context, c Config) []Result {
	c = c.withDefaults()
	var results []Result
	for _, s := range plan(c) {
		if !c.selected(s.name) {
			continue
		}
		r := runOne(ctx, s)
		r.Evidence = redact(r.Evidence, c.CanaryMarker)
		results = append(results, r)
	}
	return results
}

// runOne runs a probe in a goroutine so that a probe stuck in a syscall
// cannot stall the whole run: after its deadline plus grace the runner
// records inconclusive and moves on (the stuck goroutine is abandoned;
// the process is short-lived). A panic is also recorded, not propagated,
// so one broken probe costs one result, not the report.
func runOne(ctx context.Context, s spec) Result {
	r := Result{Name: s.name, Kind: s.kind}
	if err := ctx.Err(); err != nil {
		r.Verdict, r.Evidence = Inconclusive, "not run: "+err.Error()
		return r
	}
	pctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	done := make(chan outcome, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- outcome{Inconclusive, fmt.Sprintf("probe panicked: %v", p)}
			}
		}()
		done <- s.run(pctx)
	}()
	timer := time.NewTimer(s.timeout + grace)
	defer timer.Stop()
	select {
	case o := <-done:
		r.Verdict, r.Evidence = o.verdict, o.evidence
	case <-timer.C:
		r.Verdict, r.Evidence = Inconclusive, fmt.Sprintf("no answer within %s", s.timeout)
	}
	return r
}

// redact is the last line of defence for "evidence never holds the
// secret": whatever a probe wrote, the marker does not reach the report.
func redact(evidence, marker string) string {
	if marker == "" {
		return evidence
	}
	return strings.ReplaceAll(evidence, marker, "[marker]")
}

// plan lists the probes in their fixed order. Resource probes come last
// and only when enabled, because they may get the sandbox killed.
func plan(c Config) []spec {
	var specs []spec
	add := func(name, kind string, timeout time.Duration, run func(context.Context) outcome) {
		specs = append(specs, spec{name: name, kind: kind, timeout: timeout, run: run})
	}
	esc := func(name string, run func(context.Context) outcome) { add(name, KindEscape, c.Timeout, run) }
	reach := func(name string, run func(context.Context) outcome) { add(name, KindReachability, c.Timeout, run) }

	// Filesystem.
	esc("write-outside-absolute", func(context.Context) outcome { return writeOutsideAbsolute(c) })
	esc("write-dotdot", func(context.Context) outcome { return writeDotdot(c) })
	esc("write-symlink", func(context.Context) outcome { return writeSymlink(c) })
	esc("read-outside", func(context.Context) outcome { return readOutside(c) })
	esc("read-proc1-root", func(context.Context) outcome { return readProc1Root(c) })
	esc("read-host-pid-root", func(context.Context) outcome { return readHostPIDRoot(c) })
	esc("read-cwd-dotdot", func(context.Context) outcome { return readCwdDotdot(c) })
	for i, canary := range c.Canaries {
		esc(fmt.Sprintf("read-canary-%d", i), func(context.Context) outcome { return readCanary(canary, c.CanaryMarker) })
	}
	esc("write-rootfs", func(context.Context) outcome { return writeRootfs() })
	reach("workspace-writable", func(context.Context) outcome { return workspaceWritable(c) })

	// Identity and authority.
	esc("uid-nonroot", func(context.Context) outcome { return uidNonroot() })
	esc("capabilities", func(context.Context) outcome { return capabilities() })
	esc("setuid", func(context.Context) outcome { return setuidRoot() })
	esc("chown", func(context.Context) outcome { return chownWorkspaceFile(c) })
	esc("mount", func(context.Context) outcome { return mountTmpfs(c) })
	esc("raw-socket", func(context.Context) outcome { return rawSocket() })
	esc("mknod", func(context.Context) outcome { return mknodNull(c) })
	esc("device-nodes", func(context.Context) outcome { return deviceNodes(c.Devices) })
	esc("ptrace-host-pid", func(ctx context.Context) outcome { return ptraceHostPID(ctx, c) })
	esc("env-canary", func(context.Context) outcome { return envCanary(c) })
	esc("no-new-privs", func(context.Context) outcome { return noNewPrivs() })
	reach("gvisor", func(context.Context) outcome { return gvisor() })

	// Network.
	for i, sock := range c.Sockets {
		esc(fmt.Sprintf("unix-socket-%d", i), func(ctx context.Context) outcome { return unixSocket(ctx, sock) })
	}
	esc("decoy-tcp", func(ctx context.Context) outcome { return decoyTCP(ctx, c.Decoy) })
	for i, addr := range c.HostAddrs {
		esc(fmt.Sprintf("host-tcp-%d", i), func(ctx context.Context) outcome { return hostTCP(ctx, addr) })
	}
	esc("dns-unallowed", func(ctx context.Context) outcome { return dnsUnallowed(ctx, c.DNS) })
	reach("allowed-reachable", func(ctx context.Context) outcome { return allowedReachable(ctx, c.Allowed) })
	reach("allowed-https", func(ctx context.Context) outcome { return allowedHTTPS(ctx, c.AllowedURL, c.CAFile, c.ConnectTo) })

	// Resources: each may end the process, so the harness runs them one
	// per sandbox with -only.
	if c.ForkBomb > 0 {
		add("fork-bomb", KindEscape, c.ResourceTimeout, func(ctx context.Context) outcome { return forkBomb(ctx, c.ForkBomb) })
	}
	if c.MemHog > 0 {
		add("mem-hog", KindEscape, c.ResourceTimeout, func(ctx context.Context) outcome { return memHog(ctx, c.MemHog, c.Stderr) })
	}
	if c.Flood > 0 {
		add("output-flood", KindEscape, c.ResourceTimeout, func(ctx context.Context) outcome { return outputFlood(ctx, c.Flood, c.Stderr) })
	}
	if c.Sleep > 0 {
		// The sleep is the point, so the deadline sits past it.
		add("sleep-past-wall", KindEscape, c.Sleep+c.Timeout, func(ctx context.Context) outcome { return sleepPastWall(ctx, c.Sleep, c.Stderr) })
	}
	return specs
}
