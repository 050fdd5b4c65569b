package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher/mounts"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// The memory cgroup and out-of-memory reports
//
// Over its memory limit the kernel OOM-kills the sandbox's sentry, which
// ends the whole sandbox; the agent's exit status (137) does not say why.
// The kernel's count of OOM kills in the container's memory cgroup does,
// but `runsc run` removes the cgroups it created before it returns. So on
// cgroup v1 the launcher creates the memory cgroup itself and writes the
// compiled limit into it (runsc leaves a pre-created controller to its
// creator and only joins the sandbox to it), reads the OOM count after the
// sandbox ends, and removes the cgroup at teardown. On cgroup v2 runsc
// creates and limits every controller itself and the launcher polls the
// count while the sandbox runs.

type memoryCgroup struct {
	dir string // v1 memory controller dir of the container
}

// prepareMemoryCgroup creates the v1 memory cgroup of id with limit bytes
// (memory and memory+swap, so swap cannot extend it). It returns nil on
// hosts without a v1 memory hierarchy.
func prepareMemoryCgroup(id string, limit int64) (*memoryCgroup, error) {
	root := ""
	for _, m := range mounts.Cgroups() {
		if filepath.Base(m) == "memory" {
			if _, err := os.Stat(filepath.Join(m, "memory.limit_in_bytes")); err == nil {
				root = m
			}
		}
	}
	if root == "" || limit <= 0 {
		return nil, nil
	}
	dir := filepath.Join(root, statedir.CgroupsPath(id))
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("memory cgroup %s: %w (is the id in use?)", dir, err)
	}
	cg := &memoryCgroup{dir: dir}
	v := strconv.FormatInt(limit, 10)
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(v), 0o644); err != nil {
		return nil, errors.Join(fmt.Errorf("memory limit: %w", err), cg.remove())
	}
	// Absent when swap accounting is off; then there is no swap to limit.
	if err := os.WriteFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), []byte(v), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, errors.Join(fmt.Errorf("memory+swap limit: %w", err), cg.remove())
	}
	return cg, nil
}

func (c *memoryCgroup) oomKills() uint64 { return oomKillsIn(c.dir) }

// remove removes the cgroup; one already gone is fine, one that still
// holds a process (EBUSY) is reported.
func (c *memoryCgroup) remove() error {
	if err := unix.Rmdir(c.dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing %s: %w", c.dir, err)
	}
	return nil
}

// oomKillsIn reads "oom_kill N" from a cgroup dir: memory.oom_control on
// v1 (kernel >= 4.13), memory.events on v2.
func oomKillsIn(dir string) uint64 {
	var total uint64
	for _, name := range []string{"memory.oom_control", "memory.events"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				total += n
			}
		}
	}
	return total
}

// oomKills counts OOM kills of container id in every hierarchy it can see,
// for hosts where runsc owns the cgroup (v2): valid only while it exists.
func oomKills(id string) uint64 {
	var total uint64
	for _, m := range mounts.Cgroups() {
		total += oomKillsIn(filepath.Join(m, statedir.CgroupsPath(id)))
	}
	return total
}

// pollOOM records the container's OOM kill count while it runs, for hosts
// where runsc owns (and on exit removes) the memory cgroup.
func pollOOM(id string, exited <-chan struct{}, n *atomic.Uint64) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if k := oomKills(id); k > n.Load() {
			n.Store(k)
		}
		select {
		case <-t.C:
		case <-exited:
			return
		}
	}
}
