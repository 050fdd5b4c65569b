// Package acceptance is the proof of the launcher: the escape probe
// (test/cmd/paseo-probe) runs once as a plain host process (the control run,
// which must see every escape, proving each probe can fail) and once under
// the launcher with a compiled bundle (the contained run, which must see
// none), plus one contained run per resource limit. The verdict is written
// to out/acceptance.json (or $PASEO_ACCEPTANCE_OUT) and the test fails
// unless it is a pass. Needs root, bin/runsc and a static busybox.
//
// All network traffic goes to servers this test starts, in namespaces it
// creates, on addresses it assigns (internal/testkit/testnet).
package acceptance

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"io/fs"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/probe"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/runtime/launcher"
)

const canaryEnv = "PASEO_ACCEPTANCE_CANARY"

// directModel is the facts patch of a launch without a provider key.
const directModel = `{"credential":{"mode":"none","env":null,"secretRef":null}}`

// The sandbox's link comes from a one-link pool so its gateway address
// (the uplink host itself, as the sandbox sees it) is known when the probe's
// argv is compiled.
var (
	pool    = netip.MustParsePrefix("10.213.77.0/30")
	gateway = netip.MustParseAddr("10.213.77.1")
)

// Verdict is out/acceptance.json.
type Verdict struct {
	Tool          string           `json:"tool"`
	SchemaVersion int              `json:"schema_version"`
	GeneratedAt   string           `json:"generated_at"`
	Host          HostInfo         `json:"host"`
	Control       Run              `json:"control"`
	Contained     Run              `json:"contained"`
	Resources     []ResourceRun    `json:"resources"`
	Outside       []OutsideAttack  `json:"outside_attacks"`
	Observations  []Observation    `json:"host_observations"`
	Exemptions    []Exemption      `json:"exemptions"`
	Result        string           `json:"verdict"`
	Failed        []string         `json:"failed_checks"`
	Inconclusive  []string         `json:"inconclusive_checks"`
	Launch        *launcher.Result `json:"contained_launch,omitempty"`
}

// HostInfo says where the proof ran.
type HostInfo struct {
	Kernel string `json:"kernel"`
	Arch   string `json:"arch"`
	Runsc  string `json:"runsc_sha256"`
}

// Run is one probe report with how it was run.
type Run struct {
	Mode   string       `json:"mode"`
	Report probe.Report `json:"report"`
}

// ResourceRun is one limit probed in a sandbox of its own.
type ResourceRun struct {
	Probe    string `json:"probe"`
	Limit    string `json:"limit"`
	Verdict  string `json:"verdict"`
	Evidence string `json:"evidence"`
	Control  string `json:"control_verdict"`
}

// Observation compares a host target's digest before and after the
// contained run: the host's own view of whether anything changed.
type Observation struct {
	ID        string `json:"id"`
	Before    string `json:"before"`
	After     string `json:"after"`
	Unchanged bool   `json:"unchanged"`
}

// Exemption is a control probe that could not escape on this host for a
// stated reason, with the probe that covers the same vector.
type Exemption struct {
	Check    string `json:"check"`
	Reason   string `json:"reason"`
	Evidence string `json:"evidence"`
}

type scene struct {
	host, workspace, outside string
	canaries, sockets        []string
	marker                   string
	hostPID                  int
	world                    *testnet.World
	model, decoy, control    *testnet.Host
	probeBin                 string
	caFile                   string // the test CA, on the host
}

// sandboxCA is where the test CA sits in the sandbox's rootfs.
const sandboxCA = "/etc/paseo-test-ca.pem"

