package e2e

// make bench-tools (scripts/bench-tools.sh): an agent's tools on a real
// repository inside ONE sandbox launched by the product, against the same
// commands run by the deployment user on the host, in one run. A
// measurement, not an assertion: `go test ./test/e2e` without -bench runs
// none of it. Needs root, bin/runsc and the image.
//
// The repository (bench_tools_repo_test.go) is generated twice from the
// same seed: one copy for the sandbox (the scene's workspace and
// repository, compiled with the pi-session profile as it ships: its mounts,
// env, limits and start script, the Git layout included; network mode
// none, which no tool here uses) and one for the host, so neither side's
// commits and edits show in the other's tree.
//
//   - sandbox: launcher.Launch of the compiled bundle, with the profile's
//     start script unchanged but for its last word: where it execs Pi, it
//     execs the image's bash running toolsServer (below), which reads one
//     command a line on stdin, runs it as Pi's bash tool does (bash -c
//     COMMAND, in the workspace), and answers with its exit code, wall
//     time and user+system CPU (bash's `time`).
//   - host: the same server and commands as a host process, chrooted into a
//     private overlay of the same image tree (the image's bash, git, rg, fd,
//     node: the same binaries, so only the file path differs), as uid 1000
//     (the deployment user, who owns the tree), its copy of the repository
//     bound at the same path it has outside, /proc, a fresh /tmp.
//
// Rounds alternate which side goes first. A round is, on each side: a
// new sandbox launched from the same bundle on the same tree (from the
// second round on; untimed), as every agent session starts one, so each
// round's first `git status` is a first status after a start, with what
// the launcher prepares at a start (the vouched index, the untracked
// cache) made for that tree and not for the tree of a round before; the
// index put back to the one a start gives (untimed; on the host, the one
// host git wrote), then the timed commands of toolsCommands, then the
// round undone (git reset --hard to the base commit, git clean; untimed).
// Each command's wall time is bash's inside its side; CPU is, for the
// sandbox, the sandbox's cgroup (the Sentry, the gofer, the systrap stubs:
// all gVisor runs for it), for the host the command's own (its children's
// rusage). The benchmark prints one line per command and side and round in
// the benchmark format, then a table of medians and ratios.
//
// Knobs (environment; scripts/bench-tools.sh sets them):
//
//	TOOLS_BENCH_FILES      tracked files in the generated tree (default 20000)
//	TOOLS_BENCH_ROUNDS     rounds (default 5)
//	TOOLS_BENCH_GITCONFIG  "key=value ..." Git settings for one side
//	                       (TOOLS_BENCH_SIDE, default sandbox) instead of
//	                       the profile's and the plan's, or, with a
//	                       leading "+", after them (GIT_CONFIG_COUNT/KEY_n/
//	                       VALUE_n in its server's environment; the other
//	                       sides keep the profile's): an A/B of settings
//	                       the profile could ship, or, with Git's defaults,
//	                       the starting point in the same run
//	TOOLS_BENCH_ENV        "NAME=value ...": variables exported to that
//	                       side's server (an A/B of the profile's env)
//	TOOLS_BENCH_SIDE       the side the two above apply to (default sandbox)
//	TOOLS_BENCH_PACKED     "0" leaves the generated repository's objects
//	                       loose, as the generator's `git add` and `git
//	                       commit` wrote them; by default they are repacked
//	                       into one pack, as a clone has them
//	                       (bench_tools_repo_test.go)
//	TOOLS_BENCH_ONLY       a regular expression: only the commands it matches
//	TOOLS_BENCH_FSMONITOR  "0" leaves out the third side (default on): a
//	                       second sandbox, the same but in network mode
//	                       sandbox, where the plan grants the workspace
//	                       monitor by default (the product's path), which
//	                       answers its git, on a third copy of the tree
//	TOOLS_BENCH_SEARCH     "1" adds a side (default off): a sandbox, the same
//	                       but compiled with the registry's switch for the
//	                       native search (deployments.<id>.search "native",
//	                       grant search workspace) answering its rg, fd and
//	                       find (the plan's monitor on too, as network mode
//	                       sandbox grants it), on a copy of the tree of its own

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/childproc"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/internal/testkit/testnet"
	"paseo.dev/paseo-policy/policy/profiles"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/sandboxnet"
)

