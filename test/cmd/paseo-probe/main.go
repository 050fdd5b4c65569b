// Command paseo-probe runs the sandbox escape probes of package probe and
// prints one JSON report on stdout. It runs inside a paseo sandbox (all
// escapes should be blocked) and as a plain host process, the control run
// (the escapes should succeed, proving every probe can fail).
//
// The report:
//
//	{
//	  "probes": [
//	    {"name": "write-dotdot", "kind": "escape", "verdict": "blocked", "evidence": "ENOENT"},
//	    {"name": "allowed-reachable", "kind": "reachability", "verdict": "reachable", "evidence": "connected"}
//	  ],
//	  "escaped": 0, "blocked": 1, "inconclusive": 0
//	}
//
// kind "escape" has verdicts blocked / escaped / inconclusive; kind
// "reachability" has reachable / unreachable / inconclusive. The counts
// tally verdict strings over all probes. Progress lines and the output
// flood go to stderr.
//
// Exit status: 0 whenever a report was printed, whatever its verdicts; 2
// for bad flags. Build it static:
// CGO_ENABLED=0 go build -o bin/paseo-probe ./cmd/paseo-probe.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"paseo.dev/paseo-policy/internal/testkit/probe"
)

func main() {
	// Before flag parsing: fork-bomb children re-execute this binary with
	// the hidden child flag, which the flag set does not know.
	probe.MaybeChild(os.Args)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, runs the probes and writes the report; it returns the
// exit status so tests can drive it.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		if !errors.Is(err, errReported) {
			fmt.Fprintln(stderr, "paseo-probe:", err)
		}
		return 2
	}
	report := probe.NewReport(probe.Run(context.Background(), cfg))
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(report); err != nil {
		fmt.Fprintln(stderr, "paseo-probe: writing the report:", err)
	}
	return 0
}

// errReported is a flag error the flag package has already printed.
var errReported = errors.New("bad flags")

// parseFlags maps the kebab-case flags onto probe.Config and validates it.
func parseFlags(args []string, stderr io.Writer) (probe.Config, error) {
	var c probe.Config
	fs := flag.NewFlagSet("paseo-probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: paseo-probe [flags]\n\nTries to escape the sandbox it runs in and prints a JSON report on stdout.\nList flags take comma-separated values and may be repeated.\n\nFlags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.Workspace, "workspace", "", "writable workspace `dir` (absolute)")
	fs.StringVar(&c.Outside, "outside", "", "host `dir` next to the workspace that must stay unwritable and unreadable")
	fs.Var(list{&c.Canaries}, "canaries", "host canary `files` containing the marker")
	fs.StringVar(&c.CanaryMarker, "canary-marker", "", "`marker` string planted in the canaries and the launcher's env")
	fs.StringVar(&c.CanaryEnv, "canary-env", "", "`name` of the launcher env var holding the marker")
	fs.Var(list{&c.Sockets}, "sockets", "host Unix socket `paths` that must not connect")
	fs.StringVar(&c.Allowed, "allowed", "", "`host:port` the policy allows (reachability check)")
	fs.StringVar(&c.AllowedURL, "allowed-url", "", "an https `URL` on the allowed host, requested for real (reachability check)")
	fs.StringVar(&c.CAFile, "ca-file", "", "PEM `file` with the CA of -allowed-url's certificate")
	fs.StringVar(&c.ConnectTo, "connect-to", "", "`host:port` to dial for -allowed-url instead of its host")
	fs.StringVar(&c.Decoy, "decoy", "", "`host:port` the policy does not allow")
	fs.Var(list{&c.HostAddrs}, "host-addrs", "`host:port` addresses of the host or gateway")
	fs.StringVar(&c.DNS, "dns", "", "`ip:port` of a resolver that is not allowed")
	fs.IntVar(&c.HostPID, "host-pid", 0, "host `pid` to ptrace and read the environ of")
	fs.Var(list{&c.Devices}, "devices", "device `nodes` for device-nodes (default "+strings.Join(probe.DefaultDevices, ",")+")")
	fs.Var(forkBomb{&c.ForkBomb}, "fork-bomb", "fork-bomb: -fork-bomb alone spawns up to 4096 children, -fork-bomb=`n` up to n; off by default")
	fs.Var(size{&c.MemHog}, "mem-hog", "mem-hog: allocate and touch `bytes` (K/M/G suffixes); 0 = off")
	fs.Var(size{&c.Flood}, "flood", "output-flood: write `bytes` to stderr (K/M/G suffixes); 0 = off")
	fs.DurationVar(&c.Sleep, "sleep", 0, "sleep-past-wall: sleep this `duration`; 0 = off")
	fs.DurationVar(&c.Timeout, "timeout", 0, "per-probe `timeout` (default 2s)")
	fs.DurationVar(&c.ResourceTimeout, "resource-timeout", 0, "`timeout` of fork-bomb, mem-hog and output-flood (default 120s)")
	fs.Var(list{&c.Only}, "only", "run only these probe `names` (a trailing * matches a prefix)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, errReported // the flag package printed it with the usage
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, c.Validate()
}

// list is a repeatable, comma-separated string list flag. Paths containing
// commas cannot be given; the harness chooses the paths.
type list struct{ p *[]string }

func (l list) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l list) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l.p = append(*l.p, s)
		}
	}
	return nil
}

// forkBomb is the child count of the fork-bomb probe. It is a boolean-style
// flag so that plain -fork-bomb means the acceptance default of 4096; a
// count must then be attached with "=" (-fork-bomb=64).
type forkBomb struct{ p *int }

// defaultForkBomb is the count plain -fork-bomb asks for.
const defaultForkBomb = 4096

func (f forkBomb) IsBoolFlag() bool { return true }

func (f forkBomb) String() string {
	if f.p == nil {
		return "0"
	}
	return strconv.Itoa(*f.p)
}

func (f forkBomb) Set(v string) error {
	if b, err := strconv.ParseBool(v); err == nil {
		*f.p = 0
		if b {
			*f.p = defaultForkBomb
		}
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return fmt.Errorf("want -fork-bomb or -fork-bomb=N")
	}
	*f.p = n
	return nil
}

// size is a byte count flag with optional binary suffixes: 512K, 64M, 2G,
// also written 64MiB or 64MB (all powers of 1024).
type size struct{ p *int64 }

func (s size) String() string {
	if s.p == nil {
		return "0"
	}
	return strconv.FormatInt(*s.p, 10)
}

func (s size) Set(v string) error {
	num := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(v)), "B"), "I")
	shift := 0
	if n := len(num); n > 0 {
		if i := strings.IndexByte("KMGT", num[n-1]); i >= 0 {
			shift, num = 10*(i+1), num[:n-1]
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)>>shift {
		return fmt.Errorf("want a byte count like 512K, 64M or 2G")
	}
	*s.p = n << shift
	return nil
}
