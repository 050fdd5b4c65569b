package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"paseo.dev/paseo-policy/policy/bundle"
)

// TestPiToolsNativeSearch: compiled with the registry's switch for the
// native search (deployments.<id>.search "native": grant search
// workspace), the sandbox's `rg` is the client, and
// on the bench tree (the pi-session profile, a linked worktree, a
// .gitignore) each search gives what the sandbox's own rg (/usr/bin/rg)
// gives, exit code included (lines sorted: rg's thread order is not
// fixed), Pi's grep tool's argv among them; the server answered them. A
// link the agent plants to a host file and names as a path is answered by
// the sandbox's rg (no such file there), never with the host file.
// Control: rg on the host follows the same link to the host file. The
// same for fd and find: listings equal to the sandbox's own fd's and
// find's (Pi's find tool's fd argv among them), a planted link to a host
// directory never listed (control: host find -L lists it).
func TestPiToolsNativeSearch(t *testing.T) {
	im := image(t)
	base := t.TempDir()
	host := filepath.Join(base, "host")
	r := genToolsRepo(t, host, 300)
	secret := filepath.Join(base, "host-secret.txt")
	write(t, secret, "HOSTSECRET in a host file\n")
	sbx := startToolsSandboxWith(t, im, host, r, "search", toolsSandboxOpts{search: true})

	if got, want := strings.TrimSpace(sbx.output(t, "command -v rg")), bundle.SearchDir+"/rg"; got != want {
		t.Fatalf("rg in the sandbox is %q, want the client %s", got, want)
	}
	// stdin is /dev/null, as for Pi's tools: the server's stdin is the
	// test's command pipe, which rg without a path would read.
	sorted := func(c string) string {
		return "{ " + c + "; } </dev/null 2>&1 | LC_ALL=C sort; echo rc=${PIPESTATUS[0]}"
	}
	searches := []string{
		`rg -c 'func ' .`,
		`rg -c 'func '`,
		`rg --no-config --line-number --color=never --hidden -- 'func [A-Z]' .`,
		`rg --no-config --json --line-number --color=never --hidden --glob '*.go' -- 'return' . | grep '"type":"match"'`,
		`rg -n return . | head -n 3 >/dev/null`, // a reader that stops early: rg exits 0 on the broken pipe
		`rg -n -i -w 'TODO' --glob '*.go'`,
		`rg -l -e import -e package src`,
		`rg --files`,
		`rg -C1 -m2 -tgo 'func' internal`,
		`rg zzz-never-there`,
		`rg -c func no-such-dir`,
		`cd src && rg -c func`,
		`ln -sf ` + secret + ` escape && rg -c HOSTSECRET escape`,
	}
	for _, s := range searches {
		client := sbx.output(t, sorted(s))
		real := sbx.output(t, sorted(strings.ReplaceAll(s, "rg ", "/usr/bin/rg ")))
		if client != real {
			t.Errorf("%s:\nthe client gave\n%s\nthe sandbox's rg\n%s", s, client, real)
		}
		if strings.Contains(client, "HOSTSECRET in") {
			t.Errorf("%s: the host file's content reached the sandbox:\n%s", s, client)
		}
	}
	// fd and find (Pi's find tool spawns fd from PATH): each listing the
	// same as the sandbox's own fd (/usr/local/bin/fd, what PATH finds
	// without the client) and find gives; those off the list are run by
	// them.
	for _, name := range []string{"fd", "find"} {
		if got := strings.TrimSpace(sbx.output(t, "command -v "+name)); got != bundle.SearchDir+"/"+name {
			t.Fatalf("%s in the sandbox is %q, want the client", name, got)
		}
	}
	listings := []struct {
		cmd     string
		forward bool
	}{
		{`fd -e go`, true},
		{`fd`, true},
		{`fd -HI -tf`, true},
		{`fd --color=never --hidden --glob --max-results 1001 -- '*.go' "$PWD"`, true}, // Pi's find tool
		{`fd --color=never --hidden --glob --max-results 1001 --full-path --ignore-case -- "$PWD/src/**/*.GO" "$PWD"`, true},
		{`fd -td internal`, true},
		{`cd src && fd -e go`, true},
		{`fd -x echo`, false},
		{`find . -name '*.go'`, true},
		{`find`, true},
		{`find . -path ./build -prune -o -type f -print`, true},
		{`find src -maxdepth 2 -type d`, true},
		{`find . -name '*.go' -newer .gitignore`, true},
		{`find . -name '*.go' -exec echo {} \;`, false},
		{`find -L . -name '*.go'`, false},
		{`ln -sfn ` + filepath.Dir(secret) + ` escape-dir && find escape-dir/ -name 'host-secret*'`, false},
	}
	wantListed := 0
	for _, l := range listings {
		client := sbx.output(t, sorted(l.cmd))
		realCmd := strings.NewReplacer("fd ", "/usr/local/bin/fd ", "find ", "/usr/bin/find ").Replace(l.cmd + " ")
		if l.cmd == "fd" || l.cmd == "find" {
			realCmd = map[string]string{"fd": "/usr/local/bin/fd", "find": "/usr/bin/find"}[l.cmd]
		}
		real := sbx.output(t, sorted(realCmd))
		if client != real {
			t.Errorf("%s:\nthe client gave\n%s\nthe sandbox's own\n%s", l.cmd, client, real)
		}
		if strings.Contains(client, "host-secret.txt") {
			t.Errorf("%s: the host's directory reached the sandbox:\n%s", l.cmd, client)
		}
		if l.forward {
			wantListed++
		}
	}
	// Control: where nothing protects, rg follows the planted link.
	cmd := exec.Command(filepath.Join(im.Rootfs, "usr/bin/rg"), "--no-config", "--follow", "HOSTSECRET", ".")
	cmd.Dir = r.ws
	if out, _ := cmd.Output(); !strings.Contains(string(out), "HOSTSECRET in") {
		t.Errorf("control: host rg --follow did not read the planted link's host file: %q", out)
	}
	cmd = exec.Command(filepath.Join(im.Rootfs, "usr/bin/find"), "-L", ".", "-name", "host-secret*")
	cmd.Dir = r.ws
	if out, _ := cmd.Output(); !strings.Contains(string(out), "host-secret.txt") {
		t.Errorf("control: host find -L did not list the planted link's host directory: %q", out)
	}
	os.Remove(filepath.Join(r.ws, "escape"))
	os.Remove(filepath.Join(r.ws, "escape-dir"))
	res := sbx.finish()
	// All but the planted links', which the sandbox's rg and find answer
	// (a link given as a path: the server answers "fallback"), and those
	// off the list, which the client runs itself; some of them by a jail
	// made ahead of its request (the server's warm one).
	if st := res.NativeSearch; st == nil || st.Answered < uint64(len(searches)-1+wantListed) || st.Fallback < 2 || st.Warm == 0 {
		t.Errorf("the search server's counters: %+v, want at least %d answered, some by a warm jail, and the links' fallbacks", st, len(searches)-1+wantListed)
	}
}