// toolsCommand is one timed command of a round.
type toolsCommand struct{ name, cmd string }

// toolsCommands are what an agent runs on nearly every turn, in the order
// a turn would: look, search, read, edit, review, commit.
var toolsCommands = []toolsCommand{
	{"git-status-first", `git status --porcelain`},
	{"git-status-again", `git status --porcelain`},
	{"git-log-50", `git log -n 50`},
	{"rg", `rg -c 'func ' .`},
	{"find", `find . -name '*.go'`},
	{"fd", `fd -e go`},
	{"cat-3000", `xargs cat </tmp/bench-cat-list >/dev/null`},
	// The writer's pid ($$) in every file: each round's edits are new
	// content, as an agent's are, so each round's `git add` hashes and
	// writes 500 new objects (with the same bytes every round, the later
	// rounds only found them in the store and touched them).
	{"write-500", `for f in $(</tmp/bench-edit-list); do printf 'edited %s %d\n' "$f" $$ >>"$f"; done; mkdir -p gen && for i in {1..250}; do printf 'package gen\n\n// %d\nconst N%d = %d\n' $$ $i $i >gen/f$i.go; done`},
	{"git-diff", `git diff`},
	{"git-commit", `git add -A && git -c user.name=agent -c user.email=agent@example.test -c gc.auto=0 commit -q -m edit`},
	{"node-walk", `node -e '` + toolsWalkJS + `'`},
}

// toolsWalkJS is a test runner's discovery: walk the tree (not .git,
// node_modules or build), stat every .js/.ts file and read it.
const toolsWalkJS = `const fs=require("fs"),path=require("path");let n=0,b=0;` +
	`function walk(d){for(const e of fs.readdirSync(d,{withFileTypes:true})){` +
	`if(e.name===".git"||e.name==="node_modules"||e.name==="build")continue;const p=path.join(d,e.name);` +
	`if(e.isDirectory())walk(p);else if(/\.(js|ts)$/.test(e.name)){fs.statSync(p);b+=fs.readFileSync(p).length;n++}}}` +
	`walk(".");console.log(n,b)`

// toolsServer is the long-lived shell of both sides: one command a line,
// run as Pi's bash tool runs it (bash -c), answered with DONE, its exit
// code, and bash's `time` (wall, user, system seconds). Its output goes to
// a file in /tmp; a failure's output goes to stderr.
// A line that starts with "?" also has its output printed before DONE,
// each line prefixed "| " (the tests' use).
const toolsServer = `export LC_ALL=C
TIMEFORMAT='%3R %3U %3S'
echo READY
while IFS= read -r line; do
  show=; case $line in '?'*) show=1; line=${line#?};; esac
  t=$( { time /bin/bash -c "$line" >/tmp/.bench-out 2>&1; } 2>&1 ); rc=$?
  if [ "$rc" -ne 0 ]; then echo "command failed ($rc): $line" >&2; head -c 4000 /tmp/.bench-out >&2; fi
  if [ -n "$show" ]; then while IFS= read -r o; do echo "| $o"; done </tmp/.bench-out; fi
  echo "DONE $rc $t"
done`

// toolsSide is one running server.
type toolsSide struct {
	name   string
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *lockedBuffer
	// cpu is the side's CPU time so far, when it is not the command's own
	// (the sandbox's cgroup); nil for the host.
	cpu func() time.Duration
	// setup are the side's untimed commands: before every round, after it.
	before, after string
	// relaunch ends a sandbox side's launch and starts a new one from
	// the same bundle on the same tree (nil for the host).
	relaunch func(tb testing.TB) *toolsSide
	// wake checkpoints the sandbox (launcher.Checkpoint), which ends its
	// launch, and wakes it (launcher.Wake) with new stdio: the server
	// goes on where it was (nil for the host).
	wake func(tb testing.TB) *toolsSide
	// finish ends a sandbox's launch and returns its result (nil for the
	// host).
	finish func() launcher.Result
}