func TestAcceptance(t *testing.T) {
	testbundle.Prerequisites(t)
	s := newScene(t)
	v := Verdict{Tool: "paseo-acceptance", SchemaVersion: 1, GeneratedAt: time.Now().UTC().Format(time.RFC3339), Host: hostInfo(t)}

	sb := s.compile(t, s.sandboxArgv(), "")
	v.Control = Run{Mode: "control", Report: s.controlRun(t, nil)}
	before := s.observe(t)
	res, rep := s.containedRun(t, sb)
	v.Contained, v.Launch = Run{Mode: "contained", Report: rep}, &res
	after := s.observe(t)
	for _, id := range sortedKeys(before) {
		v.Observations = append(v.Observations, Observation{ID: id, Before: before[id], After: after[id], Unchanged: before[id] == after[id]})
	}
	v.Resources = s.resourceRuns(t)
	v.Outside = s.runOutside(t)
	for _, a := range v.Outside {
		t.Log(a)
	}
	v.judge()

	out := os.Getenv("PASEO_ACCEPTANCE_OUT")
	if out == "" {
		out = testbundle.Repo(t, "out/acceptance.json")
	}
	data, _ := json.MarshalIndent(v, "", "  ")
	if bytes.Contains(data, []byte(s.marker)) {
		t.Fatal("the verdict contains the canary marker")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("verdict %s written to %s", v.Result, out)
	if v.Result != "pass" {
		t.Fatalf("acceptance: %s\nfailed: %v\ninconclusive: %v", v.Result, v.Failed, v.Inconclusive)
	}
}

func newScene(t *testing.T) *scene {
	s := &scene{marker: randomHex(16)}
	s.host = filepath.Join(t.TempDir(), "host")
	s.workspace = filepath.Join(s.host, "srv/paseo/workspace/proj-feature")
	s.outside = filepath.Join(s.host, "srv/paseo/workspace/neighbour")
	s.canaries = []string{filepath.Join(s.host, "home/alice/.ssh/id_ed25519"), filepath.Join(s.host, "home/alice/.paseo/daemon-token")}
	s.sockets = []string{filepath.Join(s.host, "run/paseo-sandbox/supervisor.sock"), filepath.Join(s.host, "var/run/docker.sock")}

	s.world = testnet.New(t)
	s.model, s.decoy, s.control = s.world.Host("model"), s.world.Host("decoy"), s.world.Host("control")
	s.caFile = serveHTTPS(t, s.model, 8443, "llm.example.test")
	s.decoy.Serve(t, 8443, "decoy")
	dnsResponder(t, s.decoy)
	hostSvc, err := s.world.ListenUplink("tcp4", ":2222")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostSvc.Close() })
	go acceptAndClose(hostSvc)

	// The launcher's own environment holds a secret the sandbox must not see.
	t.Setenv(canaryEnv, s.marker)
	// A host process whose environment and root a probe must not reach.
	sleeper := exec.Command("/bin/busybox", "sleep", "600")
	sleeper.Env = []string{canaryEnv + "=" + s.marker}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	s.hostPID = sleeper.Process.Pid

	s.probeBin = filepath.Join(t.TempDir(), "paseo-probe")
	build := exec.Command("go", "build", "-o", s.probeBin, "./test/cmd/paseo-probe")
	build.Dir = testbundle.Repo(t, "")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building paseo-probe: %v\n%s", err, out)
	}
	return s
}

