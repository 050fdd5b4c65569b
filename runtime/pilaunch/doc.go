// Package pilaunch is what `paseo-policy pi` does: Paseo names that command
// as its Pi command (agents.providers.pi.command, mode replace) and spawns
// it exactly as it would spawn `pi --mode rpc` (Paseo's
// providers/pi/cli-runtime.ts PiCliRuntime, runtime.ts buildPiLaunch). The
// command reads the operator's configuration (config.go), Paseo's argv
// (args.go) and Paseo's generated MCP config (mcpconfig.go), builds the
// trusted facts from those alone (facts.go), and asks the supervisor to run
// Pi in a sandbox, bridging Pi RPC byte for byte between its own stdio and
// the sandbox's (bridge.go). The session→sandbox mapping and the bridge
// cursor persist in the operator's bridge dir (store.go), so a command
// respawned for the same session after the daemon died reattaches to the
// live sandbox. It never compiles or launches anything itself, and never
// runs a Pi on the host; the one thing it runs on the host is the Git
// import's hardened git at turn ends (gitturn.go, runtime/gitimport).
package pilaunch

import "paseo.dev/paseo-policy/diag"

// The command's own diagnostic codes; the compiler's come through the
// supervisor's refusal unchanged.
const (
	// CodeArgv: Paseo's argv holds a flag the command does not know, or a
	// flag without its value.
	CodeArgv diag.Code = "PP-PI-ARGV"
	// CodeConfig: the operator configuration cannot be trusted or read
	// (owner, mode, a symlink, a group/world-writable parent, an unknown
	// field, a missing value).
	CodeConfig diag.Code = "PP-PI-CONFIG"
	// CodeMCPConfig: Paseo's generated MCP config cannot be read as Paseo
	// writes it, or names another MCP endpoint than the operator's route.
	CodeMCPConfig diag.Code = "PP-PI-MCP-CONFIG"
	// CodeSession: the session, the agent id or the model do not fit the
	// configuration (a session outside the sessions dir, two agent ids).
	CodeSession diag.Code = "PP-PI-SESSION"
	// CodeUnavailable: the supervisor cannot be reached or cannot run the
	// sandbox; nothing ran.
	CodeUnavailable diag.Code = "PP-PI-UNAVAILABLE"
	// CodeState: the bridge dir or a session record cannot be used safely.
	CodeState diag.Code = "PP-PI-STATE"
	// CodeGit: the cwd's `.git` file, or what it names, cannot be read as
	// Git writes it (a link, not a regular file, too long, malformed).
	CodeGit diag.Code = "PP-PI-GIT"
	// CodeGitImport: the turn-end import could not run where the agent
	// has no say (the worktree's branch unreadable, a detached HEAD, git
	// failing); the import's own refusals keep their PP-GIT-IMPORT-*
	// codes. Neither ends the session nor writes a ref.
	CodeGitImport diag.Code = "PP-PI-GIT-IMPORT"
)
