package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// TestPiToolsCatNativeSearch: compiled with the registry's switch for the native
// search, the sandbox's `cat` is the client, and a cat of a batch of the
// workspace's files (xargs, as an agent lists and reads) is answered
// outside (the server's counter) with the bytes the sandbox's own
// /usr/bin/cat gives, exit code and messages too: files the sandbox wrote
// or appended to a moment before read back whole (the sandbox's writes are
// on the host when cat is answered), the Git layout's .git (a mount of its
// own in the sandbox), a missing file, a directory, an option, stdin and a
// planted link to a host file (answered inside, never with the host
// file). The answers' bytes come through the spool, which the sandbox
// can neither write, remove nor replace. Control: the same commands in a
// sandbox with the search off (the monitor's network mode, nothing
// answered outside): `cat` is the image's, and the same bytes.
func TestPiToolsCatNativeSearch(t *testing.T) {
	im := image(t)
	base := t.TempDir()
	secret := filepath.Join(base, "host-secret.txt")
	write(t, secret, "HOSTSECRET in a host file\n")
	type side struct {
		name string
		o    toolsSandboxOpts
	}
	for _, sd := range []side{{"search", toolsSandboxOpts{search: true}}, {"off", toolsSandboxOpts{fsmon: true}}} {
		t.Run(sd.name, func(t *testing.T) {
			host := filepath.Join(base, sd.name)
			r := genToolsRepo(t, host, 300)
			sbx := startToolsSandboxWith(t, im, host, r, sd.name, sd.o)
			want := bundle.SearchDir + "/cat"
			if sd.name == "off" {
				want = "/usr/bin/cat"
			}
			if got := strings.TrimSpace(sbx.output(t, "command -v cat")); got != want {
				t.Fatalf("cat in the sandbox is %q, want %s", got, want)
			}
			sbx.output(t, `git ls-files | grep -v '^\.git' | head -n 250 >/tmp/cat-list && wc -l </tmp/cat-list`)
			// Each command's output digested with its exit code (and
			// messages, 2>&1 in order), through cat and /usr/bin/cat (whose
			// messages name it so: named cat here).
			digest := func(c string) string {
				return "{ " + c + "; } </dev/null 2>&1 | sed 's|/usr/bin/cat: |cat: |g' | sha256sum; echo rc=${PIPESTATUS[0]}"
			}
			cmds := []struct {
				cmd     string
				outside bool
			}{
				{`xargs cat </tmp/cat-list`, true},
				{`cat $(cat /tmp/cat-list)`, true},
				{`cat -- $(cat /tmp/cat-list)`, true},
				{`cat $(sed "s|^|$PWD/|" /tmp/cat-list)`, true},
				{`head -c 300000 /dev/zero | tr '\0' w >fresh.txt && cat fresh.txt $(cat /tmp/cat-list) fresh.txt`, true},
				{`f=$(head -n 1 /tmp/cat-list) && cp "$f" /tmp/orig && printf 'appended a moment before\n' >>"$f" && cat $(cat /tmp/cat-list) && cp /tmp/orig "$f"`, true},
				{`cat $(head -n 10 /tmp/cat-list)`, false},
				{`cat -n $(cat /tmp/cat-list)`, false},
				{`echo from-stdin | cat $(head -n 100 /tmp/cat-list) - $(tail -n 100 /tmp/cat-list)`, false},
				{`cat $(cat /tmp/cat-list) no-such-file`, false},
				{`cat $(head -n 100 /tmp/cat-list) src $(tail -n 100 /tmp/cat-list)`, false},
				{`cat .git $(cat /tmp/cat-list)`, false},
				{`ln -sf ` + secret + ` escape && cat $(cat /tmp/cat-list) escape`, false},
				{`cat $(cat /tmp/cat-list) >/tmp/cat-out && sha256sum </tmp/cat-out`, false},
			}
			for _, c := range cmds {
				got := sbx.output(t, digest(c.cmd))
				realCmd := strings.NewReplacer("xargs cat", "xargs /usr/bin/cat", "| cat ", "| /usr/bin/cat ", "&& cat ", "&& /usr/bin/cat ").Replace(c.cmd)
				if strings.HasPrefix(realCmd, "cat ") {
					realCmd = "/usr/bin/" + realCmd
				}
				real := sbx.output(t, digest(realCmd))
				if got != real {
					t.Errorf("%s:\ncat gave\n%s\n/usr/bin/cat (%s)\n%s", c.cmd, got, realCmd, real)
				}
				if strings.Contains(got, "HOSTSECRET") {
					t.Errorf("%s: the host file reached the sandbox", c.cmd)
				}
			}
			// The appended file, read by the client right after the
			// append, holds the appended line.
			line := sbx.output(t, `f=$(head -n 1 /tmp/cat-list) && printf 'MARK%s\n' $$ >>"$f" && cat $(cat /tmp/cat-list) | grep -c "MARK$$\$"`)
			if strings.TrimSpace(line) != "1" {
				t.Errorf("a line appended just before the cat: found %q times", strings.TrimSpace(line))
			}
			// The spool is the launcher's: read-only here, and a write,
			// a removal or a link in its place fails.
			// Control: the same four on a file of the sandbox's /tmp.
			if sd.name == "search" {
				try := func(p string) string {
					return strings.TrimSpace(sbx.output(t, `for c in "printf x >>`+p+`" "truncate -s 0 `+p+`" "rm -f `+p+`" "ln -sf /etc/passwd `+p+`"; do (eval "$c") 2>/dev/null && echo "done: $c"; done; echo checked`))
				}
				if got := try("/tmp/spool-control"); strings.Count(got, "done: ") != 4 {
					t.Fatalf("control: the four changes on a file of /tmp:\n%s", got)
				}
				if got := try(bundle.SearchSpoolPath); got != "checked" {
					t.Errorf("the spool was changed from the sandbox:\n%s", got)
				}
			}
			res := sbx.finish()
			st := res.NativeSearch
			outside := 0
			for _, c := range cmds {
				if c.outside {
					outside++
				}
			}
			switch {
			case sd.name == "off" && st != nil:
				t.Errorf("control: the search is off and a server answered: %+v", st)
			case sd.name == "search" && (st == nil || st.Cat < uint64(outside)):
				t.Errorf("the search server's counters: %+v, want at least %d cats answered outside", st, outside)
			case sd.name == "search" && st.Spooled == 0:
				t.Errorf("cat's bytes: none through the spool: %+v", st)
			}
		})
	}
}

