package main

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/probe"
)

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{
		"-workspace", "/w", "-outside", "/o",
		"-canaries", "/a,/b", "-canaries", "/c",
		"-canary-marker", "M", "-canary-env", "E",
		"-sockets", "/s1", "-allowed", "127.0.0.1:1", "-decoy", "127.0.0.1:2",
		"-host-addrs", "10.0.0.1:22,10.0.0.1:80", "-dns", "10.0.0.1:53",
		"-host-pid", "42", "-devices", "/dev/x",
		"-fork-bomb=64", "-mem-hog", "2G", "-flood", "64MiB", "-sleep", "3m",
		"-timeout", "1s", "-resource-timeout", "90s", "-only", "fork-bomb,mem-hog",
	}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Canaries, []string{"/a", "/b", "/c"}) || !slices.Equal(c.HostAddrs, []string{"10.0.0.1:22", "10.0.0.1:80"}) {
		t.Errorf("lists: %q %q", c.Canaries, c.HostAddrs)
	}
	if c.MemHog != 2<<30 || c.Flood != 64<<20 || c.ForkBomb != 64 || c.Sleep != 3*time.Minute || c.HostPID != 42 {
		t.Errorf("sizes: %+v", c)
	}
	if c.Timeout != time.Second || c.ResourceTimeout != 90*time.Second || !slices.Equal(c.Only, []string{"fork-bomb", "mem-hog"}) {
		t.Errorf("timeouts/only: %+v", c)
	}
}

func TestForkBombFlag(t *testing.T) {
	for args, want := range map[string]int{"-fork-bomb": 4096, "-fork-bomb=8": 8, "-fork-bomb=false": 0, "": 0} {
		c, err := parseFlags(strings.Fields(args), &bytes.Buffer{})
		if err != nil || c.ForkBomb != want {
			t.Errorf("%q: ForkBomb %d (%v), want %d", args, c.ForkBomb, err, want)
		}
	}
	if _, err := parseFlags([]string{"-fork-bomb", "8"}, &bytes.Buffer{}); err == nil {
		t.Error(`"-fork-bomb 8" accepted: the count must be attached with "="`)
	}
}

// TestExitStatus: 2 for bad flags, 0 with one JSON report otherwise.
func TestExitStatus(t *testing.T) {
	for _, args := range [][]string{
		{"-bogus"}, {"-mem-hog", "12X"}, {"extra"}, {"-only", "fork-bomb"},
		{"-workspace", "relative"}, {"-decoy", "no-port"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 || out.Len() != 0 {
			t.Errorf("%q: exit %d, stdout %q", args, code, out.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"-only", "uid-nonroot,gvisor"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var report probe.Report
	dec := json.NewDecoder(strings.NewReader(out.String()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&report); err != nil {
		t.Fatal(err)
	}
	if dec.More() || len(report.Probes) != 2 || report.Probes[0].Name != "uid-nonroot" || report.Probes[1].Kind != probe.KindReachability {
		t.Errorf("report: %s", out.String())
	}
	want := map[bool]string{true: probe.Escaped, false: probe.Blocked}[os.Geteuid() == 0]
	if report.Probes[0].Verdict != want {
		t.Errorf("uid-nonroot %q, want %q", report.Probes[0].Verdict, want)
	}
}
