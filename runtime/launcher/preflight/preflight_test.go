package preflight

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/testkit/skip"
)

// staticBin is a static executable built once by TestMain with the Go
// toolchain running the tests (CGO_ENABLED=0), standing in for runsc.
var staticBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "preflight-static-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	staticBin, err = buildStatic(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "building the static test binary:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildStatic(dir string) (string, error) {
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module staticprobe\n\ngo 1.26\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("the go command is needed to build a static test binary: %w", err)
	}
	out := filepath.Join(dir, "runsc")
	cmd := exec.Command(goBin, "build", "-o", out, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-buildvcs=false")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, b)
	}
	return out, nil
}

// copyExec copies src to a fresh file in dir with the given mode.
func copyExec(t *testing.T, src, dir string, mode os.FileMode) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "runsc")
	if err := os.WriteFile(dst, data, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil { // not subject to umask
		t.Fatal(err)
	}
	return dst
}

func sha256Hex(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// realTempDir is t.TempDir with symlinks resolved, since pins are
// re-resolved without following any link.
func realTempDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// wantIs requires err to be, or wrap, target: a reason (ErrWritable), a
// code (diag.PathSymlink) or a library's error (fs.ErrNotExist).
func wantIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("want an error that is %q, got %v", target, err)
	}
}

func wantNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
}

// ---- root and kernel ----

func TestCheckRoot(t *testing.T) {
	wantNoErr(t, checkRoot(0))
	wantIs(t, checkRoot(1000), ErrNotRoot)
}

func TestKernelRelease(t *testing.T) {
	for _, tc := range []struct {
		release      string
		major, minor int
		parseErr     bool
		tooOld       bool
	}{
		{release: "6.18.44-fc-v595", major: 6, minor: 18},
		{release: "5.6.0", major: 5, minor: 6},
		{release: "5.10.0-28-amd64", major: 5, minor: 10},
		{release: "5.15.153.1-microsoft-standard-WSL2", major: 5, minor: 15},
		{release: "5.5.19", major: 5, minor: 5, tooOld: true},
		{release: "4.19.0-26-amd64", major: 4, minor: 19, tooOld: true},
		{release: "3.10.0-1160.el7.x86_64", major: 3, minor: 10, tooOld: true},
		{release: "", parseErr: true},
		{release: "6", parseErr: true},
		{release: "six.one", parseErr: true},
		{release: "6.x", parseErr: true},
		{release: "-1.7", parseErr: true},
	} {
		major, minor, err := parseKernelRelease(tc.release)
		if tc.parseErr {
			wantIs(t, err, ErrKernelRelease)
			wantIs(t, checkKernel(tc.release), ErrKernelRelease)
			continue
		}
		wantNoErr(t, err)
		if major != tc.major || minor != tc.minor {
			t.Errorf("%q: got %d.%d, want %d.%d", tc.release, major, minor, tc.major, tc.minor)
		}
		if tc.tooOld {
			wantIs(t, checkKernel(tc.release), ErrKernelTooOld)
		} else {
			wantNoErr(t, checkKernel(tc.release))
		}
	}
}

// ---- runsc: static ELF ----

func TestStaticELF(t *testing.T) {
	f, err := os.Open(staticBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wantNoErr(t, staticELF(f))
}

func TestDynamicBinaryFailsStaticCheck(t *testing.T) {
	// /bin/true is dynamically linked on every distribution we target; if it
	// is not here, this test cannot prove anything and must say so.
	out, err := exec.Command("file", "-L", "/bin/true").CombinedOutput()
	if err == nil && !strings.Contains(string(out), "dynamically linked") {
		t.Fatalf("/bin/true is not dynamically linked on this host (%s); pick another dynamic binary", strings.TrimSpace(string(out)))
	}
	dir := t.TempDir()
	bin := copyExec(t, "/bin/true", dir, 0o755)
	info := inspectRunsc(bin)
	wantIs(t, info.staticErr(), ErrDynamic)
}

func TestNonELFFailsStaticCheck(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "runsc")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	wantIs(t, inspectRunsc(script).staticErr(), ErrNotELF)
}

