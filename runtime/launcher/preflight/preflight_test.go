package preflight

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/internal/testkit/skip"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/runtime/launcher/launchplan"
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
	procNS, err := os.Readlink("/proc/self/ns/net")
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

func minimalConfig(t *testing.T, hooks *specs.Hooks) []byte {
	t.Helper()
	// Launchable as far as the bundle validator (ocicheck) is concerned:
	// each test breaks one thing.
	mem, cpu, pids := int64(1<<30), int64(100000), int64(64)
	spec := specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"/bin/agent"}, Cwd: "/", Env: []string{"PATH=/usr/bin:/bin"},
			User: specs.User{UID: 1000, GID: 1000}, NoNewPrivileges: true},
		Root:  &specs.Root{Path: "/srv/image/rootfs", Readonly: true},
		Hooks: hooks,
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}},
			Resources:  &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &mem}, Pids: &specs.LinuxPids{Limit: &pids}, CPU: &specs.LinuxCPU{Quota: &cpu}},
		},
	}
	b, err := bundle.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeBundle writes a small bundle whose manifest records the digests of
// the files actually written, as the compiler does.
func writeBundle(t *testing.T, dir string, config []byte, pins []bundle.Pin) {
	t.Helper()
	if len(pins) > 0 { // one bind per pin, as the compiler writes them
		var spec specs.Spec
		if err := json.Unmarshal(config, &spec); err != nil {
			t.Fatal(err)
		}
		for _, p := range pins {
			spec.Mounts = append(spec.Mounts, specs.Mount{Destination: p.Destination, Type: "bind", Source: p.Source, Options: []string{"bind", "rw", "nosuid", "nodev"}})
		}
		var err error
		if config, err = bundle.Marshal(spec); err != nil {
			t.Fatal(err)
		}
	}
	egress, err := bundle.Marshal(bundle.Egress{
		APIVersion: bundle.APIVersion, Kind: "Egress", Mode: "none", Default: "deny", DNS: "pinned",
		Rules: []bundle.EgressRule{}, Routes: []bundle.Route{},
	})
	if err != nil {
		t.Fatal(err)
	}
	files := bundle.Files{
		bundle.ConfigFile: config,
		bundle.EgressFile: egress,
		bundle.HostsFile:  []byte("# generated by paseo-policy\n127.0.0.1 localhost\n"),
		bundle.ResolvFile: []byte("# generated by paseo-policy\noptions ndots:0 attempts:1 timeout:1\n"),
	}
	m := bundle.Manifest{
		APIVersion: bundle.ManifestAPIVersion, Kind: bundle.ManifestKind, Compiler: "paseo-policy/test",
		Profile: "test", Deployment: "test", Topology: "single", Agent: "agent",
		Inputs: map[string]string{}, Outputs: map[string]string{},
	}
	for name, data := range files {
		m.Outputs[name] = bundle.Digest(data)
	}
	if files[bundle.ManifestFile], err = bundle.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if pins != nil {
		doc := bundle.Pins{APIVersion: bundle.APIVersion, Kind: bundle.PinsKind, Manifest: bundle.Digest(files[bundle.ManifestFile]), Pins: pins}
		if files[bundle.PinsFile], err = bundle.Marshal(doc); err != nil {
			t.Fatal(err)
		}
	}
	if err := files.Write(dir); err != nil {
		t.Fatal(err)
	}
}

func pinOf(t *testing.T, dest, source string) bundle.Pin {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(source, &st); err != nil {
		t.Fatal(err)
	}
	return bundle.Pin{Destination: dest, Source: source, Root: filepath.Dir(source), Dev: st.Dev, Ino: st.Ino, Kind: string(pathsafe.KindOf(st.Mode))}
}

