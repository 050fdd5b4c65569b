package probe

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// Filesystem probes. Paths are built with string concatenation, not
// path.Join, wherever they contain "..": Join would clean the ".." away
// lexically and the kernel's (or gVisor's) resolution of it is exactly
// what is under test.

// depth is the number of components of an absolute path: how many ".."
// it takes to climb from it to "/".
func depth(p string) int {
	p = path.Clean(p)
	if p == "/" {
		return 0
	}
	return strings.Count(p, "/")
}

// climb returns dir followed by enough "/.." to reach "/" from it; inside
// a sandbox the climb stops at the sandbox root, on the host it reaches
// the host root.
func climb(dir string) string {
	return strings.TrimSuffix(dir, "/") + strings.Repeat("/..", depth(dir))
}

// dotdotPath addresses outside through the workspace's "..": the short
// form "<ws>/../<outside base>" when the two are siblings (the layout the
// harness uses), else a full climb to "/" followed by outside.
func dotdotPath(ws, outside string) string {
	if path.Dir(path.Clean(ws)) == path.Dir(path.Clean(outside)) {
		return strings.TrimSuffix(ws, "/") + "/../" + path.Base(outside)
	}
	return climb(ws) + path.Clean(outside)
}

// writeOutsideAbsolute creates a file in Outside by its absolute path: the
// plainest escape, blocked when Outside is simply not mounted.
func writeOutsideAbsolute(c Config) outcome {
	if c.Outside == "" {
		return notConfigured("outside")
	}
	return writeEscape(c.Outside+"/"+uniqueName("paseo-probe-"), "in -outside")
}

// writeDotdot reaches Outside from the workspace with "..": blocked when
// the workspace is a bind mount whose parent is the sandbox's, not the
// host's.
func writeDotdot(c Config) outcome {
	if c.Workspace == "" || c.Outside == "" {
		return notConfigured("workspace/-outside")
	}
	return writeEscape(dotdotPath(c.Workspace, c.Outside)+"/"+uniqueName("paseo-probe-"), "in -outside via workspace/..")
}

// writeSymlink plants a symlink to Outside inside the workspace and writes
// through it. The symlink is resolved by the sandbox, so it must land in
// the sandbox's view, where Outside does not exist.
func writeSymlink(c Config) outcome {
	if c.Workspace == "" || c.Outside == "" {
		return notConfigured("workspace/-outside")
	}
	link := c.Workspace + "/" + uniqueName("paseo-probe-link-")
	if err := os.Symlink(c.Outside, link); err != nil {
		// The vector was not tried, so this is no proof of a block.
		return outcome{Inconclusive, "could not plant the symlink in the workspace: " + errText(err)}
	}
	defer os.Remove(link)
	return writeEscape(link+"/"+uniqueName("paseo-probe-"), "in -outside through a workspace symlink")
}

// readOutside lists Outside. A listing with entries is an escape; an empty
// directory proves nothing, since the sandbox may have its own empty
// directory at that path (the harness should plant a file in Outside).
func readOutside(c Config) outcome {
	if c.Outside == "" {
		return notConfigured("outside")
	}
	f, err := os.Open(c.Outside)
	if err != nil {
		return outcome{Blocked, errText(err)}
	}
	defer f.Close()
	names, err := f.Readdirnames(64)
	switch {
	case len(names) > 0:
		return outcome{Escaped, fmt.Sprintf("listed %d entries of -outside", len(names))}
	case err == nil || errors.Is(err, io.EOF):
		return outcome{Inconclusive, "-outside opened but empty: cannot tell it from a sandbox-local directory"}
	default:
		return outcome{Blocked, "opened but not listable: " + errText(err)}
	}
}

// eachCanary applies read to every canary and combines the results.
func eachCanary(c Config, read func(canary string) outcome) outcome {
	labels := make([]string, len(c.Canaries))
	outs := make([]outcome, len(c.Canaries))
	for i, canary := range c.Canaries {
		labels[i] = fmt.Sprintf("canary %d", i)
		outs[i] = read(canary)
	}
	return combine(labels, outs)
}

// readProc1Root reads the canaries through /proc/1/root, the root of
// whatever pid 1 is: on a host that is the host's root, in a sandbox it
// must be the sandbox's own root.
func readProc1Root(c Config) outcome { return readProcRoot(1, c) }

// readHostPIDRoot reads the canaries through /proc/<host pid>/root: a host
// process's view of the host tree. Hosts where pid 1 is not even readable
// by root (some VM inits) still prove this vector with a process the
// harness owns.
func readHostPIDRoot(c Config) outcome {
	if c.HostPID == 0 {
		return notConfigured("host-pid")
	}
	return readProcRoot(c.HostPID, c)
}

// readProcRoot reads the canaries through /proc/<pid>/root.
func readProcRoot(pid int, c Config) outcome {
	if len(c.Canaries) == 0 {
		return notConfigured("canaries")
	}
	root := fmt.Sprintf("/proc/%d/root", pid)
	return eachCanary(c, func(canary string) outcome {
		data, err := readHead(root + path.Clean(canary))
		return canaryOutcome(data, err, c.CanaryMarker)
	})
}

// readCwdDotdot makes the workspace the working directory and climbs out
// of it through the /proc/self/cwd magic link, which a naive
// implementation resolves against the host's tree.
func readCwdDotdot(c Config) outcome {
	if c.Workspace == "" || len(c.Canaries) == 0 {
		return notConfigured("workspace/-canaries")
	}
	if old, err := os.Getwd(); err == nil {
		defer os.Chdir(old) // the process-wide cwd is shared with later probes
	}
	if err := os.Chdir(c.Workspace); err != nil {
		return outcome{Inconclusive, "could not chdir to the workspace: " + errText(err)}
	}
	up := "/proc/self/cwd" + strings.Repeat("/..", depth(c.Workspace))
	return eachCanary(c, func(canary string) outcome {
		data, err := readHead(up + path.Clean(canary))
		return canaryOutcome(data, err, c.CanaryMarker)
	})
}

// readCanary reads a canary by its host path: escapes when the host file
// is mounted or copied into the sandbox.
func readCanary(canary, marker string) outcome {
	data, err := readHead(canary)
	return canaryOutcome(data, err, marker)
}

// writeRootfs creates a file in /etc. Under a read-only root this is
// EROFS. A unique name (not a fixed /etc/paseo-probe) keeps a leftover or
// a real file from being mistaken for, or clobbered by, the probe.
func writeRootfs() outcome {
	return writeEscape("/etc/"+uniqueName("paseo-probe-"), "in /etc")
}

// workspaceWritable is the positive check: the policy grants the workspace
// read-write, and a sandbox that blocks it is broken in the other way.
func workspaceWritable(c Config) outcome {
	if c.Workspace == "" {
		return notConfigured("workspace")
	}
	p := c.Workspace + "/" + uniqueName("paseo-probe-ws-")
	want := []byte(probeLine)
	created, err := createFile(p)
	if !created {
		return outcome{Unreachable, "create: " + errText(err)}
	}
	defer os.Remove(p)
	if err != nil {
		return outcome{Unreachable, "write: " + errText(err)}
	}
	got, err := os.ReadFile(p)
	switch {
	case err != nil:
		return outcome{Unreachable, "read back: " + errText(err)}
	case !bytes.Equal(got, want):
		return outcome{Unreachable, fmt.Sprintf("read back %d bytes that differ from the %d written", len(got), len(want))}
	}
	return outcome{Reachable, fmt.Sprintf("created, read back and removed a %d-byte file", len(got))}
}