func TestRunscFileProblems(t *testing.T) {
	dir := t.TempDir()
	wantIs(t, inspectRunsc("").staticErr(), ErrNotGiven)
	wantIs(t, inspectRunsc(filepath.Join(dir, "missing")).staticErr(), fs.ErrNotExist)
	wantIs(t, inspectRunsc(dir).staticErr(), ErrNotRegular)

	noexec := copyExec(t, staticBin, t.TempDir(), 0o644)
	wantIs(t, inspectRunsc(noexec).staticErr(), ErrNotExecutable)

	writable := copyExec(t, staticBin, t.TempDir(), 0o777)
	wantIs(t, inspectRunsc(writable).staticErr(), ErrWritable)

	ok := copyExec(t, staticBin, t.TempDir(), 0o755)
	wantNoErr(t, inspectRunsc(ok).staticErr())
}

// ---- runsc: digest ----

func TestRunscDigest(t *testing.T) {
	dir := t.TempDir()
	bin := copyExec(t, staticBin, dir, 0o755)
	sum := sha256Hex(t, bin)
	info := inspectRunsc(bin)
	if info.sha256 != sum {
		t.Fatalf("inspectRunsc digest %s, sha256 of file %s", info.sha256, sum)
	}
	digestFile := filepath.Join(dir, "runsc.sha256")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(digestFile, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	write(sum + "  runsc\n") // as tools/runsc/build.sh writes it
	wantNoErr(t, info.digestErr(digestFile))
	write(strings.ToUpper(sum) + " *runsc\n") // sha256sum binary-mode spelling
	wantNoErr(t, info.digestErr(digestFile))
	write("# comment\n" + strings.Repeat("0", 64) + "  other\n" + sum + "  runsc\n")
	wantNoErr(t, info.digestErr(digestFile))

	other := sha256.Sum256([]byte("not runsc"))
	write(hex.EncodeToString(other[:]) + "  runsc\n")
	wantIs(t, info.digestErr(digestFile), ErrDigestDiffers)

	write(strings.Repeat("0", 64) + "  other\n" + strings.Repeat("1", 64) + "  another\n")
	wantIs(t, info.digestErr(digestFile), ErrDigestFile)
	write("deadbeef  runsc\n")
	wantIs(t, info.digestErr(digestFile), ErrDigestFile)
	write("\n")
	wantIs(t, info.digestErr(digestFile), ErrDigestFile)
	wantIs(t, info.digestErr(filepath.Join(dir, "absent.sha256")), fs.ErrNotExist)
	wantIs(t, info.digestErr(""), ErrNotGiven)

	// The binary changing after the digest was recorded is caught too.
	write(sum + "  runsc\n")
	if err := os.WriteFile(bin, append(mustRead(t, bin), 0), 0o755); err != nil {
		t.Fatal(err)
	}
	wantIs(t, inspectRunsc(bin).digestErr(digestFile), ErrDigestDiffers)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ---- cgroup v2 ----

func TestMissingControllers(t *testing.T) {
	if got := missingControllers("cpuset cpu io memory hugetlb pids rdma misc\n"); len(got) != 0 {
		t.Fatalf("missing %v from a full list", got)
	}
	if got, want := missingControllers("cpuset cpu io\n"), []string{"memory", "pids"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := missingControllers(""); len(got) != 3 {
		t.Fatalf("empty controllers: missing %v, want all three", got)
	}
}

func TestCgroup2Detection(t *testing.T) {
	skip.UnlessRoot(t, "it mounts cgroup2 and tmpfs")
	plain := t.TempDir()
	wantIs(t, isCgroup2(plain), ErrNoCgroup)
	_, err := checkCgroup(plain)
	wantIs(t, err, ErrNoCgroup)
	wantIs(t, isCgroup2(filepath.Join(plain, "absent")), ErrNoCgroup)

	mnt := t.TempDir()
	if err := unix.Mount("cgroup2", mnt, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mounting cgroup2 at %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})
	wantNoErr(t, isCgroup2(mnt))

	// Which controllers the unified hierarchy has depends on the host (a
	// hybrid host keeps them on v1); the check must agree with the file.
	data := mustRead(t, filepath.Join(mnt, "cgroup.controllers"))
	have, err := checkCgroup(mnt)
	if missing := missingControllers(string(data)); len(missing) == 0 {
		wantNoErr(t, err)
		if have != strings.Join(strings.Fields(string(data)), " ") {
			t.Fatalf("controllers %q, file says %q", have, data)
		}
	} else {
		wantIs(t, err, ErrControllers)
	}
}

// cgroupV1Controllers reads /proc/self/mountinfo to learn whether cpu,
// memory and pids are each mounted as cgroup v1 under /sys/fs/cgroup.
func cgroupV1Controllers(t *testing.T) bool {
	t.Helper()
	info := mustRead(t, "/proc/self/mountinfo")
	found := map[string]bool{}
	for _, line := range strings.Split(string(info), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 9 {
			continue
		}
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || fields[sep+1] != "cgroup" {
			continue
		}
		for _, c := range requiredControllers {
			if fields[4] == cgroupRoot+"/"+c {
				found[c] = true
			}
		}
	}
	return len(found) == len(requiredControllers)
}

// cgroup2AtRoot reads /proc/self/mountinfo to learn, independently of
// statfs, whether cgroup2 is mounted at /sys/fs/cgroup.
func cgroup2AtRoot(t *testing.T) bool {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fstype := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 || fields[4] != cgroupRoot {
			continue
		}
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) {
				fstype = fields[i+1] // the last mount at a path wins
			}
		}
	}
	return fstype == "cgroup2"
}