type toolsSample struct{ wall, cpu, appCPU time.Duration }

// run sends one command and waits for its answer.
func (s *toolsSide) run(tb testing.TB, cmd string) toolsSample {
	tb.Helper()
	smp, _ := s.exchange(tb, cmd)
	return smp
}

// output runs one command and returns its output (stdout and stderr).
func (s *toolsSide) output(tb testing.TB, cmd string) string {
	tb.Helper()
	_, out := s.exchange(tb, "?"+cmd)
	return out
}

func (s *toolsSide) exchange(tb testing.TB, cmd string) (toolsSample, string) {
	tb.Helper()
	var out strings.Builder
	var c0 time.Duration
	if s.cpu != nil {
		c0 = s.cpu()
	}
	if _, err := io.WriteString(s.in, cmd+"\n"); err != nil {
		tb.Fatalf("%s: %v; stderr: %s", s.name, err, s.stderr)
	}
	for {
		line, err := s.out.ReadString('\n')
		if err != nil {
			tb.Fatalf("%s: the server ended (%v); stderr: %s", s.name, err, s.stderr)
		}
		if o, ok := strings.CutPrefix(line, "| "); ok {
			out.WriteString(o)
			continue
		}
		f, ok := strings.CutPrefix(strings.TrimSpace(line), "DONE ")
		if !ok {
			continue
		}
		v := strings.Fields(f)
		if len(v) != 4 || v[0] != "0" {
			tb.Fatalf("%s: %q: %q; stderr: %s", s.name, cmd, line, s.stderr)
		}
		sec := func(x string) time.Duration {
			d, err := strconv.ParseFloat(x, 64)
			if err != nil {
				tb.Fatalf("%s: %q: %v", s.name, line, err)
			}
			return time.Duration(d * float64(time.Second))
		}
		smp := toolsSample{wall: sec(v[1]), appCPU: sec(v[2]) + sec(v[3])}
		smp.cpu = smp.appCPU
		if s.cpu != nil {
			smp.cpu = s.cpu() - c0
		}
		return smp, out.String()
	}
}

func (s *toolsSide) waitReady(tb testing.TB) {
	tb.Helper()
	for {
		line, err := s.out.ReadString('\n')
		if err != nil {
			tb.Fatalf("%s: no READY (%v); stderr: %s", s.name, err, s.stderr)
		}
		if strings.TrimSpace(line) == "READY" {
			return
		}
	}
}

