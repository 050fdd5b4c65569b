package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"paseo.dev/paseo-policy/internal/testkit/fakemodel"
	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// The real Pi as a host deployment's own user (1001, not the image's 1000):
// it loads the extension the daemon wrote 0600 for itself, edits and
// creates in the workspace the daemon owns (0755/0644), and what it creates
// is the daemon user's on the host.
func TestPiAsDeploymentUser(t *testing.T) {
	const uid = 1001
	e := newEnv(t)
	erofs, err := json.Marshal(e.image.Erofs)
	if err != nil {
		t.Fatal(err)
	}
	sc := testbundle.New(t, testbundle.Options{Host: e.host, Rootfs: e.image.Rootfs, Profile: "pi-session",
		RegistryPatch: fmt.Sprintf(`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q,"erofs":%s},
			"deployments":{"host-alice":{"peers":{"uids":[0],"gids":[1000]},"user":{"uid":%d,"gid":%d}}}}`, e.image.Version, e.image.Digest, erofs, uid, uid),
		FactsPatch: fmt.Sprintf(`{"model":{"baseURL":%q},"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, modelURL, e.daemon.port),
		// The compiler reads the daemon's models.json (the model route's).
		Prepare: func(t testing.TB, host string) { writeAgentFiles(t, filepath.Join(host, "srv/paseo/state/pi-agent")) }})
	e.prepareState(t, sc)
	ws := sc.Workspace()
	ext := filepath.Join(sc.Host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs")
	write(t, ext, `import { writeFileSync } from "node:fs";
export default function () { writeFileSync(process.cwd() + "/EXTENSION-LOADED", "yes\n"); }
`)
	write(t, filepath.Join(ws, "existing.txt"), "orig\n")
	for _, d := range []string{ws, filepath.Join(sc.Host, "srv/paseo/state/pi-agent"), filepath.Join(sc.Host, "srv/paseo/state/pi-sessions/agent-7f3c"), filepath.Join(sc.Host, "srv/paseo/state/pi-cache/agent-7f3c"), filepath.Join(sc.Host, "srv/paseo/state/pi-git/agent-7f3c")} {
		chownTree(t, d, uid, uid)
	}
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ext, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ext, 0o600); err != nil {
		t.Fatal(err)
	}
	e.setScript(t,
		fakemodel.Bash(strings.Join([]string{
			`cd ` + ws,
			`echo uid=$(id -u)`,
			`echo edited >> existing.txt && echo edit-ok || echo edit-denied`,
			`echo new > created.txt && echo create-ok || echo create-denied`,
		}, "; ")),
		fakemodel.Text("done"),
	)
	p := e.launch(t, sc)
	p.turn(t, ctx(t), "edit and create")
	out := e.lastToolResult(t)
	p.stop(t)
	for _, want := range []string{fmt.Sprintf("uid=%d", uid), "edit-ok", "create-ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %s in %q", want, out)
		}
	}
	for _, name := range []string{"created.txt", "EXTENSION-LOADED", "existing.txt"} {
		fi, err := os.Stat(filepath.Join(ws, name))
		if err != nil {
			t.Errorf("%s: %v (EXTENSION-LOADED is written by the 0600 extension when Pi loads it)", name, err)
			continue
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != uid || st.Gid != uid {
			t.Errorf("%s is %d:%d on the host, want %d:%d", name, st.Uid, st.Gid, uid, uid)
		}
	}
}
