package grant

import (
	"errors"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// CPUPeriod is the CFS period a CPU grant's quota is measured against.
const CPUPeriod = 100 * time.Millisecond

// Rlimit is a POSIX rlimit, hard = soft.
type Rlimit struct {
	Type string // RLIMIT_*
	Max  uint64
	Provenance
}

func (Rlimit) Kind() Kind        { return KindRlimit }
func (g Rlimit) Subject() string { return g.Type }
func (g Rlimit) Key() string     { return key(g) }
func (Rlimit) Access() Access    { return Max }
func (Rlimit) Restricts() bool   { return true }
func (g Rlimit) Against(old Grant) Direction {
	return bound(old.(Rlimit).Max < g.Max)
}
func (g Rlimit) Apply(s *specs.Spec) error {
	p := process(s)
	p.Rlimits = append(p.Rlimits, specs.POSIXRlimit{Type: g.Type, Hard: g.Max, Soft: g.Max})
	return nil
}
func (g Rlimit) Validate() error {
	if !strings.HasPrefix(g.Type, "RLIMIT_") {
		return errors.New("rlimit type must be RLIMIT_*")
	}
	return nil
}

// CgroupMax bounds one cgroup resource by a count: memory (bytes, swap
// included) or pids.
type CgroupMax struct {
	Resource string // memory | pids
	Max      int64
	Provenance
}

func (CgroupMax) Kind() Kind        { return KindCgroup }
func (g CgroupMax) Subject() string { return g.Resource }
func (g CgroupMax) Key() string     { return key(g) }
func (CgroupMax) Access() Access    { return Max }
func (CgroupMax) Restricts() bool   { return true }
func (g CgroupMax) Against(old Grant) Direction {
	return bound(old.(CgroupMax).Max < g.Max)
}
func (g CgroupMax) Apply(s *specs.Spec) error {
	if err := g.Validate(); err != nil {
		return err
	}
	r := resources(s)
	n := g.Max
	switch g.Resource {
	case "memory":
		r.Memory = &specs.LinuxMemory{Limit: &n, Swap: &n}
	case "pids":
		r.Pids = &specs.LinuxPids{Limit: &n}
	}
	return nil
}
func (g CgroupMax) Validate() error {
	if g.Resource != "memory" && g.Resource != "pids" {
		return errors.New("unknown cgroup resource")
	}
	if g.Max <= 0 {
		return errors.New("a cgroup bound must be positive")
	}
	return nil
}

// CPUQuota bounds the sandbox's CPU time: CPUs × CPUPeriod of quota per
// period, truncated to a microsecond.
type CPUQuota struct {
	CPUs float64
	Provenance
}

func (CPUQuota) Kind() Kind      { return KindCgroup }
func (CPUQuota) Subject() string { return "cpu" }
func (g CPUQuota) Key() string   { return key(g) }
func (CPUQuota) Access() Access  { return Max }
func (CPUQuota) Restricts() bool { return true }
func (g CPUQuota) Against(old Grant) Direction {
	return bound(old.(CPUQuota).CPUs < g.CPUs)
}
func (g CPUQuota) Apply(s *specs.Spec) error {
	if err := g.Validate(); err != nil {
		return err
	}
	period := uint64(CPUPeriod.Microseconds())
	quota := int64(g.CPUs * float64(period))
	resources(s).CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	return nil
}
func (g CPUQuota) Validate() error {
	if !(g.CPUs > 0) || g.CPUs > 1<<20 {
		return errors.New("cpus must be a positive number")
	}
	return nil
}

// OutputLimit bounds stdout and stderr together; the launcher ends the
// sandbox when they pass it.
type OutputLimit struct {
	Bytes int64
	Provenance
}

func (OutputLimit) Kind() Kind      { return KindLimit }
func (OutputLimit) Subject() string { return "outputBytes" }
func (g OutputLimit) Key() string   { return key(g) }
func (OutputLimit) Access() Access  { return Max }
func (OutputLimit) Restricts() bool { return true }
func (g OutputLimit) Against(old Grant) Direction {
	return bound(old.(OutputLimit).Bytes < g.Bytes)
}
func (OutputLimit) Apply(*specs.Spec) error { return nil }
func (g OutputLimit) Validate() error {
	if g.Bytes <= 0 {
		return errors.New("the output limit must be positive")
	}
	return nil
}

// WallLimit is how long the launcher lets the sandbox run. It is encoded
// in whole seconds (its subject stays wallSeconds).
type WallLimit struct {
	Wall time.Duration
	Provenance
}

func (WallLimit) Kind() Kind      { return KindLimit }
func (WallLimit) Subject() string { return "wallSeconds" }
func (g WallLimit) Key() string   { return key(g) }
func (WallLimit) Access() Access  { return Max }
func (WallLimit) Restricts() bool { return true }
func (g WallLimit) Against(old Grant) Direction {
	return bound(old.(WallLimit).Wall < g.Wall)
}
func (WallLimit) Apply(*specs.Spec) error { return nil }
func (g WallLimit) Validate() error {
	if g.Wall <= 0 || g.Wall%time.Second != 0 {
		return errors.New("the wall limit must be a positive whole number of seconds")
	}
	return nil
}

func resources(s *specs.Spec) *specs.LinuxResources {
	l := linux(s)
	if l.Resources == nil {
		l.Resources = &specs.LinuxResources{}
	}
	return l.Resources
}

// bound classifies a changed upper bound: raised widens, else narrows.
func bound(raised bool) Direction {
	if raised {
		return Widened
	}
	return Narrowed
}
