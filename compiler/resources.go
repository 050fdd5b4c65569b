package compiler

import (
	"fmt"
	"math"
	"strconv"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/grant"
	"paseo.dev/paseo-policy/schema"
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
	i64 := func(n int64) string { return strconv.FormatInt(n, 10) }
	u64 := func(n uint64) string { return strconv.FormatUint(n, 10) }
	p.Add(grant.Grant{Kind: grant.Rlimit, Subject: "RLIMIT_CORE", Access: grant.Max, Value: "0", Reason: "no core dumps of a process that holds a credential", Fact: "profile." + c.prof.Name})
	p.Add(grant.Grant{Kind: grant.Rlimit, Subject: "RLIMIT_NOFILE", Access: grant.Max, Value: u64(l.Nofile), Reason: "open files per process", Fact: c.limitFact("nofile")})
	p.Add(grant.Grant{Kind: grant.Rlimit, Subject: "RLIMIT_NPROC", Access: grant.Max, Value: u64(l.Nproc), Reason: "processes per user inside the sandbox", Fact: c.limitFact("nproc")})
	p.Add(grant.Grant{Kind: grant.Cgroup, Subject: "memory", Access: grant.Max, Value: i64(l.MemoryBytes), Reason: "memory including swap", Fact: c.limitFact("memoryBytes")})
	p.Add(grant.Grant{Kind: grant.Cgroup, Subject: "pids", Access: grant.Max, Value: i64(l.Pids), Reason: "tasks in the sandbox; Pi, bash and MCP children included", Fact: c.limitFact("pids")})
	p.Add(grant.Grant{Kind: grant.Cgroup, Subject: "cpu", Access: grant.Max, Value: strconv.FormatFloat(l.CPUs, 'f', -1, 64), Reason: "CPUs, as quota over a 100ms period", Fact: c.limitFact("cpus")})
	p.Add(grant.Grant{Kind: grant.Limit, Subject: "outputBytes", Access: grant.Max, Value: i64(l.OutputBytes), Reason: "stdout and stderr together; the launcher ends the sandbox when they pass this", Fact: c.limitFact("outputBytes")})
	p.Add(grant.Grant{Kind: grant.Limit, Subject: "wallSeconds", Access: grant.Max, Value: i64(l.WallSeconds), Reason: "the launcher tears the sandbox down after this long", Fact: c.limitFact("wallSeconds")})
}
