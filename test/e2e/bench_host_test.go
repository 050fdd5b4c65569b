package e2e

// The baseline of the Pi start target: the compiled Pi process run on the
// host. It runs the compiled process (argv, env with the secrets filled
// in, cwd, uid/gid) chrooted into a private overlay over the same image,
// with the compiled mounts rebuilt by the host kernel (proc, tmpfs,
// devpts, sysfs, the binds of the state dirs, workspace, extension,
// mcp.json, hosts, resolv.conf; not the EROFS mounts: the tree under the
// overlay holds the same files), so Node reads the same files with no gofer
// in between. The compiled argv copies the image's jiti seed into the fresh
// /tmp, as in the sandbox: as warm as the /tmp/jiti a host Pi keeps. mcp.json names the fake
// daemon on loopback instead of the sandbox gateway. No cgroup limits, no
// rlimits.
//
// With stock, the chroot's /usr/local/bin/pi (in the overlay's upper layer)
// is a link to Pi's unbundled entry, dist/cli.js, pi-mcp-adapter's manifest
// names its own index.ts, and /tmp/jiti is kept between starts (the first,
// untimed, fills it), as the npm-installed packages run
// on a user's host and as the image ran it before the bundle: the baseline
// the target is measured against. Without it, the host runs the image's
// bundle, the same program as the sandbox (gVisor's own share).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/piproto"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// hostPi is the compiled Pi process, ready to run as a host process in a
// chroot that rebuilds the compiled mounts.
type hostPi struct {
	sc         *testbundle.Scene
	base, root string
	spec       rspec.Spec
	path       string // argv[0] resolved in the chroot
	env        []string
}

var secretRef = regexp.MustCompile(`@@paseo-secret:([^@]+)@@`)

func fillSecrets(tb testing.TB, s string) string {
	return secretRef.ReplaceAllStringFunc(s, func(m string) string {
		v, err := secrets("host-alice", secretRef.FindStringSubmatch(m)[1])
		if err != nil {
			tb.Fatal(err)
		}
		return string(v)
	})
}

