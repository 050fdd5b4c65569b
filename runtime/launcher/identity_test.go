package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
)

// identityScript edits a workspace file the daemon user owns, creates one,
// and reads the generated extension Paseo writes 0600 for the daemon user.
// HOME and the agent-dir projection are tmpfs the sandbox user must own.
func identityScript(ws, ext, agentDir string) string {
	return `echo uid=$(/bin/busybox id -u) gid=$(/bin/busybox id -g)
echo edited >> ` + ws + `/existing.txt && echo edit=ok || echo edit=denied
echo data > ` + ws + `/made-by-agent && echo create=ok || echo create=denied
/bin/busybox cat ` + ext + ` >/dev/null 2>&1 && echo extension=readable || echo extension=unreadable
/bin/busybox touch /home/sandbox/x && echo home=ok || echo home=denied
/bin/busybox touch ` + agentDir + `/x && echo agentdir=ok || echo agentdir=denied`
}

// ownTree gives the workspace (0755, a file 0644 in it) and the extension
// (0600) to uid:gid, as a daemon running as that user leaves them.
func ownTree(t *testing.T, ws, ext string, uid, gid int) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(ws, "existing.txt"), []byte("orig\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		path string
		mode os.FileMode
	}{{ws, 0o755}, {filepath.Join(ws, "existing.txt"), 0o644}, {ext, 0o600}} {
		if err := os.Chown(o.path, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(o.path, o.mode); err != nil {
			t.Fatal(err)
		}
	}
}

func assertOwned(t *testing.T, p string, uid, gid uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil || st.Uid != uid || st.Gid != gid {
		t.Errorf("%s on the host: %v, owner %d:%d, want %d:%d", p, err, st.Uid, st.Gid, uid, gid)
	}
}

// A host daemon that is not uid 1000: with deployments.<id>.user its
// sandboxes run as its uid, edit and create in the workspace it owns, leave
// what they create owned by it, and read the extension it wrote 0600. The
// same deployment without the field runs as the image's uid and can do none
// of it (the control that shows the test can fail).
func TestDeploymentUserOwnsHostWorkspace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		patch string
		want  []string
	}{
		{"deployment user 1001", `{"deployments":{"host-alice":{"user":{"uid":1001,"gid":1001}}}}`,
			[]string{"uid=1001 gid=1001", "edit=ok", "create=ok", "extension=readable", "home=ok", "agentdir=ok"}},
		{"image uid under a daemon of 1001", ``,
			[]string{"uid=1000 gid=1000", "edit=denied", "create=denied", "extension=unreadable", "home=ok", "agentdir=ok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := filepath.Join(t.TempDir(), "host")
			ws := host + "/srv/paseo/workspace/proj-feature"
			ext := host + "/srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"
			sc := testbundle.New(t, testbundle.Options{Host: host, Argv: testbundle.Script(identityScript(ws, ext, host+"/srv/paseo/state/pi-agent")), RegistryPatch: tc.patch})
			ownTree(t, ws, ext, 1001, 1001)
			s := sceneSandbox(sc)
			_, out, stderr, err := s.launch(t, staticSecret("v"))
			if err != nil {
				t.Fatalf("launch: %v %s", err, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s\n%s", w, out, stderr)
				}
			}
			if tc.patch != "" {
				assertOwned(t, filepath.Join(ws, "made-by-agent"), 1001, 1001)
				assertOwned(t, filepath.Join(ws, "existing.txt"), 1001, 1001)
			}
			s.assertClean(t)
		})
	}
}

// The official Docker deployment as 1000:1000: its sandboxes run as the
// container's paseo user even when the image was built for another uid, and
// what they create in the mapped workspace belongs to 1000 on the host.
func TestDeploymentUserDocker(t *testing.T) {
	host := filepath.Join(t.TempDir(), "host")
	ws := host + "/srv/paseo-docker/workspace/app"
	ext := host + "/srv/paseo-docker/tmp/paseo-pi-extension-b2/paseo-integration.mjs"
	// The script sees container paths: the facts' view.
	script := identityScript("/workspace/app", "/tmp/paseo-pi-extension-b2/paseo-integration.mjs", "/paseo-state/pi-agent")
	sc := testbundle.New(t, testbundle.Options{Host: host, Argv: testbundle.Script(script),
		RegistryPatch: `{"image":{"uid":1234,"gid":1234},"deployments":{"docker-official":{"user":{"uid":1000,"gid":1000}}}}`,
		FactsPatch: `{"deployment":{"id":"docker-official"},"agent":{"id":"agent-b2"},
			"workspace":{"cwd":"/workspace/app","git":null},
			"state":{"agentDir":"/paseo-state/pi-agent","sessionDir":"/paseo-state/pi-sessions/agent-b2","cacheDir":"/paseo-state/pi-cache/agent-b2"},
			"launch":{"extension":"/tmp/paseo-pi-extension-b2/paseo-integration.mjs","mcpConfig":"/tmp/paseo-pi-mcp-b2/mcp.json"}}`})
	ownTree(t, ws, ext, 1000, 1000)
	s := sceneSandbox(sc)
	secret := func(deployment, ref string) ([]byte, error) {
		if deployment != "docker-official" || ref != "alice/fake-llm" {
			return nil, errors.New("unknown secret " + ref)
		}
		return []byte("v"), nil
	}
	_, out, stderr, err := s.launch(t, secret)
	if err != nil {
		t.Fatalf("launch: %v %s", err, stderr)
	}
	for _, w := range []string{"uid=1000 gid=1000", "edit=ok", "create=ok", "extension=readable", "home=ok", "agentdir=ok"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s\n%s", w, out, stderr)
		}
	}
	assertOwned(t, filepath.Join(ws, "made-by-agent"), 1000, 1000)
	s.assertClean(t)
}