func BenchmarkTools(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("the tools benchmark runs runsc and mounts; run it as root")
	}
	im := image(b)
	files := envInt(b, "TOOLS_BENCH_FILES", 20000)
	rounds := envInt(b, "TOOLS_BENCH_ROUNDS", 5)
	cmds := toolsCommands
	if re := os.Getenv("TOOLS_BENCH_ONLY"); re != "" {
		m := regexp.MustCompile(re)
		cmds = slices.DeleteFunc(slices.Clone(cmds), func(c toolsCommand) bool { return !m.MatchString(c.name) })
	}
	tmp := b.TempDir()

	t0 := time.Now()
	sbxHost := filepath.Join(tmp, "host")
	packed := os.Getenv("TOOLS_BENCH_PACKED") != "0"
	sr := genToolsRepoPacked(b, sbxHost, files, packed)
	hr := genToolsRepoPacked(b, filepath.Join(tmp, "hostside"), files, packed)
	if sr.base != hr.base {
		b.Fatalf("the two copies differ: %s against %s", sr.base, hr.base)
	}
	store := "loose objects"
	if packed {
		store = "one pack"
	}
	fmt.Printf("tools: tree of %d tracked files, %.1f MB, commit %.12s (%s), generated twice in %.1f s\n", sr.files, float64(sr.bytes)/1e6, sr.base, store, time.Since(t0).Seconds())

	sbx := startToolsSandbox(b, im, sbxHost, sr, "sandbox", false)
	host := startToolsHost(b, im, filepath.Join(tmp, "chroot"), hr)
	sides := []*toolsSide{host, sbx}
	if os.Getenv("TOOLS_BENCH_FSMONITOR") != "0" {
		fsmHost := filepath.Join(tmp, "fsmhost")
		fr := genToolsRepoPacked(b, fsmHost, files, packed)
		sides = append(sides, startToolsSandbox(b, im, fsmHost, fr, "fsmonitor", true))
		if os.Getenv("TOOLS_BENCH_VOUCH") == "ab" {
			// The same monitored sandbox, each round started from the
			// seed's index (no fsmonitor extension): the first status as
			// it was before the launcher vouched.
			seedHost := filepath.Join(tmp, "fsmseedhost")
			sr := genToolsRepoPacked(b, seedHost, files, packed)
			s := startToolsSandbox(b, im, seedHost, sr, "fsmseed", true)
			s.before = toolsSeedIndex
			sides = append(sides, s)
		}
	}
	if os.Getenv("TOOLS_BENCH_SEARCH") == "1" {
		nsHost := filepath.Join(tmp, "nshost")
		nr := genToolsRepoPacked(b, nsHost, files, packed)
		sides = append(sides, startToolsSandboxWith(b, im, nsHost, nr, "search", toolsSandboxOpts{search: true}))
	}
	// Untimed setup on every side (again after each relaunch): the lists of
	// files to read and to edit.
	setup := func(s *toolsSide) {
		s.run(b, `git ls-files >/tmp/bench-all && k=$(( $(wc -l </tmp/bench-all) / 3000 )) && awk -v k=$(( k > 0 ? k : 1 )) 'NR % k == 0' /tmp/bench-all | head -n 3000 >/tmp/bench-cat-list && `+
			`grep -E '\.(go|ts|js|md|py)$' /tmp/bench-all >/tmp/bench-src && k=$(( $(wc -l </tmp/bench-src) / 250 )) && awk -v k=$k 'NR % k == 0' /tmp/bench-src | head -n 250 >/tmp/bench-edit-list && [ $(wc -l </tmp/bench-edit-list) -eq 250 ]`)
	}
	for _, s := range sides {
		setup(s)
	}

	samples := map[string][][]toolsSample{} // side -> command index -> rounds
	for _, s := range sides {
		samples[s.name] = make([][]toolsSample, len(cmds))
	}
	b.ResetTimer()
	for r := range rounds {
		// Each side goes first in turn.
		order := append(slices.Clone(sides[r%len(sides):]), sides[:r%len(sides)]...)
		for _, s := range order {
			if r > 0 && s.relaunch != nil {
				b.StopTimer()
				before := s.before
				*s = *s.relaunch(b)
				s.before = before
				setup(s)
				b.StartTimer()
			}
			s.run(b, s.before)
			for i, c := range cmds {
				smp := s.run(b, c.cmd)
				samples[s.name][i] = append(samples[s.name][i], smp)
				fmt.Printf("BenchmarkTools/%s/%s\t1\t%d wall-ns\t%d cpu-ns\t%d app-cpu-ns\n", c.name, s.name, smp.wall.Nanoseconds(), smp.cpu.Nanoseconds(), smp.appCPU.Nanoseconds())
			}
			s.run(b, s.after)
		}
	}
	b.StopTimer()
	for _, s := range sides[1:] {
		toolsReport(cmds, samples, rounds, s.name)
	}
}

