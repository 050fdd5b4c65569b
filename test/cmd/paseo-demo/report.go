package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher"
)

// report is out/demo.json (docs/demo.md describes every field).
type report struct {
	OK         bool                           `json:"ok"`
	Error      string                         `json:"error,omitempty"`
	Sandbox    string                         `json:"sandbox"`
	Runsc      runscReport                    `json:"runsc"`
	Image      imageReport                    `json:"image"`
	GVisor     gvisorReport                   `json:"gvisor"`
	Workspace  fileReport                     `json:"workspaceFile"`
	Granted    []grantReport                  `json:"granted"`
	Used       []evidence                     `json:"grantsUsed"`
	Blocked    []attempt                      `json:"attemptsBlocked"`
	Packets    map[string]uint64              `json:"packets"`
	Routes     map[string]launcher.RouteStats `json:"routes"`
	Git        *gitReport                     `json:"gitImport"`
	Exit       *int                           `json:"exitCode"`
	Transcript []string                       `json:"transcript"`
	Steps      []timing                       `json:"timings"`
	Left       []string                       `json:"leftBehind"`

	// Kept out of the JSON: the secrets it must not contain, explain's
	// text, and what the tools printed.
	apiKey, marker, explain, toolOut string
	sockDir                          string
}

type runscReport struct {
	Path   string `json:"path"`
	Digest string `json:"digest"`
}

type imageReport struct {
	Version string `json:"version"`
	Digest  string `json:"digest"`
}

type gvisorReport struct {
	Confirmed bool     `json:"confirmed"`
	Evidence  []string `json:"evidence"`
}

type fileReport struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	Owner   string `json:"owner"`
}

type grantReport struct {
	Kind    string `json:"kind"`
	Access  string `json:"access"`
	Subject string `json:"subject"`
	Fact    string `json:"fact"`
}

// evidence is a grant the turn used, and how that shows.
type evidence struct {
	Grant    string `json:"grant"`
	Evidence string `json:"evidence"`
}

// attempt is one thing the policy forbids, tried from inside.
type attempt struct {
	Attempt   string `json:"attempt"`
	Contained bool   `json:"contained"`
	Evidence  string `json:"evidence"`
}

type timing struct {
	Step   string `json:"step"`
	Millis int64  `json:"ms"`
}

// gvisorVersion is the fixed uname version string gVisor reports (as the
// probe knows it, internal/testkit/probe/identity.go).
const gvisorVersion = "#1 SMP Sun Jan 10 15:06:54 PST 2016"

