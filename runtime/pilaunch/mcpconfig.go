package pilaunch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
)

// maxMCPConfigBytes bounds Paseo's generated MCP config (a few hundred
// bytes: one server per entry of the agent's MCP servers).
const maxMCPConfigBytes = 64 << 10

// PaseoMCP is what the command takes from Paseo's generated MCP config
// (agent.ts createPiMcpConfigFile: {"mcpServers":{name:{url, headers, auth,
// oauth}}}): the entry for Paseo's own agent MCP listener, by the operator's
// route.
type PaseoMCP struct {
	// AgentID is the URL's callerAgentId: Paseo's agent id.
	AgentID string
	// Token is this daemon run's bearer. It goes to the supervisor
	// (mcpToken) and nowhere else: not the facts, a file or an error.
	Token string
}

// ReadMCPConfig opens Paseo's file once without following symlinks (the
// daemon wrote it: it must be a regular file of the calling user), and
// picks the server whose URL is the operator's agentsURL. Other servers
// Paseo lists are left out: the sandbox reaches nothing but Paseo's route.
func ReadMCPConfig(path string, route *MCPRoute) (PaseoMCP, error) {
	bad := func(format string, a ...any) error {
		return diag.List{{Code: CodeMCPConfig, Path: "launch.mcpConfig", Message: fmt.Sprintf(format, a...)}}
	}
	if route == nil {
		return PaseoMCP{}, bad("Paseo passed an MCP config but the operator configured no MCP route (config.mcp)")
	}
	if code, msg := pathform.Check(path); code != "" {
		return PaseoMCP{}, bad("%s", msg)
	}
	data, err := readOwn(path, maxMCPConfigBytes)
	if err != nil {
		return PaseoMCP{}, bad("%v", err)
	}
	var file struct {
		MCPServers map[string]struct {
			URL     string            `json:"url"`
			Headers map[string]string `json:"headers"`
		} `json:"mcpServers"`
	}
	if err := json.NewDecoder(bytes.NewReader(data)).Decode(&file); err != nil {
		return PaseoMCP{}, bad("not JSON of Paseo's MCP config")
	}
	want, err := url.Parse(route.AgentsURL)
	if err != nil {
		return PaseoMCP{}, bad("config.mcp.agentsURL does not parse")
	}
	names := make([]string, 0, len(file.MCPServers))
	for n := range file.MCPServers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := file.MCPServers[n]
		u, err := url.Parse(s.URL)
		if err != nil || u.Scheme != want.Scheme || u.Host != want.Host || u.Path != want.Path {
			continue
		}
		var m PaseoMCP
		q := u.Query()
		if ids := q["callerAgentId"]; len(ids) == 1 && idRE.MatchString(ids[0]) {
			m.AgentID = ids[0]
		} else {
			return PaseoMCP{}, bad("server %q: the URL's callerAgentId is missing, repeated or not an id", n)
		}
		for k, v := range s.Headers {
			if strings.EqualFold(k, "authorization") {
				tok, ok := strings.CutPrefix(v, "Bearer ")
				if !ok || !printable(tok) {
					return PaseoMCP{}, bad("server %q: the Authorization header is not a bearer token", n)
				}
				m.Token = tok
			}
		}
		if m.Token == "" {
			return PaseoMCP{}, bad("server %q: no bearer token", n)
		}
		return m, nil
	}
	return PaseoMCP{}, bad("no server in it is Paseo's agent MCP listener (config.mcp.agentsURL)")
}

// printable: 1-4096 printable ASCII, no spaces (the supervisor's mcpToken).
func printable(s string) bool {
	if len(s) == 0 || len(s) > 4096 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// readOwn reads a regular file owned by the calling user, opened from /
// with no symlink followed in any component, bounded.
func readOwn(path string, max int) ([]byte, error) {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimPrefix(path, "/"), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if err == unix.ELOOP {
			return nil, fmt.Errorf("a component is a symlink; the file is opened without following links")
		}
		return nil, fmt.Errorf("open: %v", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("not a regular file")
	}
	if int(st.Uid) != unix.Geteuid() {
		return nil, fmt.Errorf("not owned by the daemon user")
	}
	if st.Size > int64(max) {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	buf := make([]byte, max+1)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err != nil {
			return nil, err
		}
		if m == 0 {
			break
		}
		n += m
	}
	if n > max {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	return buf[:n], nil
}
