package compiler

import (
	"fmt"
	"math"
	"time"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/grant"
	"paseo.dev/paseo-policy/policy/schema"
)

// limitNames are the registry limits a profile may cap.
var limitNames = []string{"memoryBytes", "pids", "nproc", "nofile", "cpus", "tmpfsBytes", "outputBytes", "wallSeconds"}

// effectiveLimits takes the registry's limits and lowers each one a profile
// caps. A profile can narrow a limit, never widen it.
func (c *compilation) effectiveLimits() schema.Limits {
	l := c.reg.Limits
	for name, cap := range c.prof.Limits {
		fact := "profile." + c.prof.Name + ".limits." + name
		if cap <= 0 || cap != math.Trunc(cap) && name != "cpus" {
			c.diags.Addf(diag.ProfileInvalid, fact, "a limit cap must be a positive whole number")
			continue
		}
		switch name {
		case "memoryBytes":
			l.MemoryBytes = min(l.MemoryBytes, int64(cap))
		case "pids":
			l.Pids = min(l.Pids, int64(cap))
		case "nproc":
			l.Nproc = min(l.Nproc, uint64(cap))
		case "nofile":
			l.Nofile = min(l.Nofile, uint64(cap))
		case "cpus":
			l.CPUs = min(l.CPUs, cap)
		case "tmpfsBytes":
			l.TmpfsBytes = min(l.TmpfsBytes, int64(cap))
		case "outputBytes":
			l.OutputBytes = min(l.OutputBytes, int64(cap))
		case "wallSeconds":
			l.WallSeconds = min(l.WallSeconds, int64(cap))
		default:
			c.diags.Addf(diag.ProfileInvalid, fact, "unknown limit; known: %v", limitNames)
		}
	}
	return l
}

// limitFact names where an effective limit came from.
func (c *compilation) limitFact(name string) string {
	if _, capped := c.prof.Limits[name]; capped {
		return fmt.Sprintf("registry.limits.%s,profile.%s.limits.%s", name, c.prof.Name, name)
	}
	return "registry.limits." + name
}

func (c *compilation) resources(p *grant.Plan) {
	l := c.limits
	p.Add(grant.Rlimit{Type: "RLIMIT_CORE", Max: 0, Provenance: why("no core dumps of a process that holds a credential", "profile."+c.prof.Name)})
	p.Add(grant.Rlimit{Type: "RLIMIT_NOFILE", Max: l.Nofile, Provenance: why("open files per process", c.limitFact("nofile"))})
	p.Add(grant.Rlimit{Type: "RLIMIT_NPROC", Max: l.Nproc, Provenance: why("processes per user inside the sandbox", c.limitFact("nproc"))})
	p.Add(grant.CgroupMax{Resource: "memory", Max: l.MemoryBytes, Provenance: why("memory including swap", c.limitFact("memoryBytes"))})
	p.Add(grant.CgroupMax{Resource: "pids", Max: l.Pids, Provenance: why("host tasks of the sandbox (the Sentry's and gofer's threads, systrap stubs), which bounds Pi's children only indirectly", c.limitFact("pids"))})
	p.Add(grant.CPUQuota{CPUs: l.CPUs, Provenance: why("CPUs, as quota over a 100ms period", c.limitFact("cpus"))})
	p.Add(grant.OutputLimit{Bytes: l.OutputBytes, Provenance: why("stdout and stderr together; the launcher ends the sandbox when they pass this", c.limitFact("outputBytes"))})
	p.Add(grant.WallLimit{Wall: time.Duration(l.WallSeconds) * time.Second, Provenance: why("the launcher tears the sandbox down after this long", c.limitFact("wallSeconds"))})
}