// observe fills the report from the world after the turn: the file on the
// host, what the tools printed (as the model received it), the servers'
// and the filter's counts.
func (r *report) observe(sc *scene, w *world, stdout string) {
	r.Transcript = transcript(prompt, stdout)
	r.toolOut = toolResults(w)
	lines := map[string]string{}
	for _, l := range strings.Split(r.toolOut, "\n") {
		if k, v, ok := strings.Cut(l, ": "); ok {
			lines[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}

	// gVisor, from inside: its fixed uname version and its kernel log,
	// against the host's own uname.
	host := hostUname()
	if v := lines["uname -v"]; v == gvisorVersion && v != host {
		r.GVisor.Evidence = append(r.GVisor.Evidence, "uname -v in the sandbox: "+v+" (the host's: "+host+")")
	}
	if d := lines["dmesg"]; strings.Contains(d, "Starting gVisor") {
		r.GVisor.Evidence = append(r.GVisor.Evidence, "dmesg in the sandbox: "+d)
	}
	r.GVisor.Confirmed = len(r.GVisor.Evidence) == 2

	p := filepath.Join(sc.workspace(), demoFile)
	r.Workspace.Path = p
	if data, err := os.ReadFile(p); err == nil {
		r.Workspace.Content = string(data)
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			r.Workspace.Owner = fmt.Sprintf("%d:%d", st.Uid, st.Gid)
		}
	}

	authorized, overTLS := 0, 0
	for _, q := range w.fm.Requests() {
		if q.Authorized {
			authorized++
		}
		if q.TLS && q.ServerName == modelHost {
			overTLS++
		}
	}
	mcp, model := r.Routes["mcp"], r.Routes["model"]
	calls := w.mcp.ToolCalls()
	r.Used = []evidence{
		{"route model (the provider key added outside the sandbox, by the gateway proxy)", fmt.Sprintf("%d requests forwarded, %d over TLS to %s; the model answered %d carrying the key the route added; the sandbox's own key: %s",
			model.Forwarded, overTLS, modelHost, authorized, short(lines["model key"], 40))},
		{"workspace bind mount (rw)", fmt.Sprintf("%s on the host, %q, owner %s", demoFile, r.Workspace.Content, r.Workspace.Owner)},
		{"route mcp (the daemon's MCP, through the gateway proxy)", fmt.Sprintf("%d requests forwarded; the daemon ran %v", mcp.Forwarded, calls)},
	}

	_, outsideErr := os.Stat(sc.outside)
	ranCreate := false
	for _, c := range calls {
		ranCreate = ranCreate || c == "create_agent"
	}
	drops := r.Packets["drop-egress"]
	r.Blocked = []attempt{
		{"write outside the workspace (" + sc.outside + ")", os.IsNotExist(outsideErr), "nothing on the host; Pi: " + short(toolError(w, sc.outside), 100)},
		{"read the provider key in the sandbox ($FAKE_LLM_KEY, /proc/*/environ)", !strings.Contains(r.toolOut, r.apiKey) && !strings.Contains(stdout, r.apiKey) && lines["model key"] == "paseo-model-route; environments holding a key: 0",
			"the sandbox: " + short(lines["model key"], 60)},
		{"read the daemon user's SSH key (" + sc.canary + ")", !strings.Contains(r.toolOut, r.marker) && !strings.Contains(stdout, r.marker) && lines["read outside"] != "",
			"the sandbox: " + short(lines["read outside"], 100)},
		{"connect to another host (" + w.decoy.Addr.String() + ")", w.escapes(w.decoy) == 0 && strings.HasSuffix(lines["other host "+w.decoy.Addr.String()], "blocked"),
			fmt.Sprintf("the decoy there (which the uplink reaches) saw %d connections from the sandbox; the filter's drop-egress rule dropped %d packets", w.escapes(w.decoy), drops)},
		{"connect to the metadata address (" + w.metadata.Addr.String() + ")", w.escapes(w.metadata) == 0 && strings.HasSuffix(lines["metadata "+w.metadata.Addr.String()], "blocked"),
			fmt.Sprintf("the stand-in there (which the uplink reaches) saw %d connections from the sandbox", w.escapes(w.metadata))},
		{"call a daemon tool outside the MCP scope (create_agent), via Pi's MCP tool and raw HTTP", !ranCreate && mcp.OutOfScope > 0 && mcp.Filtered > 0,
			fmt.Sprintf("the route proxy hid %d tools from tools/list and refused %d requests out of scope; the daemon never ran it; raw: %s",
				mcp.Filtered, mcp.OutOfScope, short(lines["daemon tool create_agent"], 60))},
	}
}

// verdict lists every check that failed: the demo fails closed.
func (r *report) verdict() []string {
	var fails []string
	if !r.GVisor.Confirmed {
		fails = append(fails, fmt.Sprintf("gVisor not confirmed (evidence %v)", r.GVisor.Evidence))
	}
	if r.Workspace.Content != demoText || r.Workspace.Owner != "1000:1000" {
		fails = append(fails, fmt.Sprintf("workspace file %q owned %q", r.Workspace.Content, r.Workspace.Owner))
	}
	for _, a := range r.Blocked {
		if !a.Contained {
			fails = append(fails, "not contained: "+a.Attempt+": "+a.Evidence)
		}
	}
	if r.Packets["drop-egress"] == 0 {
		fails = append(fails, "the filter dropped no egress: the connection attempts did not reach it")
	}
	if r.Routes["model"].Forwarded == 0 {
		fails = append(fails, "the model route forwarded nothing")
	}
	if r.Routes["mcp"].Forwarded == 0 {
		fails = append(fails, "the MCP route forwarded nothing")
	}
	if r.Exit == nil || *r.Exit != 0 {
		fails = append(fails, fmt.Sprintf("Pi's exit %v", r.Exit))
	}
	if !r.Git.ok() {
		fails = append(fails, fmt.Sprintf("the agent's commit did not reach %s through the import: %+v", demoBranch, r.Git))
	}
	data, _ := json.Marshal(r)
	for _, secret := range []string{r.apiKey, r.marker} {
		if secret != "" && (strings.Contains(string(data), secret) || strings.Contains(r.explain, secret)) {
			fails = append(fails, "the report holds a secret")
		}
	}
	return fails
}

func (r *report) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func (r *report) print(w io.Writer) {
	section := func(title string) { fmt.Fprintf(w, "\n== %s\n", title) }
	fmt.Fprintf(w, "== sandbox %s: Pi %s (image %s), runsc %s\n", r.Sandbox, r.Image.Version, short(r.Image.Digest, 16), short(r.Runsc.Digest, 16))
	section("the turn (Pi's RPC output, shortened)")
	for _, l := range r.Transcript {
		// short trims leading space, so the indent is added after it.
		indent := len(l) - len(strings.TrimLeft(l, " "))
		fmt.Fprintln(w, "  "+strings.Repeat(" ", indent)+short(l, width-2-indent))
	}
	section("the file on the host (removed with the demo's tree at the end)")
	fmt.Fprintf(w, "  %s (owner %s):\n    %s", r.Workspace.Path, r.Workspace.Owner, r.Workspace.Content)
	if g := r.Git; g != nil {
		who := "as the daemon user"
		if g.AsRoot {
			who = "as root: the daemon user cannot reach this checkout"
		}
		section("the agent's commit, imported onto " + demoBranch + " (runtime/gitimport, " + who + ")")
		for _, u := range g.Updated {
			fmt.Fprintf(w, "  imported %s %s -> %s\n", u.Ref, short(u.Old, 12), short(u.New, 12))
		}
		for _, e := range g.Refused {
			fmt.Fprint(w, wrap("REFUSED "+e, "  ", "    "))
		}
		fmt.Fprintf(w, "  host git log --oneline %s:\n", demoBranch)
		for _, l := range g.Log {
			fmt.Fprintln(w, "    "+l)
		}
	}
	if r.explain != "" {
		section("what was granted (paseo-policy explain)")
		fmt.Fprint(w, r.explain)
	}
	section("gVisor")
	fmt.Fprintf(w, "  confirmed: %v\n", r.GVisor.Confirmed)
	for _, e := range r.GVisor.Evidence {
		fmt.Fprint(w, wrap(e, "  ", "    "))
	}
	section("what was used")
	for _, u := range r.Used {
		fmt.Fprint(w, wrap(u.Grant, "  ", "  "), wrap(u.Evidence, "      ", "      "))
	}
	section("what was blocked")
	for _, a := range r.Blocked {
		mark := "contained"
		if !a.Contained {
			mark = "NOT CONTAINED"
		}
		fmt.Fprint(w, wrap("["+mark+"] "+a.Attempt, "  ", "    "), wrap(a.Evidence, "      ", "      "))
	}
	section("packet counters (nftables: allow rules count new connections, drop rules packets)")
	tags := make([]string, 0, len(r.Packets))
	for t := range r.Packets {
		tags = append(tags, t)
	}
	sort.Strings(tags)
	for _, t := range tags {
		fmt.Fprintf(w, "  %-22s %d\n", t, r.Packets[t])
	}
	for name, s := range r.Routes {
		fmt.Fprintf(w, "  route %-16s forwarded %d, refused %d (out of scope %d), tools hidden %d\n", name, s.Forwarded, s.Refused, s.OutOfScope, s.Filtered)
	}
	section("timings")
	var total int64
	for _, s := range r.Steps {
		fmt.Fprintf(w, "  %-18s %6d ms\n", s.Step, s.Millis)
		total += s.Millis
	}
	fmt.Fprintf(w, "  %-18s %6d ms\n", "total", total)
	if len(r.Left) > 0 {
		section("LEFT BEHIND")
		for _, l := range r.Left {
			fmt.Fprintln(w, "  "+l)
		}
	}
}

// width is what the demo's own lines fit in (an ordinary terminal).
const width = 100

// wrap breaks s at spaces into lines of at most width columns (a word
// longer than that keeps its own line), the first line after first, the
// others after rest.
func wrap(s, first, rest string) string {
	var b strings.Builder
	line := first
	for i, word := range strings.Fields(s) {
		if i > 0 && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = rest + word
			continue
		}
		if i > 0 {
			line += " "
		}
		line += word
	}
	b.WriteString(line + "\n")
	return b.String()
}

func short(s string, n int) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "\n", " "))
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}