func newHostPi(tb testing.TB, e *env, sc *testbundle.Scene, stock bool) *hostPi {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(sc.Bundle, "config.json"))
	if err != nil {
		tb.Fatal(err)
	}
	h := &hostPi{sc: sc, base: filepath.Join(tb.TempDir(), "hostroot")}
	if err := json.Unmarshal(data, &h.spec); err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(h.base, 0o755); err != nil {
		tb.Fatal(err)
	}
	// A private mount tree: nothing below base propagates to the host.
	mount(tb, h.base, h.base, "", unix.MS_BIND, "")
	mount(tb, "", h.base, "", unix.MS_PRIVATE|unix.MS_REC, "")
	tb.Cleanup(func() { detachAndRemove(tb, h.base) })

	upper, work := filepath.Join(h.base, "upper"), filepath.Join(h.base, "work")
	h.root = filepath.Join(h.base, "merged")
	for _, d := range []string{upper, work, h.root, filepath.Join(h.base, "files")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	mount(tb, "overlay", h.root, "overlay", unix.MS_NOSUID|unix.MS_NODEV,
		"lowerdir="+sc.Rootfs+",upperdir="+upper+",workdir="+work)
	if stock {
		// As npm links a package's bin: Pi's own #! line (/usr/bin/env
		// node) finds the image's node on PATH.
		stockPi := filepath.Join(h.root, "usr/local/bin/pi")
		if err := os.Remove(stockPi); err != nil {
			tb.Fatal(err)
		}
		if err := os.Symlink(stockCLI, stockPi); err != nil {
			tb.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(h.root, stockCLI)); err != nil {
			tb.Fatalf("stock Pi: %v", err)
		}
		// And pi-mcp-adapter as npm installs it: its manifest names its
		// own index.ts, not the image's bundle of it.
		manifest := filepath.Join(h.root, "opt/pi/node_modules/pi-mcp-adapter/package.json")
		raw, err := os.ReadFile(manifest)
		if err != nil {
			tb.Fatal(err)
		}
		if !strings.Contains(string(raw), `"./index.paseo.ts"`) {
			tb.Fatalf("stock Pi: %s does not name the image's adapter bundle", manifest)
		}
		if err := os.WriteFile(manifest, []byte(strings.Replace(string(raw), `"./index.paseo.ts"`, `"./index.ts"`, 1)), 0o644); err != nil {
			tb.Fatal(err)
		}
	}

	for _, m := range h.spec.Mounts {
		dst := filepath.Join(h.root, m.Destination)
		flags, data := mountOptions(m.Options)
		switch m.Type {
		case "proc", "tmpfs", "sysfs", "devpts":
			mkdirAll(tb, dst)
			mount(tb, m.Type, dst, m.Type, flags, data)
			if m.Destination == "/dev" {
				// What gVisor's /dev offers the agent, from the host.
				for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
					write(tb, filepath.Join(dst, d), "")
					mount(tb, "/dev/"+d, filepath.Join(dst, d), "", unix.MS_BIND, "")
				}
			}
		case "bind":
			src := m.Source
			if !filepath.IsAbs(src) {
				// A bundle file (hosts, resolv.conf, mcp.json): what the
				// launcher materializes, with the secrets filled in; the
				// MCP route is the daemon on loopback here.
				raw, err := os.ReadFile(filepath.Join(sc.Bundle, src))
				if err != nil {
					tb.Fatal(err)
				}
				s := fillSecrets(tb, string(raw))
				s = strings.ReplaceAll(s, "http://paseo-gateway:6767/", fmt.Sprintf("http://127.0.0.1:%d/", e.daemon.port))
				src = filepath.Join(h.base, "files", filepath.Base(src))
				if err := os.WriteFile(src, []byte(s), 0o644); err != nil {
					tb.Fatal(err)
				}
			}
			fi, err := os.Stat(src)
			if err != nil {
				tb.Fatal(err)
			}
			if fi.IsDir() {
				mkdirAll(tb, dst)
			} else {
				mkdirAll(tb, filepath.Dir(dst))
				if _, err := os.Stat(dst); err != nil {
					write(tb, dst, "")
				}
			}
			mount(tb, src, dst, "", unix.MS_BIND, "")
			mount(tb, "", dst, "", unix.MS_REMOUNT|unix.MS_BIND|flags, "")
		case "erofs":
			// The overlay's lower layer is the tree the EROFS file was
			// built from: the same files, read by the host kernel.
		default:
			tb.Fatalf("host Pi: mount type %q not handled", m.Type)
		}
	}
	if stock {
		// A user's host keeps /tmp/jiti between starts, and the image's
		// seed holds only the adapter's bundle: the stock adapter's ~60
		// transpiled modules are kept in a dir of the scene's that the
		// untimed first start fills, so the baseline is as warm as a
		// user's host Pi.
		cache := filepath.Join(sc.Host, "srv/paseo/state/stock-host-jiti")
		if err := os.MkdirAll(cache, 0o700); err != nil {
			tb.Fatal(err)
		}
		if err := os.Chown(cache, int(h.spec.Process.User.UID), int(h.spec.Process.User.GID)); err != nil {
			tb.Fatal(err)
		}
		dst := filepath.Join(h.root, "tmp/jiti")
		mkdirAll(tb, dst)
		mount(tb, cache, dst, "", unix.MS_BIND, "")
	}
	if h.spec.Root.Readonly {
		mount(tb, "", h.root, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
	}

	for _, kv := range h.spec.Process.Env {
		h.env = append(h.env, fillSecrets(tb, kv))
	}
	h.path = h.spec.Process.Args[0]
	if !strings.Contains(h.path, "/") {
		for _, kv := range h.env {
			if dirs, ok := strings.CutPrefix(kv, "PATH="); ok {
				for _, d := range filepath.SplitList(dirs) {
					if _, err := os.Stat(filepath.Join(h.root, d, h.path)); err == nil {
						h.path = filepath.Join(d, h.path)
						break
					}
				}
			}
		}
	}
	return h
}

// mountOptions maps OCI mount options to mount flags and data.
func mountOptions(opts []string) (uintptr, string) {
	var flags uintptr
	var data []string
	for _, o := range opts {
		switch o {
		case "nosuid":
			flags |= unix.MS_NOSUID
		case "nodev":
			flags |= unix.MS_NODEV
		case "noexec":
			flags |= unix.MS_NOEXEC
		case "ro":
			flags |= unix.MS_RDONLY
		case "strictatime":
			flags |= unix.MS_STRICTATIME
		case "rw", "bind", "rbind":
		default:
			data = append(data, o)
		}
	}
	return flags, strings.Join(data, ",")
}