// ---- nftables ----

func hostTables(t *testing.T) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatalf("listing host nftables tables: %v", err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, fmt.Sprintf("%d/%s", tb.Family, tb.Name))
	}
	return names
}

func TestNftablesProbe(t *testing.T) {
	skip.UnlessRoot(t, "it creates a network namespace and nftables objects")
	before := hostTables(t)
	// The process's namespace is every unlocked thread's (this one's,
	// read while locked to it); /proc/self/ns/net is the main thread's,
	// which an earlier probe's goroutine may have left wedged in its own
	// namespace (nsutil.Open reads the thread's for the same reason).
	runtime.LockOSThread()
	procNS, err := os.Readlink("/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	detail, err := checkNftables()
	wantNoErr(t, err)
	if !strings.Contains(detail, "private network namespace") {
		t.Fatalf("detail %q", detail)
	}
	after := hostTables(t)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("host nftables tables changed: before %v, after %v", before, after)
	}
	for _, tb := range after {
		if strings.HasSuffix(tb, "/"+probeTable) {
			t.Fatalf("probe table leaked into the host namespace: %v", after)
		}
	}
	// The probe's namespace thread is discarded: threads the scheduler hands
	// out afterwards are all in the process's namespace.
	errs := make(chan error, 32)
	for i := 0; i < cap(errs); i++ {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			l, err := os.Readlink("/proc/thread-self/ns/net")
			if err == nil && l != procNS {
				err = fmt.Errorf("thread %d is in namespace %s, process is in %s", unix.Gettid(), l, procNS)
			}
			errs <- err
		}()
	}
	for i := 0; i < cap(errs); i++ {
		wantNoErr(t, <-errs)
	}
}

func TestNftablesProbeFailsOnBadNamespace(t *testing.T) {
	skip.UnlessRoot(t, "it creates a network namespace and nftables objects")
	// A regular file is not a namespace: setns refuses it before any rule is
	// sent, so the probe must report failure rather than touch the host.
	f, err := os.Open(staticBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wantIs(t, probeNftables(int(f.Fd())), unix.EINVAL) // setns refuses a file that is no namespace
}

// ---- bundle ----

// Every check has its own code, and docs/launcher.md's "Preflight codes"
// table lists each code with its check, in the order Run reports them.
func TestCodesDocumented(t *testing.T) {
	checks := []string{CheckRoot, CheckKernel, CheckRunscStatic, CheckRunscDigest, CheckCgroup, CheckNftables,
		CheckBundleDigests, CheckBundleHooks, CheckBundlePins, CheckImageErofs, CheckBundleValid}
	var want []string
	seen := map[diag.Code]string{}
	for _, name := range checks {
		code := Code(name)
		if !strings.HasPrefix(string(code), "PP-PREFLIGHT-") {
			t.Errorf("check %s has code %q", name, code)
		}
		if other, dup := seen[code]; dup {
			t.Errorf("checks %s and %s share %s", other, name, code)
		}
		seen[code] = name
		want = append(want, fmt.Sprintf("| `%s` | `%s` |", code, name))
	}
	if len(codes) != len(checks) {
		t.Errorf("%d codes for %d checks", len(codes), len(checks))
	}
	doc := string(mustRead(t, "../../../docs/launcher.md"))
	_, table, ok := strings.Cut(doc, "\n## Preflight codes\n")
	if !ok {
		t.Fatal(`docs/launcher.md has no "## Preflight codes" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	var got []string
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "| `PP-") {
			f := strings.SplitN(line, "|", 4)
			got = append(got, "|"+f[1]+"|"+f[2]+"|")
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("docs/launcher.md's preflight codes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