// TestPiToolsCatNativeSearchAcrossWake: a sandbox whose cat is answered
// through the spool is checkpointed and woken (launcher.Checkpoint, then
// launcher.Wake: a new run dir, so a new, empty spool, and a new server).
// A cat caught in the middle (its reader asleep, so the client blocks on
// a full pipe holding the answer's first frame) finishes after the wake
// with the bytes the sandbox's own /usr/bin/cat gives: the rest of its
// regions are gone with the old spool, so the sandbox's cat finishes it
// from the first file whose bytes the client had not written. After the wake the same cat of a batch is again
// answered outside, through the new spool, with the same bytes. Control:
// before the checkpoint, the same cat answered outside with the same
// bytes.
func TestPiToolsCatNativeSearchAcrossWake(t *testing.T) {
	im := image(t)
	host := filepath.Join(t.TempDir(), "wake")
	r := genToolsRepo(t, host, 300)
	sbx := startToolsSandboxWith(t, im, host, r, "search", toolsSandboxOpts{search: true})
	sbx.output(t, `git ls-files | grep -v '^\.git' | head -n 250 >/tmp/cat-list`)
	want := sbx.output(t, `/usr/bin/cat $(cat /tmp/cat-list) | sha256sum`)
	if got := sbx.output(t, `cat $(cat /tmp/cat-list) | sha256sum`); got != want {
		t.Fatalf("control, before the checkpoint: cat %q, /usr/bin/cat %q", got, want)
	}
	// Over a MiB of output, more than a pipe holds: the client is blocked
	// writing when the checkpoint comes.
	if n := strings.TrimSpace(sbx.output(t, `cat $(cat /tmp/cat-list) | wc -c`)); len(n) < 7 {
		t.Fatalf("the batch is %s bytes, not over a MiB", n)
	}
	sbx.output(t, `{ cat $(cat /tmp/cat-list) | { sleep 3; sha256sum; } >/tmp/inflight.out 2>&1 & } ; sleep 1`)
	woken := sbx.wake(t)
	if st := sbx.finish().NativeSearch; st == nil || st.Cat < 2 || st.Spooled == 0 {
		t.Fatalf("control, before the checkpoint: the server's counters %+v, want the cats through the spool", st)
	}
	if got := woken.output(t, `sleep 4; cat /tmp/inflight.out`); got != want {
		t.Errorf("the cat caught by the checkpoint: %q, /usr/bin/cat %q", got, want)
	}
	if got := woken.output(t, `cat $(cat /tmp/cat-list) | sha256sum`); got != want {
		t.Errorf("after the wake: cat %q, /usr/bin/cat %q", got, want)
	}
	if st := woken.finish().NativeSearch; st == nil || st.Cat != 1 || st.Spooled == 0 {
		t.Errorf("after the wake: the new server's counters %+v, want one cat through the spool", st)
	}
}