// toolsReport prints, per command, the medians of each side, the ratio of
// the medians and the median of the per-round ratios, for wall and CPU,
// then the median of the commands' ratios: side against the host.
func toolsReport(cmds []toolsCommand, samples map[string][][]toolsSample, rounds int, side string) {
	fmt.Printf("\ntools: medians of %d rounds, seconds; ratio = %s/host of the medians (median of the per-round ratios)\n", rounds, side)
	fmt.Printf("%-18s %9s %9s %16s %9s %9s %16s\n", "command", "host", "sandbox", "ratio", "host CPU", "sbx CPU", "CPU ratio")
	var walls, cpus []float64
	for i, c := range cmds {
		h, s := samples["host"][i], samples[side][i]
		get := func(v []toolsSample, f func(toolsSample) time.Duration) []float64 {
			var out []float64
			for _, x := range v {
				out = append(out, f(x).Seconds())
			}
			return out
		}
		wall := func(x toolsSample) time.Duration { return x.wall }
		cpu := func(x toolsSample) time.Duration { return x.cpu }
		hw, sw, hc, sc := fmedian(get(h, wall)), fmedian(get(s, wall)), fmedian(get(h, cpu)), fmedian(get(s, cpu))
		var pw, pc []float64
		for r := range h {
			pw = append(pw, s[r].wall.Seconds()/max(h[r].wall.Seconds(), 0.001))
			pc = append(pc, s[r].cpu.Seconds()/max(h[r].cpu.Seconds(), 0.001))
		}
		rw, rc := sw/max(hw, 0.001), sc/max(hc, 0.001)
		walls, cpus = append(walls, rw), append(cpus, rc)
		fmt.Printf("%-18s %9.3f %9.3f %7.1f (%6.1f) %9.3f %9.3f %7.1f (%6.1f)\n", c.name, hw, sw, rw, fmedian(pw), hc, sc, rc, fmedian(pc))
	}
	fmt.Printf("tools: median over the commands (%s): wall %.1f x, CPU %.1f x; highest wall %.1f x\n", side, fmedian(walls), fmedian(cpus), slices.Max(walls))
}

func fmedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// toolsStartScript is the pi-session profile's start script as it ships,
// with Pi's exec replaced by bash running "$1" (the server): the Git seed
// and everything else the script does happen as they do for Pi.
func toolsStartScript(tb testing.TB) string {
	tb.Helper()
	prof, err := profiles.FS.ReadFile("pi-session.cue")
	if err != nil {
		tb.Fatal(err)
	}
	const head = `{lit: "/bin/sh"}, {lit: "-c"}, {lit: `
	i := strings.Index(string(prof), head)
	if i < 0 {
		tb.Fatal("pi-session.cue: no /bin/sh -c start script")
	}
	var script string
	if err := json.NewDecoder(strings.NewReader(string(prof[i+len(head):]))).Decode(&script); err != nil {
		tb.Fatalf("pi-session.cue: the start script: %v", err)
	}
	const execPi = `exec pi "$@"`
	if strings.Count(script, execPi) != 1 {
		tb.Fatalf("pi-session.cue: the start script does not end in %s: %q", execPi, script)
	}
	return strings.Replace(script, execPi, `exec /bin/bash -c "$1" bench-tools`, 1)
}

// startToolsSandbox compiles the pi-session profile for the scene at host
// (whose workspace and repository r already holds) and launches its
// server in one sandbox for the whole benchmark; with fsmon, the
// deployment's network mode is sandbox, where the plan grants the
// workspace monitor by default (grant fsmonitor workspace): the product's
// own path, no option of the benchmark's.
func startToolsSandbox(tb testing.TB, im imageInfo, host string, r *toolsRepo, name string, fsmon bool) *toolsSide {
	tb.Helper()
	return startToolsSandboxWith(tb, im, host, r, name, toolsSandboxOpts{fsmon: fsmon})
}

// toolsSandboxOpts say how a tools sandbox runs: fsmon in network mode
// sandbox, where the plan grants the workspace monitor by default; search
// compiled with the registry's switch for the native search
// (deployments.<id>.search "native": grant search workspace), also in
// network mode sandbox (so with the monitor too). Either puts the sandbox
// in a test world of its own.
type toolsSandboxOpts struct{ fsmon, search bool }