// plant creates the host targets the probes aim at; it runs after the
// scene's tree exists (testbundle builds it).
func (s *scene) plant(t *testing.T) {
	if err := os.MkdirAll(s.outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.outside, "notes.txt"), []byte("neighbour "+s.marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range s.canaries {
		if err := os.MkdirAll(filepath.Dir(c), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c, []byte("canary "+s.marker+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range s.sockets {
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go acceptAndClose(l)
	}
}

// sandboxArgv is the probe's argv inside the sandbox: the allowed host by
// its pinned name, the gateway as the uplink host.
func (s *scene) sandboxArgv(extra ...string) []string {
	return s.probeArgv(gateway.String()+":2222", "llm.example.test:8443",
		append([]string{"-ca-file", sandboxCA}, extra...)...)
}

// controlArgv is the same probe as a host process: no pinned names, so the
// model host by address, and the control link's uplink address.
func (s *scene) controlArgv(extra ...string) []string {
	return s.probeArgv(s.control.Gateway.String()+":2222", s.model.Addr.String()+":8443",
		append([]string{"-ca-file", s.caFile, "-connect-to", s.model.Addr.String() + ":8443"}, extra...)...)
}

func (s *scene) probeArgv(hostAddr, allowed string, extra ...string) []string {
	argv := []string{"/bin/paseo-probe", "-allowed-url", "https://llm.example.test:8443/v1/models",
		"-workspace", s.workspace, "-outside", s.outside,
		"-canaries", strings.Join(s.canaries, ","), "-canary-marker", s.marker, "-canary-env", canaryEnv,
		"-sockets", strings.Join(s.sockets, ","),
		"-allowed", allowed, "-decoy", s.decoy.Addr.String() + ":8443",
		"-host-addrs", hostAddr, "-dns", s.decoy.Addr.String() + ":53",
		"-host-pid", fmt.Sprint(s.hostPID), "-devices", strings.Join(hostDevices(), ",")}
	return append(argv, extra...)
}

// compile builds a bundle running argv with the real pi-session profile in
// network mode sandbox, with registry limits patched by limits (JSON).
func (s *scene) compile(t *testing.T, argv []string, limits string) *testbundle.Scene {
	patch := `{"network":{"mode":"sandbox"}`
	if limits != "" {
		patch += `,"limits":` + limits
	}
	patch += "}"
	// Credential mode none: the model host is then the one egress
	// destination, which allowed-https and the neighbour sanity check
	// reach. With a key, the model is reached only through the model
	// route (outside_modelkey_test.go).
	sb := testbundle.New(t, testbundle.Options{Host: s.host, Argv: argv, RegistryPatch: patch, FactsPatch: directModel,
		RootfsFiles: map[string]string{"/bin/paseo-probe": s.probeBin, sandboxCA: s.caFile}})
	s.plant(t)
	return sb
}

// controlRun runs the probe as a plain root process in a namespace linked
// to the same test world, without any filter.
func (s *scene) controlRun(t *testing.T, extra []string) probe.Report {
	argv := s.controlArgv(extra...)
	cmd := exec.Command(s.probeBin, argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := s.control.Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("control probe: %v\n%s", err, errb.String())
	}
	var rep probe.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("control report: %v\n%s", err, out.String())
	}
	return rep
}

func (s *scene) launch(t *testing.T, sb *testbundle.Scene) (launcher.Result, []byte, []byte) {
	var out, errb bytes.Buffer
	res, err := launcher.Launch(context.Background(), launcher.Options{
		BundleDir: sb.Bundle, StateRoot: sb.State, RunscPath: sb.Runsc,
		Secrets: func(_, _ string) ([]byte, error) { return []byte("fake-api-key"), nil },
		Stdin:   strings.NewReader(""), Stdout: &out, Stderr: &errb,
		Uplink: s.world.Uplink, Pool: pool,
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			if host == "llm.example.test" {
				return []netip.Addr{s.model.Addr}, nil
			}
			return nil, fmt.Errorf("unknown host %s", host)
		},
	})
	if err != nil {
		t.Fatalf("launch: %v\nstderr: %s", err, errb.String())
	}
	return res, out.Bytes(), errb.Bytes()
}

func (s *scene) containedRun(t *testing.T, sb *testbundle.Scene) (launcher.Result, probe.Report) {
	res, out, errb := s.launch(t, sb)
	var rep probe.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("contained report: %v (exit %d, %s)\nstdout: %s\nstderr: %s", err, res.ExitCode, res.Reason, out, errb)
	}
	return res, rep
}

// resource describes one limit and the probe that pushes past it.
type resource struct {
	probe, limits, limitText string
	flags, controlFlags      []string
	// wantReason is the launcher's reason when it, not the probe, ends
	// the sandbox at the limit.
	wantReason string
}

var resources = []resource{
	{probe: "fork-bomb", limits: `{"nproc":256}`, limitText: "RLIMIT_NPROC 256",
		flags: []string{"-fork-bomb=4096"}, controlFlags: []string{"-fork-bomb=64"}},
	{probe: "mem-hog", limits: `{"memoryBytes":268435456}`, limitText: "memory 256 MiB",
		flags: []string{"-mem-hog", "1G"}, controlFlags: []string{"-mem-hog", "64M"}, wantReason: "memory limit exceeded"},
	{probe: "output-flood", limits: `{"outputBytes":1048576}`, limitText: "output 1 MiB",
		flags: []string{"-flood", "64M"}, controlFlags: []string{"-flood", "2M"}, wantReason: "output limit exceeded"},
	{probe: "sleep-past-wall", limits: `{"wallSeconds":3}`, limitText: "wall time 3 s",
		flags: []string{"-sleep", "30s"}, controlFlags: []string{"-sleep", "1s"}, wantReason: "wall time exceeded"},
}

// resourceRuns runs each resource probe in its own sandbox at a low limit,
// and with a harmless size as a control that shows the probe can escape.
func (s *scene) resourceRuns(t *testing.T) []ResourceRun {
	var out []ResourceRun
	for _, r := range resources {
		rr := ResourceRun{Probe: r.probe, Limit: r.limitText}
		ctl := s.controlRun(t, append([]string{"-only", r.probe}, r.controlFlags...))
		rr.Control = verdictOf(ctl, r.probe).Verdict

		sb := s.compile(t, s.sandboxArgv(append([]string{"-only", r.probe}, r.flags...)...), r.limits)
		res, stdout, _ := s.launch(t, sb)
		var rep probe.Report
		parsed := json.Unmarshal(stdout, &rep) == nil
		switch {
		case parsed && verdictOf(rep, r.probe).Verdict == probe.Escaped:
			rr.Verdict, rr.Evidence = probe.Escaped, verdictOf(rep, r.probe).Evidence
		case r.wantReason != "" && strings.HasPrefix(res.Reason, r.wantReason):
			rr.Verdict, rr.Evidence = probe.Blocked, "the launcher ended the sandbox: "+res.Reason
		case parsed && verdictOf(rep, r.probe).Verdict == probe.Blocked:
			rr.Verdict, rr.Evidence = probe.Blocked, verdictOf(rep, r.probe).Evidence
		default:
			rr.Verdict = probe.Inconclusive
			rr.Evidence = fmt.Sprintf("exit %d, reason %q, report parsed %t", res.ExitCode, res.Reason, parsed)
		}
		out = append(out, rr)
	}
	return out
}

func verdictOf(rep probe.Report, name string) probe.Result {
	for _, r := range rep.Probes {
		if r.Name == name {
			return r
		}
	}
	return probe.Result{Name: name, Verdict: probe.Inconclusive, Evidence: "probe missing from the report"}
}

// exemptControl lists control probes that cannot escape on some hosts for
// a reason outside the sandbox, each with the probe covering its vector.
var exemptControl = map[string]string{
	"read-proc1-root": "pid 1 of this host is not readable through /proc even by root (a VM init); read-host-pid-root proves the /proc/<pid>/root vector with a host process the test owns",
}

// judge turns the runs into the verdict: every escape probe must escape
// in the control and be blocked in the contained run; the allowed endpoint
// and the workspace must be reachable in both; the host must be unchanged.
func (v *Verdict) judge() {
	fail := func(f string, a ...any) { v.Failed = append(v.Failed, fmt.Sprintf(f, a...)) }
	unsure := func(f string, a ...any) { v.Inconclusive = append(v.Inconclusive, fmt.Sprintf(f, a...)) }
	for _, c := range v.Contained.Report.Probes {
		ctl := verdictOf(v.Control.Report, c.Name)
		switch c.Kind {
		case probe.KindEscape:
			switch c.Verdict {
			case probe.Escaped:
				fail("contained:%s escaped (%s)", c.Name, c.Evidence)
			case probe.Inconclusive:
				unsure("contained:%s inconclusive (%s)", c.Name, c.Evidence)
			}
			if ctl.Verdict != probe.Escaped {
				if reason, ok := exemptControl[c.Name]; ok && strings.Contains(ctl.Evidence, "EACCES") {
					v.Exemptions = append(v.Exemptions, Exemption{Check: "control:" + c.Name, Reason: reason, Evidence: ctl.Evidence})
				} else {
					unsure("control:%s did not escape on the host, so the probe is unproven (%s: %s)", c.Name, ctl.Verdict, ctl.Evidence)
				}
			}
		case probe.KindReachability:
			want := probe.Reachable
			if c.Name == "gvisor" && ctl.Verdict != probe.Unreachable {
				unsure("control:gvisor detected gVisor on the host (%s)", ctl.Evidence)
			}
			if c.Verdict != want {
				fail("contained:%s is %s (%s)", c.Name, c.Verdict, c.Evidence)
			}
			if c.Name != "gvisor" && ctl.Verdict != want {
				unsure("control:%s is %s (%s)", c.Name, ctl.Verdict, ctl.Evidence)
			}
		}
	}
	if len(v.Contained.Report.Probes) == 0 {
		fail("contained run reported no probes")
	}
	for _, o := range v.Observations {
		if !o.Unchanged {
			fail("host:%s changed during the contained run", o.ID)
		}
	}
	for _, r := range v.Resources {
		switch r.Verdict {
		case probe.Escaped:
			fail("contained:%s escaped its limit (%s): %s", r.Probe, r.Limit, r.Evidence)
		case probe.Inconclusive:
			unsure("contained:%s inconclusive: %s", r.Probe, r.Evidence)
		}
		if r.Control != probe.Escaped {
			unsure("control:%s did not escape on the host (%s)", r.Probe, r.Control)
		}
	}
	judgeOutside(v.Outside, fail, unsure)
	v.Result = "pass"
	if len(v.Failed) > 0 {
		v.Result = "fail"
	} else if len(v.Inconclusive) > 0 {
		v.Result = "inconclusive"
	}
	if v.Failed == nil {
		v.Failed = []string{}
	}
	if v.Inconclusive == nil {
		v.Inconclusive = []string{}
	}
	if v.Exemptions == nil {
		v.Exemptions = []Exemption{}
	}
}

// observe digests the host targets the probes aim at.
func (s *scene) observe(t *testing.T) map[string]string {
	return map[string]string{
		"outside_dir":    digestTree(t, s.outside),
		"alice_home":     digestTree(t, filepath.Join(s.host, "home/alice")),
		"workspace_root": digestTree(t, filepath.Dir(s.workspace)),
		"sockets_dir":    digestTree(t, filepath.Join(s.host, "run")),
	}
}

// digestTree hashes names, modes, owners and contents beneath root, except
// the workspace itself (which the sandbox may write).
func digestTree(t *testing.T, root string) string {
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && filepath.Base(p) == "proj-feature" {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %v %v\n", p, info.Mode(), info.Size())
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func hostInfo(t *testing.T) HostInfo {
	kernel := ""
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(data))
	}
	sum, _ := os.ReadFile(testbundle.Repo(t, "bin/runsc.sha256"))
	return HostInfo{Kernel: kernel, Arch: runtime.GOARCH, Runsc: strings.Fields(string(sum) + " ")[0]}
}

// dnsResponder answers every UDP query on host:53 with the query itself,
// enough for the probe to see a reply.
func dnsResponder(t *testing.T, h *testnet.Host) {
	pc, err := h.ListenPacket("udp4", h.Addr.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if n > 2 {
				buf[2] |= 0x80 // QR: a response
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// hostDevices names device nodes of this host an agent must never open:
// memory and kernel interfaces and every block device.
func hostDevices() []string {
	devs := []string{"/dev/mem", "/dev/kmem", "/dev/kmsg", "/dev/kvm"}
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		devs = append(devs, "/dev/"+e.Name())
	}
	return devs
}

func acceptAndClose(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		fmt.Fprintln(c, "host")
		c.Close()
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// serveHTTPS runs an HTTPS server for name on the host's port, with a
// certificate from a CA made for this test; it returns the CA's PEM file.
// It stands in for the model endpoint: a real TLS handshake with the name
// the sandbox resolves through its pinned /etc/hosts.
func serveHTTPS(t *testing.T, h *testnet.Host, port int, name string) string {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "paseo acceptance test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	l, err := h.Listen("tcp4", netip.AddrPortFrom(h.Addr, uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, `{"data":[]}`) }),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}},
		// allowed-reachable connects without TLS; its handshake "errors" are expected.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { srv.Close() })
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return caFile
}