func TestIntactBundlePasses(t *testing.T) {
	host := realTempDir(t)
	src := filepath.Join(host, "workspace")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(host, "token.txt")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeBundle(t, dir, minimalConfig(t, nil), []bundle.Pin{pinOf(t, "/workspace", src), pinOf(t, "/run/token", file)})
	r := checkBundle(dir)
	wantNoErr(t, r.digests)
	wantNoErr(t, r.hooks)
	wantNoErr(t, r.pins)
	if !strings.HasPrefix(r.pinsOK, "2 pinned") {
		t.Fatalf("pins detail %q", r.pinsOK)
	}

	// A bundle without pins.json has nothing to re-resolve.
	dir2 := t.TempDir()
	writeBundle(t, dir2, minimalConfig(t, nil), nil)
	r = checkBundle(dir2)
	wantNoErr(t, r.digests)
	wantNoErr(t, r.pins)
}

func TestTamperedBundleFails(t *testing.T) {
	dir := t.TempDir()
	config := minimalConfig(t, nil)
	writeBundle(t, dir, config, []bundle.Pin{})
	wantNoErr(t, checkBundle(dir).digests)

	tampered := strings.Replace(string(config), `"readonly": true`, `"readonly": false`, 1)
	if tampered == string(config) {
		t.Fatal("test config has no readonly root to tamper with")
	}
	if err := os.WriteFile(filepath.Join(dir, bundle.ConfigFile), []byte(tampered), 0o644); err != nil {
		t.Fatal(err)
	}
	// The tamper added no hook (judged separately); the validator also
	// finds the root writable.
	bundleFails(t, dir, CheckBundleDigests, CheckBundleValid)

	// A file the manifest does not know about is refused as well.
	dir2 := t.TempDir()
	writeBundle(t, dir2, config, nil)
	m := mustRead(t, filepath.Join(dir2, bundle.ManifestFile))
	var man bundle.Manifest
	if err := json.Unmarshal(m, &man); err != nil {
		t.Fatal(err)
	}
	delete(man.Outputs, bundle.HostsFile)
	b, _ := bundle.Marshal(man)
	if err := os.WriteFile(filepath.Join(dir2, bundle.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	bundleFails(t, dir2, CheckBundleDigests)

	// A bundle missing a policy file cannot be read; every bundle check says so.
	dir3 := t.TempDir()
	writeBundle(t, dir3, config, nil)
	if err := os.Remove(filepath.Join(dir3, bundle.EgressFile)); err != nil {
		t.Fatal(err)
	}
	bundleFails(t, dir3, CheckBundleDigests, CheckBundleHooks, CheckBundlePins, CheckImageErofs)
	r := checkBundle(dir3)
	wantIs(t, r.digests, fs.ErrNotExist)
	wantIs(t, r.hooks, ErrNotChecked)
	wantIs(t, r.pins, ErrNotChecked)
}

func TestHookInConfigFails(t *testing.T) {
	const secret = "s3cr3t-token-value"
	hooks := &specs.Hooks{CreateRuntime: []specs.Hook{{
		Path: "/usr/local/bin/hook",
		Args: []string{"hook", "--token=" + secret},
		Env:  []string{"TOKEN=" + secret},
	}}}
	dir := t.TempDir()
	writeBundle(t, dir, minimalConfig(t, hooks), nil) // digests match: only the hook is wrong
	bundleFails(t, dir, CheckBundleHooks)
	r := checkBundle(dir)
	if strings.Contains(r.hooks.Error(), secret) || strings.Contains(r.hooks.Error(), "/usr/local/bin/hook") {
		t.Fatalf("hook error reveals hook contents: %v", r.hooks)
	}

	// Even an empty hooks object is refused.
	dir2 := t.TempDir()
	writeBundle(t, dir2, minimalConfig(t, &specs.Hooks{}), nil)
	bundleFails(t, dir2, CheckBundleHooks)

	// Deprecated prestart hooks still run in runtimes; refuse them too.
	dir3 := t.TempDir()
	writeBundle(t, dir3, minimalConfig(t, &specs.Hooks{Prestart: []specs.Hook{{Path: "/bin/true"}}}), nil) //nolint:staticcheck
	bundleFails(t, dir3, CheckBundleHooks)

	// A config that is not an OCI spec at all.
	dir4 := t.TempDir()
	writeBundle(t, dir4, []byte(`{"process": "not an object"}`), nil)
	bundleFails(t, dir4, CheckBundleHooks, CheckBundlePins, CheckImageErofs)
	wantIs(t, errOf(checkErofs(dir4, "")), ErrNotChecked)
}

func TestSwappedPinFails(t *testing.T) {
	host := realTempDir(t)
	src := filepath.Join(host, "workspace")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeBundle(t, dir, minimalConfig(t, nil), []bundle.Pin{pinOf(t, "/workspace", src)})
	wantNoErr(t, checkBundle(dir).pins)

	// Rename the pinned directory away and put a new one at the same path.
	if err := os.Rename(src, src+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	r := checkBundle(dir)
	wantNoErr(t, r.digests) // pins.json is host state, not covered by digests
	wantIs(t, r.pins, diag.PathReplaced)

	// A symlink to the original directory is refused, not followed.
	if err := os.Remove(src); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(src+".old", src); err != nil {
		t.Fatal(err)
	}
	wantIs(t, checkBundle(dir).pins, diag.PathSymlink)

	// So is a symlink in a parent component, or as the root.
	link := filepath.Join(host, "link")
	if err := os.Symlink(host, link); err != nil {
		t.Fatal(err)
	}
	wantIs(t, checkPin(bundle.Pin{Destination: "/w", Root: link, Source: filepath.Join(link, "workspace.old"), Kind: "dir"}), diag.PathSymlink)
	wantIs(t, checkPin(bundle.Pin{Destination: "/w", Root: host, Source: filepath.Join(link, "workspace.old"), Kind: "dir"}), diag.PathSymlink)

	// Gone entirely.
	if err := os.Remove(src); err != nil {
		t.Fatal(err)
	}
	wantIs(t, checkBundle(dir).pins, diag.PathMissing)

	// A directory replaced by a file with the same inode number is impossible
	// to arrange, but the kind is compared too.
	old := pinOf(t, "/workspace", src+".old")
	wantNoErr(t, checkPin(old))
	old.Kind = "file"
	wantIs(t, checkPin(old), diag.PathReplaced)

	wantIs(t, checkPin(bundle.Pin{Destination: "/w", Root: host, Source: "relative/path", Kind: "dir"}), diag.PathRelative)
	wantIs(t, checkPin(bundle.Pin{Destination: "/w", Root: host, Source: host + "/../x", Kind: "dir"}), diag.PathDotDot)
	wantIs(t, checkPin(bundle.Pin{Destination: "/w", Root: host, Source: host + "//x", Kind: "dir"}), diag.PathNonCanonical)
	wantIs(t, checkPin(bundle.Pin{Destination: "/w", Root: "", Source: host, Kind: "dir"}), diag.PathRelative)
}

func TestMalformedPinsFails(t *testing.T) {
	dir := t.TempDir()
	writeBundle(t, dir, minimalConfig(t, nil), nil)
	if err := os.WriteFile(filepath.Join(dir, bundle.PinsFile), []byte(`[{"source": "/", "extra": 1}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	bundleFails(t, dir, CheckBundleDigests, CheckBundlePins)
}

// pins.json names the manifest it was compiled with: pins from another
// compile are refused by the digest check and the pins check alike.
func TestPinsFromAnotherCompileFail(t *testing.T) {
	host := realTempDir(t)
	dir, other := t.TempDir(), t.TempDir()
	writeBundle(t, dir, minimalConfig(t, nil), []bundle.Pin{pinOf(t, "/workspace", host)})
	writeBundle(t, other, minimalConfig(t, &specs.Hooks{}), []bundle.Pin{pinOf(t, "/workspace", host)})
	if err := os.WriteFile(filepath.Join(dir, bundle.PinsFile), mustRead(t, filepath.Join(other, bundle.PinsFile)), 0o644); err != nil {
		t.Fatal(err)
	}
	bundleFails(t, dir, CheckBundleDigests, CheckBundlePins)
	wantIs(t, checkBundle(dir).pins, bundle.ErrPinsForeign)
}

// A bind without a pin, or a pin without a bind, is reported by doctor and
// by a launch's preflight alike.
func TestUnpairedPinsFail(t *testing.T) {
	host := realTempDir(t)
	dir := t.TempDir()
	writeBundle(t, dir, minimalConfig(t, nil), []bundle.Pin{pinOf(t, "/workspace", host)})
	files, err := bundle.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := files.Pins()
	p.Pins = append(p.Pins, pinOf(t, "/elsewhere", host))
	files[bundle.PinsFile], _ = bundle.Marshal(p)
	for _, resolve := range []bool{true, false} {
		wantIs(t, checkBundleFiles(files, nil, dir, resolve).pins, bundle.ErrPinsUnpaired)
	}
	p.Pins = nil
	files[bundle.PinsFile], _ = bundle.Marshal(p)
	for _, resolve := range []bool{true, false} {
		wantIs(t, checkBundleFiles(files, nil, dir, resolve).pins, bundle.ErrPinsUnpaired)
	}
}

// ---- Run, Report ----

func TestRunPasses(t *testing.T) {
	skip.UnlessRoot(t, "preflight checks root, nftables and root-owned binaries")
	dir := t.TempDir()
	bin := copyExec(t, staticBin, dir, 0o755)
	if err := os.WriteFile(bin+".sha256", []byte(sha256Hex(t, bin)+"  runsc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	host := realTempDir(t)
	bdir := t.TempDir()
	writeBundle(t, bdir, minimalConfig(t, nil), []bundle.Pin{pinOf(t, "/workspace", host)})

	r := Run(Options{RunscPath: bin, BundleDir: bdir}) // digest file defaults to bin+".sha256"
	names := []string{CheckRoot, CheckKernel, CheckRunscStatic, CheckRunscDigest, CheckCgroup, CheckNftables, CheckBundleDigests, CheckBundleHooks, CheckBundlePins, CheckImageErofs}
	if len(r.Checks) != len(names) {
		t.Fatalf("got %d checks, want %d: %+v", len(r.Checks), len(names), r.Checks)
	}
	for i, c := range r.Checks {
		if c.Name != names[i] {
			t.Fatalf("check %d is %s, want %s", i, c.Name, names[i])
		}
		if c.Detail == "" {
			t.Errorf("check %s has no detail", c.Name)
		}
		if c.Name == CheckCgroup {
			// Host-dependent; must agree with /proc/self/mountinfo.
			switch mounted := cgroup2AtRoot(t); {
			case !mounted && cgroupV1Controllers(t) && !c.OK:
				t.Errorf("mountinfo has v1 cpu, memory and pids under %s, but the check failed: %s", cgroupRoot, c.Detail)
			case !mounted && !cgroupV1Controllers(t) && (c.OK || !errors.Is(c.err, ErrNoCgroup)):
				t.Errorf("mountinfo has no cgroup2 at %s, but the check says OK=%v: %s", cgroupRoot, c.OK, c.Detail)
			case mounted && !c.OK && !errors.Is(c.err, ErrControllers):
				t.Errorf("mountinfo has cgroup2 at %s, but the check failed: %s", cgroupRoot, c.Detail)
			}
			continue
		}
		if !c.OK {
			t.Errorf("check %s failed: %s", c.Name, c.Detail)
		}
	}
	cg, _ := r.Get(CheckCgroup)
	if r.OK() != cg.OK {
		t.Fatalf("Report.OK %v with every other check passing and cgroup %v", r.OK(), cg.OK)
	}
	if (r.Err() == nil) != r.OK() {
		t.Fatalf("Err %v disagrees with OK %v", r.Err(), r.OK())
	}

	// JSON shape.
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OK     *bool            `json:"ok"`
		Checks []map[string]any `json:"checks"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.OK == nil || *doc.OK != r.OK() || len(doc.Checks) != len(names) {
		t.Fatalf("report JSON %s", b)
	}
	for _, c := range doc.Checks {
		fields := 3 // name, ok, detail; and the code of a failed check
		if c["ok"] == false {
			fields = 4
		}
		if len(c) != fields || c["name"] == nil || c["ok"] == nil || c["detail"] == nil || (fields == 4) != (c["code"] != nil) {
			t.Fatalf("check JSON %v: want name/ok/detail, and code when failed", c)
		}
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if again, _ := json.Marshal(back); string(again) != string(b) {
		t.Fatalf("report does not round-trip:\n%s\n%s", b, again)
	}
}

func TestRunFails(t *testing.T) {
	skip.UnlessRoot(t, "preflight checks root, nftables and root-owned binaries")
	dir := t.TempDir()
	bin := copyExec(t, "/bin/true", dir, 0o755) // dynamic
	digestFile := filepath.Join(t.TempDir(), "digests")
	if err := os.WriteFile(digestFile, []byte(strings.Repeat("a", 64)+"  runsc\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bdir := t.TempDir()
	writeBundle(t, bdir, minimalConfig(t, &specs.Hooks{Poststop: []specs.Hook{{Path: "/bin/true"}}}), nil)
	if err := os.WriteFile(filepath.Join(bdir, bundle.EgressFile), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	r := Run(Options{RunscPath: bin, RunscDigestFile: digestFile, BundleDir: bdir})
	if r.OK() {
		t.Fatal("report OK for a dynamic runsc, a wrong digest and a tampered bundle with a hook")
	}
	// Each failed check carries its code and its reason; the report's
	// error carries them all, in order, and as diagnostics.
	for name, reason := range map[string]error{
		CheckRunscStatic:   ErrDynamic,
		CheckRunscDigest:   ErrDigestDiffers,
		CheckBundleDigests: nil, // the validator's digest finding: its code says it
		CheckBundleHooks:   nil,
	} {
		c, ok := r.Get(name)
		if !ok {
			t.Fatalf("no %s check", name)
		}
		if c.OK || c.Code != Code(name) || c.Code == "" {
			t.Errorf("%s: OK=%v code %q, want a failure with %s", name, c.OK, c.Code, Code(name))
		}
		if reason != nil && !errors.Is(c.err, reason) {
			t.Errorf("%s: %v, want %q", name, c.err, reason)
		}
	}
	for _, name := range []string{CheckRoot, CheckKernel, CheckNftables, CheckBundlePins} {
		if c, _ := r.Get(name); !c.OK || c.Code != "" {
			t.Errorf("%s failed unexpectedly: %s (%s)", name, c.Detail, c.Code)
		}
	}
	err := r.Err()
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("Err is %T, want *preflight.Error", err)
	}
	var codes []diag.Code
	for _, c := range pe.Failed {
		codes = append(codes, c.Code)
	}
	if want := []diag.Code{diag.PreflightRunscStatic, diag.PreflightRunscDigest, diag.PreflightBundleDigests, diag.PreflightBundleHooks}; !slices.Equal(codes, want) &&
		!slices.Equal(codes, append(want[:2:2], diag.PreflightCgroup, diag.PreflightBundleDigests, diag.PreflightBundleHooks)) {
		t.Errorf("failed checks' codes %v, want %v (and cgroup's where this host has none)", codes, want)
	}
	for _, target := range []error{diag.PreflightRunscStatic, ErrDynamic, diag.PreflightBundleHooks} {
		if !errors.Is(err, target) {
			t.Errorf("errors.Is(Err, %q) is false", target)
		}
	}
	if errors.Is(err, diag.PreflightRoot) {
		t.Error("the error carries the code of a check that passed")
	}
	for i, d := range pe.Diagnostics() {
		if d.Code != pe.Failed[i].Code || d.Path != "preflight."+pe.Failed[i].Check || d.Message == "" {
			t.Errorf("diagnostic %d %+v for check %+v", i, d, pe.Failed[i])
		}
	}

	// No bundle: no bundle checks; no runsc path: both runsc checks say why.
	r = Run(Options{})
	if _, ok := r.Get(CheckBundleDigests); ok {
		t.Fatal("bundle checks ran without a bundle")
	}
	for _, name := range []string{CheckRunscStatic, CheckRunscDigest} {
		if c, _ := r.Get(name); c.OK || !errors.Is(c.err, ErrNotGiven) {
			t.Errorf("%s: %+v", name, c)
		}
	}
}

func TestEmptyReportIsNotOK(t *testing.T) {
	var r Report
	if r.OK() || r.Err() == nil {
		t.Fatal("an empty report must not be OK")
	}
	b, err := json.Marshal(r)
	if err != nil || string(b) != `{"ok":false,"checks":[]}` {
		t.Fatalf("empty report JSON %s, %v", b, err)
	}
}

// Every validator finding fails the report, on a launch's plan and on
// doctor's directory alike: one the bundle checks have no name for is
// reported as bundle-valid, and the report of a launchable bundle has no
// bundle-valid check at all.
func TestValidatorFindingsFailTheReport(t *testing.T) {
	dir := t.TempDir()
	var spec specs.Spec
	if err := json.Unmarshal(minimalConfig(t, nil), &spec); err != nil {
		t.Fatal(err)
	}
	spec.Process.User.UID = 0
	config, err := bundle.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	writeBundle(t, dir, config, nil)
	plan, err := launchplan.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string]Options{"launch": {Plan: plan, BundleDir: dir}, "doctor": {BundleDir: dir}} {
		c, ok := Run(opts).Get(CheckBundleValid)
		// The detail names the validator's finding by its check name
		// (stable in ocicheck: the finding has no code of its own).
		if !ok || c.OK || c.Code != diag.PreflightBundleValid || !strings.Contains(c.Detail, "invariant/unprivileged: ") {
			t.Errorf("%s: %s check %+v (present %v)", name, CheckBundleValid, c, ok)
		}
	}
	good := t.TempDir()
	writeBundle(t, good, minimalConfig(t, nil), nil)
	if c, ok := Run(Options{BundleDir: good}).Get(CheckBundleValid); ok {
		t.Errorf("a launchable bundle's report has %+v", c)
	}
}

// bundleFails requires doctor's report on dir (Run with no plan) to fail
// exactly the named bundle checks, and its error to carry each one's code.
func bundleFails(t *testing.T, dir string, names ...string) {
	t.Helper()
	r := Run(Options{BundleDir: dir, SkipNftablesProbe: true})
	err := r.Err()
	for _, name := range []string{CheckBundleDigests, CheckBundleHooks, CheckBundlePins, CheckImageErofs, CheckBundleValid} {
		c, _ := r.Get(name)
		want := slices.Contains(names, name)
		if failed := c.Name != "" && !c.OK; failed != want {
			t.Errorf("%s: failed %v, want %v (%s)", name, failed, want, c.Detail)
		}
		if errors.Is(err, Code(name)) != want {
			t.Errorf("%s: the report's error carries %s: %v, want %v", name, Code(name), !want, want)
		}
	}
}

// checkBundle is doctor's bundle check on dir: Run's with no plan given.
func checkBundle(dir string) bundleResult {
	plan, err := launchplan.Load(dir)
	return checkBundlePlan(plan, err, dir, true)
}

// checkBundleFiles is checkBundle on a bundle already read.
func checkBundleFiles(files bundle.Files, readErr error, dir string, resolvePins bool) bundleResult {
	if readErr != nil {
		return checkBundlePlan(nil, readErr, dir, resolvePins)
	}
	return checkBundlePlan(launchplan.FromFiles(dir, files), nil, dir, resolvePins)
}

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
