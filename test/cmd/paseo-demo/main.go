// Command paseo-demo is `make demo` as root: the real Pi (the pinned
// image) in gVisor under the pinned runsc, started through the supervisor
// from the reference facts, runs one turn whose scripted model (the fake
// model on a test host of the demo's own network) writes a file in the
// workspace and tries what the policy forbids. It prints the transcript,
// the file, the grants, what was used and blocked and how long each step
// took, writes the same to out/demo.json, and removes everything it made.
// It fails (exit 1) unless the turn ran in gVisor and every forbidden
// attempt was contained. See docs/demo.md.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"paseo.dev/paseo-policy/runtime/supervisor/holder"
)

func main() {
	// The supervisor re-executes this binary as each sandbox's holder.
	holder.MaybeRun()
	os.Exit(run())
}

type options struct {
	repo, work, out, runsc, image string
	// raw, when set, receives Pi's whole RPC output.
	raw string
}

func run() int {
	var o options
	flag.StringVar(&o.repo, "repo", ".", "the checkout (testdata/base, the image and runsc are found from it)")
	flag.StringVar(&o.work, "work", ".demo", "scratch dir for the host tree, bundle and state; removed at the end")
	flag.StringVar(&o.out, "out", "out/demo.json", "where the report goes")
	flag.StringVar(&o.runsc, "runsc", "bin/runsc", "the pinned runsc (make runsc)")
	flag.StringVar(&o.image, "image", ".image", "the Pi image dir (make image)")
	flag.StringVar(&o.raw, "raw", "", "write Pi's whole RPC output (JSON lines) to this file")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "paseo-demo: the sandboxed turn needs root (network namespaces, nftables, runsc); run `make demo` as root")
		return 2
	}
	for _, p := range []*string{&o.repo, &o.work, &o.out, &o.runsc, &o.image} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			fmt.Fprintln(os.Stderr, "paseo-demo:", err)
			return 2
		}
		*p = abs
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := demo(ctx, o)
	if rep != nil {
		if werr := rep.write(o.out); werr != nil && err == nil {
			err = werr
		}
		rep.print(os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "paseo-demo: FAILED:", err)
		return 1
	}
	fmt.Printf("\nmake demo: ok; report in %s\n", o.out)
	return 0
}

// demo runs every step under one demoT, so whatever a step made is undone
// (last first) however the demo ends.
func demo(ctx context.Context, o options) (rep *report, err error) {
	t := &demoT{}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(failure)
			if !ok {
				t.close()
				panic(r)
			}
			err = fmt.Errorf("%s", f.msg)
		}
		if err != nil && rep != nil {
			// A failure may quote Pi's output; the secrets stay out of it.
			err = fmt.Errorf("%s", redact(err.Error(), rep.apiKey, rep.marker))
		}
		t.close()
		if rep != nil {
			rep.Left = append([]string{}, append(rep.Left, leftovers(o.work, rep.sockDir)...)...)
			if len(rep.Left) > 0 && err == nil {
				err = fmt.Errorf("the demo left %v behind", rep.Left)
			}
			rep.OK = err == nil
			if err != nil {
				rep.Error = err.Error()
			}
		}
	}()
	rep = &report{}
	runDemo(ctx, t, o, rep)
	if fails := rep.verdict(); len(fails) > 0 {
		return rep, fmt.Errorf("%d check(s) failed: %v", len(fails), fails)
	}
	return rep, nil
}

// redact replaces each secret in s.
func redact(s string, secrets ...string) string {
	for _, v := range secrets {
		if v != "" {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// step times f and records it under name.
func (r *report) step(name string, f func()) {
	start := time.Now()
	f()
	r.Steps = append(r.Steps, timing{Step: name, Millis: time.Since(start).Milliseconds()})
}