func startToolsSandboxWith(tb testing.TB, im imageInfo, host string, r *toolsRepo, name string, o toolsSandboxOpts) *toolsSide {
	tb.Helper()
	erofs, err := json.Marshal(im.Erofs)
	if err != nil {
		tb.Fatal(err)
	}
	server := toolsServer
	if name == toolsSettingsSide() {
		server = toolsSettings(tb) + server
	}
	// The monitor is served on the sandbox network's gateway: with it the
	// deployment's network mode is sandbox, in a test world of its own
	// (nothing in the benchmark's commands uses the network).
	network, uplink, resolve := "", "", sandboxnet.Resolver(nil)
	if o.fsmon || o.search {
		world := testnet.New(tb)
		model := world.Host("model")
		network, uplink = `,"network":{"mode":"sandbox"}`, world.Uplink
		resolve = func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{model.Addr}, nil }
	}
	if o.search {
		network += `,"deployments":{"host-alice":{"search":"native"}}`
	}
	sc := testbundle.New(tb, testbundle.Options{Host: host, Rootfs: im.Rootfs,
		Argv:          []string{"/bin/sh", "-c", toolsStartScript(tb), "bench-tools", server},
		RegistryPatch: fmt.Sprintf(`{"image":{"version":%q,"digest":%q,"erofs":%s}%s}`, im.Version, im.Digest, erofs, network)})
	// The scene's tree rewrote the repository's config and the worktree's
	// pointers with the same content; the owner is the sandbox user again.
	// The agent's Git store (testdata/base: state.gitStore) is the daemon's
	// to make and the deployment user's to own, as in the e2e scenes.
	chownTree(tb, r.repo, 1000, 1000)
	chownTree(tb, filepath.Join(host, "srv/paseo/state/pi-git/agent-7f3c"), 1000, 1000)

	return launchToolsSandbox(tb, sc, r, name, o, uplink, resolve)
}

// launchToolsSandbox launches the server in a new sandbox from the
// compiled scene sc; its relaunch ends it and launches another from the
// same bundle.
func launchToolsSandbox(tb testing.TB, sc *testbundle.Scene, r *toolsRepo, name string, o toolsSandboxOpts, uplink string, resolve sandboxnet.Resolver) *toolsSide {
	tb.Helper()
	id := fmt.Sprintf("pp-tools-%d-%d", os.Getpid(), time.Now().UnixNano())
	return runToolsSandbox(tb, sc, r, name, o, uplink, resolve, id, false)
}

