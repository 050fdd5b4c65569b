package launcher

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher/mounts"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// The compiled limits reach the kernel: while the sandbox runs, its
// cgroups as the host sees them carry the registry's memory, CPU and pids
// limits (runsc applies them only because the launcher sets a cgroups
// path; without one the spec's resources are silently ignored).
func TestCgroupLimitsApplied(t *testing.T) {
	s := compileScript(t, "echo up; /bin/busybox sleep 60", `{"limits":{"memoryBytes":268435456,"cpus":1,"pids":300}}`)
	out := newLineWaiter("up")
	done := make(chan error, 1)
	go func() {
		_, err := Launch(context.Background(), Options{BundleDir: s.bundle, StateRoot: s.state, RunscPath: s.runsc,
			ID: "limits", Secrets: staticSecret("v"), Stdin: strings.NewReader(""), Stdout: out})
		done <- err
	}()
	out.wait(t, 30*time.Second)
	want := map[string]string{
		"memory/memory.limit_in_bytes": "268435456",
		"cpu/cpu.cfs_quota_us":         "100000",
		"cpu/cpu.cfs_period_us":        "100000",
		"pids/pids.max":                "300",
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		want = map[string]string{"memory.max": "268435456", "cpu.max": "100000 100000", "pids.max": "300"} // cgroup v2
	}
	for file, v := range want {
		dir, name := filepath.Split(file)
		p := filepath.Join("/sys/fs/cgroup", dir, statedir.CgroupsPath("limits"), name)
		got, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(got)) != v {
			t.Errorf("%s = %q (%v), want %s", p, strings.TrimSpace(string(got)), err, v)
		}
	}
	if err := s.inventory().Kill("limits", unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s.assertClean(t)
	for _, m := range mounts.Cgroups() {
		if _, err := os.Stat(filepath.Join(m, statedir.CgroupsPath("limits"))); err == nil {
			t.Errorf("cgroup left in %s", m)
		}
	}
}

// The sandbox user is the registry's image uid/gid, not always 1000: a
// workspace owned by that uid on the host is writable and new files carry
// it; a workspace owned by another uid is not writable.
func TestWorkspaceOwnershipFollowsImageUID(t *testing.T) {
	script := `echo uid=$(/bin/busybox id -u) gid=$(/bin/busybox id -g)
echo data > "$PASEO_AGENT_CWD/made-by-agent" && echo write=ok || echo write=denied`
	for _, tc := range []struct {
		name      string
		owner     int
		wantWrite string
	}{
		{"owned by the image uid", 1234, "write=ok"},
		{"owned by someone else", 1000, "write=denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := compileScript(t, script, `{"image":{"uid":1234,"gid":1234}}`)
			ws := filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
			if err := os.Chown(ws, tc.owner, tc.owner); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(ws, 0o755); err != nil {
				t.Fatal(err)
			}
			_, out, stderr, err := s.launch(t, staticSecret("v"))
			if err != nil {
				t.Fatalf("launch: %v %s", err, stderr)
			}
			if !strings.Contains(out, "uid=1234 gid=1234") || !strings.Contains(out, tc.wantWrite) {
				t.Fatalf("output %q, want uid 1234 and %s", out, tc.wantWrite)
			}
			var st unix.Stat_t
			err = unix.Stat(filepath.Join(ws, "made-by-agent"), &st)
			if tc.wantWrite == "write=ok" && (err != nil || st.Uid != 1234 || st.Gid != 1234) {
				t.Errorf("host file: %v uid %d gid %d, want 1234:1234", err, st.Uid, st.Gid)
			}
			if tc.wantWrite == "write=denied" && err == nil {
				t.Error("the agent wrote into a workspace owned by another uid: " + strconv.Itoa(int(st.Uid)))
			}
			s.assertClean(t)
		})
	}
}

// RLIMIT_NOFILE, RLIMIT_NPROC and the tmpfs sizes hold inside the sandbox.
func TestRlimitsAndTmpfsSizes(t *testing.T) {
	script := `echo nofile=$(ulimit -n) nproc=$(ulimit -u)
/bin/busybox dd if=/dev/zero of=/tmp/fill bs=1M count=12 2>/dev/null && echo tmpfill=ok || echo tmpfill=full
/bin/busybox dd if=/dev/zero of=/home/sandbox/fill bs=1M count=12 2>/dev/null && echo homefill=ok || echo homefill=full`
	s := compileScript(t, script, `{"limits":{"nofile":1024,"nproc":300,"tmpfsBytes":8388608}}`)
	_, out, stderr, err := s.launch(t, staticSecret("v"))
	if err != nil {
		t.Fatalf("launch: %v %s", err, stderr)
	}
	for _, want := range []string{"nofile=1024 nproc=300", "tmpfill=full", "homefill=full"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s\n%s", want, out, stderr)
		}
	}
	s.assertClean(t)
}