func mount(tb testing.TB, src, dst, fstype string, flags uintptr, data string) {
	tb.Helper()
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		tb.Fatalf("mount %s on %s (%s, %#x, %q): %v", src, dst, fstype, flags, data, err)
	}
}

func mkdirAll(tb testing.TB, p string) {
	tb.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		tb.Fatal(err)
	}
}

// mountsBeneath lists the mount points at or below root, outermost first.
func mountsBeneath(root string) []string {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == root || strings.HasPrefix(f[4], root+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// detachAndRemove unmounts everything at or below dir, then removes it,
// but only when nothing is mounted there any more (binds of the scene's
// host dirs and the image must never be walked by RemoveAll).
func detachAndRemove(tb testing.TB, dir string) {
	for range 3 {
		ms := mountsBeneath(dir)
		if len(ms) == 0 {
			break
		}
		for i := len(ms) - 1; i >= 0; i-- {
			_ = unix.Unmount(ms[i], unix.MNT_DETACH)
		}
	}
	if ms := mountsBeneath(dir); len(ms) > 0 {
		tb.Logf("left %s in place: still mounted: %v", dir, ms)
		return
	}
	_ = os.RemoveAll(dir)
}

// stockCLI is Pi's own entry (package.json bin.pi) in the image's tree.
const stockCLI = "/opt/pi/node_modules/@earendil-works/pi-coding-agent/dist/cli.js"

// hostStart runs the host Pi once in a fresh chroot (every tmpfs new, as
// in a new sandbox): exec → get_state response, then EOF on its stdin and
// wait. With traceFile, Pi runs under strace writing there. It also
// returns the CPU time of Pi's process (every thread, and the children the
// start script waited for) by the response.
func hostStart(tb testing.TB, e *env, sc *testbundle.Scene, o benchOptions, traceFile string) (time.Duration, time.Duration) {
	tb.Helper()
	b, _ := tb.(*testing.B)
	if b != nil {
		b.StopTimer()
		defer b.StartTimer()
	}
	h := newHostPi(tb, e, sc, o.stock)
	defer detachAndRemove(tb, h.base)
	u := h.spec.Process.User
	cmd := &exec.Cmd{Path: h.path, Args: h.spec.Process.Args, Env: h.env, Dir: h.spec.Process.Cwd,
		SysProcAttr: &syscall.SysProcAttr{Chroot: h.root, Setpgid: true, Pdeathsig: syscall.SIGKILL,
			Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}}}
	if traceFile != "" {
		// strace runs on the host and execs the same process in the chroot.
		set := os.Getenv("PI_BENCH_STRACE_SET")
		if set == "" {
			set = "open,openat,openat2,stat,lstat,fstat,newfstatat,statx,access,faccessat,faccessat2,readlink,readlinkat,getdents64,read,pread64,mmap,execve,write"
		}
		args := []string{"strace", "-f", "-qq", "-s", "96", "-o", traceFile, "-e", "trace=" + set,
			"--", "chroot", fmt.Sprintf("--userspec=%d:%d", u.UID, u.GID), "--groups=", h.root,
			"/usr/bin/env", "-i", "-C", h.spec.Process.Cwd}
		args = append(args, h.env...)
		args = append(args, h.path)
		args = append(args, h.spec.Process.Args[1:]...)
		cmd = exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	client := piproto.New(stdout, stdin)
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	if b != nil {
		b.StartTimer()
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatalf("host Pi: %v", err)
	}
	benchCall(tb, c, client, stderr)
	d := time.Since(start)
	if b != nil {
		b.StopTimer()
	}
	cpu := processCPU(tb, cmd.Process.Pid)

	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			tb.Fatalf("host Pi exit: %v; stderr: %s", err, stderr)
		}
	case <-time.After(60 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		tb.Fatalf("host Pi did not exit after stdin closed; stderr: %s", stderr)
	}
	return d, cpu
}

// processCPU is utime+stime+cutime+cstime of /proc/PID/stat: the process's
// threads and the children it waited for (the start script's cp).
func processCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatalf("host Pi's CPU time: %v", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ticks int64
	for _, v := range f[11:15] { // fields 14-17
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture this runs on (the kernel's ABI, not its HZ).
const clockTicks = 100