// runToolsSandbox is launchToolsSandbox with the container's id, launched
// (launcher.Launch) or, when woken, woken (launcher.Wake of id, which was
// checkpointed).
func runToolsSandbox(tb testing.TB, sc *testbundle.Scene, r *toolsRepo, name string, o toolsSandboxOpts, uplink string, resolve sandboxnet.Resolver, id string, woken bool) *toolsSide {
	tb.Helper()
	run := launcher.Launch
	if woken {
		run = launcher.Wake
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := &toolsSide{name: name, in: inW, out: bufio.NewReader(outR), stderr: &lockedBuffer{},
		cpu:    func() time.Duration { return sandboxCPU(tb, id) },
		before: toolsStartIndex,
		after:  toolsUndo(r.base)}
	done := make(chan struct{})
	lctx, cancel := context.WithCancel(context.Background())
	var res launcher.Result
	var lerr error
	var checkpointed bool
	go func() {
		defer close(done)
		res, lerr = run(lctx, launcher.Options{BundleDir: sc.Bundle, StateRoot: sc.State, RunscPath: sc.Runsc, ID: id,
			Secrets: secrets, Stdin: inR, Stdout: outW, Stderr: s.stderr, Uplink: uplink, Resolve: resolve})
		outW.Close()
	}()
	s.finish = sync.OnceValue(func() launcher.Result {
		inW.Close()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cancel()
			<-done
		}
		cancel()
		if !checkpointed && (lerr != nil || res.ExitCode != 0) {
			tb.Errorf("the sandbox: %v, exit %d (%s); stderr: %s", lerr, res.ExitCode, res.Reason, s.stderr)
		}
		// The monitor side must have been answered by the monitor the
		// plan granted, not merely run in network mode sandbox.
		if st := res.FSMonitor; st != nil {
			fmt.Printf("tools: monitor (%s): %d lists, %d everything, %d events (%d closes and attribute events that changed nothing, left out), %d overflows, degraded %v; index entries vouched for at launch %d, not %d%s; untracked cache: %s in %d ms (the start waited %d ms); entries the jailed git refreshed, taken %d, not %d%s\n", name, st.Lists, st.Everything, st.Events, st.Unchanged, st.Overflows, st.Degraded, st.Vouched, st.NotVouched, map[bool]string{true: " (" + st.VouchReason + ")"}[st.VouchReason != ""], st.Untracked, st.UntrackedMillis, st.UntrackedWaitMillis, st.Refreshed, st.RefreshSkipped, map[bool]string{true: " (" + st.RefreshReason + ")"}[st.RefreshReason != ""])
		}
		if st := res.NativeSearch; st != nil {
			fmt.Printf("tools: search (%s): %d answered (%d from a warm jail, %d cats, %d of them finished by the sandbox's cat), %d fallback, %d refused; cat's bytes %d through the spool\n", name, st.Answered, st.Warm, st.Cat, st.CatResumed, st.Fallback, st.Refused, st.Spooled)
		}
		if o.fsmon && (res.FSMonitor == nil || res.FSMonitor.Lists == 0) {
			tb.Errorf("the %s side: the workspace monitor did not answer a list: %+v", name, res.FSMonitor)
		}
		return res
	})
	s.relaunch = func(tb testing.TB) *toolsSide {
		s.finish()
		return launchToolsSandbox(tb, sc, r, name, o, uplink, resolve)
	}
	s.wake = func(tb testing.TB) *toolsSide {
		tb.Helper()
		checkpointed = true
		if _, err := launcher.Checkpoint(launcher.CheckpointOptions{ID: id, StateRoot: sc.State, RunscPath: sc.Runsc}); err != nil {
			tb.Fatalf("checkpoint: %v; stderr: %s", err, s.stderr)
		}
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			tb.Fatal("the checkpointed launch did not end")
		}
		tb.Cleanup(func() { launcher.RemoveHibernation(sc.State, id) })
		return runToolsSandbox(tb, sc, r, name, o, uplink, resolve, id, true)
	}
	tb.Cleanup(func() { s.finish() })
	// A woken server is past its READY, in its loop; its CPU is not
	// counted (the woken sandbox has no cgroup at
	// statedir.CgroupsPath(id), where sandboxCPU reads).
	if woken {
		s.cpu = nil
	} else {
		s.waitReady(tb)
	}
	return s
}

// toolsStartIndex puts back the index a start gives the sandbox's git, as
// the start script chooses it: the launcher's vouched index when it wrote
// one (the monitor granted), the seed's otherwise.
const toolsStartIndex = `f=/run/paseo/fsmonitor/index; [ -f "$f" ] && [ -s "$f" ] || f=/run/paseo/git-seed/index; cp "$f" "$PASEO_GIT_DIR/index"`

// toolsSeedIndex is the seed's own index, as a start gave it before the
// launcher vouched for the workspace (the A/B side of TOOLS_BENCH_VOUCH).
const toolsSeedIndex = `cp /run/paseo/git-seed/index "$PASEO_GIT_DIR/index"`

// toolsSettingsSide is the side TOOLS_BENCH_GITCONFIG and TOOLS_BENCH_ENV
// apply to: TOOLS_BENCH_SIDE, by default sandbox.
func toolsSettingsSide() string {
	if s := os.Getenv("TOOLS_BENCH_SIDE"); s != "" {
		return s
	}
	return "sandbox"
}

