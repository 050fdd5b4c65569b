package bundle

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSearchClientIsStrict: the client loads no module at run time (not
// even strict: each is a search of @INC and a read under gVisor), so it
// is checked here: compiled with strict, the searches' code (its DATA,
// compiled at run time by rg, fd and find) in its place, by the host's
// perl. Control: a script that breaks strict fails the same check.
func TestSearchClientIsStrict(t *testing.T) {
	perl, err := exec.LookPath("perl")
	if err != nil {
		t.Fatalf("the host's perl: %v", err)
	}
	c := SearchClient(GatewayName, 18091, "/srv/paseo/workspace/proj-feature")
	if bytes.Contains(c, []byte("\nuse ")) || bytes.Contains(c, []byte("require ")) || bytes.Contains(c, []byte("$!{")) {
		t.Errorf("the client loads a module")
	}
	main, data, ok := bytes.Cut(c, []byte("\neval do { local $/; <DATA> };\nreal();\n__DATA__\n"))
	if !ok {
		t.Fatal("the client has no DATA section where the tests expect it")
	}
	check := func(name string, src []byte) (string, bool) {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, src, 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(perl, "-Mstrict", "-c", p).CombinedOutput()
		return string(out), err == nil
	}
	inline := append(append(append([]byte{}, main...), '\n'), data...)
	if out, ok := check("client", inline); !ok {
		t.Errorf("the client does not compile with strict:\n%s", out)
	}
	if out, ok := check("broken", append(inline, []byte("\n$undeclared = 1;\n")...)); ok || !strings.Contains(out, "undeclared") {
		t.Errorf("control: a script that breaks strict passed: %s", out)
	}
}
