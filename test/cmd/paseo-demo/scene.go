package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"paseo.dev/paseo-policy/internal/testkit/testtree"
)

// scene is the demo's host side: the reference tree (testdata/base) built
// beneath dir/host, which stands for /, and the facts and registry that
// name it, as a Paseo daemon and its operator would write them.
type scene struct {
	host               string // stands for / on the host
	facts, registry    []byte
	factsFile, regFile string
	// canary is a file outside the workspace the sandbox must not read (the
	// daemon user's SSH key); outside a path beside the workspace it must
	// not write.
	canary, outside string
	// gitAsRoot: the daemon user cannot reach the checkout (git.go).
	gitAsRoot bool
}

func (s *scene) workspace() string { return filepath.Join(s.host, "srv/paseo/workspace/proj-feature") }

// layout names the scene's paths beneath dir; build makes them.
func layout(dir string) *scene {
	s := &scene{host: filepath.Join(dir, "host")}
	s.canary = filepath.Join(s.host, "home/alice/.ssh/id_ed25519")
	s.outside = filepath.Join(filepath.Dir(s.workspace()), "neighbour", "planted.txt")
	s.factsFile, s.regFile = filepath.Join(dir, "facts.json"), filepath.Join(dir, "registry.json")
	return s
}

// build makes the tree and writes facts.json and registry.json. modelURL
// is the model endpoint the facts name; mcpPort the port of the daemon's
// MCP stand-in on loopback; marker the canary's content.
func (s *scene) build(repo string, img imageInfo, modelURL string, mcpPort int, marker string) error {
	read := func(rel string) ([]byte, error) { return os.ReadFile(filepath.Join(repo, rel)) }
	tree, err := read("testdata/base/tree.txt")
	if err != nil {
		return err
	}
	// Every absolute path of the tree, and of paths in its files' text,
	// moves beneath the demo's host dir.
	spec := strings.NewReplacer(" /srv/", " "+s.host+"/srv/", " /home/", " "+s.host+"/home/").Replace(string(tree))
	if _, err := testtree.Build("/", spec); err != nil {
		return err
	}
	prefix := func(b []byte) []byte {
		b = bytes.ReplaceAll(b, []byte(`"/srv/`), []byte(`"`+s.host+`/srv/`))
		return bytes.ReplaceAll(b, []byte(`"/home/`), []byte(`"`+s.host+`/home/`))
	}
	facts, err := read("testdata/base/facts.json")
	if err != nil {
		return err
	}
	reg, err := read("testdata/base/registry.json")
	if err != nil {
		return err
	}
	erofs, err := json.Marshal(img.Erofs)
	if err != nil {
		return err
	}
	// The model is the fake on its test host (plain HTTP, port 8080); the
	// daemon's MCP endpoint is the stand-in on loopback. The supervisor's
	// peer is root (the demo), the image is the pinned one.
	if s.facts, err = testtree.MergePatch(prefix(facts), []byte(fmt.Sprintf(
		`{"model":{"baseURL":%q},"mcp":{"agentsURL":"http://127.0.0.1:%d/mcp/agents"}}`, modelURL, mcpPort))); err != nil {
		return err
	}
	if s.registry, err = testtree.MergePatch(prefix(reg), []byte(fmt.Sprintf(
		`{"network":{"mode":"sandbox"},"image":{"version":%q,"digest":%q,"rootfs":%q,"erofs":%s},"deployments":{"host-alice":{"peers":{"uids":[0],"gids":[0]}}}}`,
		img.Version, img.Digest, img.Rootfs, erofs))); err != nil {
		return err
	}
	if err := os.WriteFile(s.factsFile, s.facts, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(s.regFile, s.registry, 0o644); err != nil {
		return err
	}
	return s.daemonState(modelURL, marker)
}

// daemonState writes what the Paseo daemon prepares before a launch: Pi's
// models.json (the fake provider, its key as a placeholder the launcher
// fills), settings.json loading the image's pi-mcp-adapter, the
// integration extension; the sandbox user owns the workspace and the
// agent's state. It plants the canary.
func (s *scene) daemonState(modelURL, marker string) error {
	agent := filepath.Join(s.host, "srv/paseo/state/pi-agent")
	files := map[string]string{
		filepath.Join(agent, "models.json"): `{"providers":{"fake":{"baseUrl":"` + modelURL + `","api":"openai-completions",
 "apiKey":"$FAKE_LLM_KEY","compat":{"supportsDeveloperRole":false},
 "models":[{"id":"fake-1","input":["text"],"contextWindow":128000,"maxTokens":16384}]}}}`,
		filepath.Join(agent, "settings.json"):                                                 `{"packages":["/opt/pi/node_modules/pi-mcp-adapter"]}`,
		filepath.Join(s.host, "srv/paseo/launch/paseo-pi-extension-a1/paseo-integration.mjs"): "export default function () {}\n",
	}
	files[s.canary] = marker + "\n"
	for p, text := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return err
		}
		if err := os.Chmod(p, 0o644); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(s.outside), 0o755); err != nil {
		return err
	}
	// The repository is the daemon user's, as the workspace is: the
	// sandbox's start script seeds its private Git dir from it.
	for _, d := range []string{s.workspace(), filepath.Join(s.host, "srv/paseo/repos"), agent, filepath.Join(s.host, "srv/paseo/state/pi-sessions/agent-7f3c"), filepath.Join(s.host, "srv/paseo/state/pi-cache/agent-7f3c"), filepath.Join(s.host, "srv/paseo/state/pi-git/agent-7f3c")} {
		if err := chownTree(d, 1000, 1000); err != nil {
			return err
		}
	}
	return s.seedRepo()
}

func chownTree(root string, uid, gid int) error {
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