// toolsSettings is the shell that sets TOOLS_BENCH_GITCONFIG's Git settings
// (GIT_CONFIG_COUNT/KEY_n/VALUE_n: instead of the profile's and the plan's,
// or, with a leading "+", after them) and exports TOOLS_BENCH_ENV's
// variables, for the server of the side they apply to.
func toolsSettings(tb testing.TB) string {
	tb.Helper()
	var b strings.Builder
	gc := os.Getenv("TOOLS_BENCH_GITCONFIG")
	add := strings.HasPrefix(gc, "+")
	if kv := strings.Fields(strings.TrimPrefix(gc, "+")); len(kv) > 0 {
		if !add {
			b.WriteString("export GIT_CONFIG_COUNT=0\n")
		}
		for _, s := range kv {
			k, v, ok := strings.Cut(s, "=")
			if !ok {
				tb.Fatalf("TOOLS_BENCH_GITCONFIG: %q is not key=value", s)
			}
			fmt.Fprintf(&b, "n=${GIT_CONFIG_COUNT:-0}; export GIT_CONFIG_KEY_$n=%s GIT_CONFIG_VALUE_$n=%s GIT_CONFIG_COUNT=$((n + 1))\n", k, v)
		}
	}
	for _, s := range strings.Fields(os.Getenv("TOOLS_BENCH_ENV")) {
		k, v, ok := strings.Cut(s, "=")
		if !ok || !regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`).MatchString(k) {
			tb.Fatalf("TOOLS_BENCH_ENV: %q is not NAME=value", s)
		}
		fmt.Fprintf(&b, "export %s=%s\n", k, v)
	}
	return b.String()
}

// startToolsHost runs the server as the deployment user in a chroot of a
// private overlay of the image tree at base, with r's tree bound at its
// own path.
func startToolsHost(tb testing.TB, im imageInfo, base string, r *toolsRepo) *toolsSide {
	tb.Helper()
	mkdirAll(tb, base)
	mount(tb, base, base, "", unix.MS_BIND, "")
	mount(tb, "", base, "", unix.MS_PRIVATE|unix.MS_REC, "")
	tb.Cleanup(func() { detachAndRemove(tb, base) })
	upper, work, root := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, root} {
		mkdirAll(tb, d)
	}
	mount(tb, "overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, "lowerdir="+im.Rootfs+",upperdir="+upper+",workdir="+work)
	mount(tb, "proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	mount(tb, "tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777")
	mount(tb, "tmpfs", filepath.Join(root, "dev"), "tmpfs", unix.MS_NOSUID, "mode=755")
	for _, d := range []string{"null", "zero", "random", "urandom"} {
		write(tb, filepath.Join(root, "dev", d), "")
		mount(tb, "/dev/"+d, filepath.Join(root, "dev", d), "", unix.MS_BIND, "")
	}
	tree := filepath.Dir(filepath.Dir(filepath.Dir(r.repo))) // the root the repo was generated beneath
	mkdirAll(tb, filepath.Join(root, tree))
	mount(tb, tree, filepath.Join(root, tree), "", unix.MS_BIND, "")

	cmd := &exec.Cmd{Path: "/bin/bash", Args: []string{"bash", "-c", toolsServer}, Dir: r.ws,
		Env: []string{"HOME=/tmp", "PATH=/usr/local/bin:/usr/bin:/bin", "TMPDIR=/tmp", "LANG=C.UTF-8"},
		SysProcAttr: &syscall.SysProcAttr{Chroot: root, Setpgid: true, Pdeathsig: syscall.SIGKILL,
			Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}}}}
	s := &toolsSide{name: "host", stderr: &lockedBuffer{},
		before: `cp /tmp/bench-index "` + r.gitdir + `/index"`,
		after:  toolsUndo(r.base)}
	cmd.Stderr = s.stderr
	var err error
	if s.in, err = cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	s.out = bufio.NewReader(out)
	// The index host git wrote, kept as the sandbox's seed is.
	idx, err := os.ReadFile(filepath.Join(r.gitdir, "index"))
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "tmp/bench-index"), idx, 0o644); err != nil {
		tb.Fatal(err)
	}
	// From a thread that outlives it: its parent-death signal is the
	// forking thread's, and the monitor side's network setup ends threads
	// (internal/childproc).
	waited, err := childproc.Start(cmd)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		s.in.Close()
		if err := <-waited; err != nil {
			tb.Errorf("the host server: %v; stderr: %s", err, s.stderr)
		}
	})
	s.waitReady(tb)
	return s
}

// toolsUndo puts the worktree back to base: the round's commit, edits and
// new files gone, the ignored build output kept.
func toolsUndo(base string) string {
	return `git reset -q --hard ` + base + ` && git clean -fdq`
}
