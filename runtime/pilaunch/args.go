package pilaunch

import (
	"strings"

	"paseo.dev/paseo-policy/diag"
)

// Args is what Paseo passed on the command line, after the command's own
// words. Paseo's buildPiLaunch (providers/pi/runtime.ts) appends, in
// order: --mode rpc (unless present), --model <provider/id>, --thinking
// <level>, --session <file>, --append-system-prompt <text> and, on the
// current head, --mcp-config <path> (only when its probe found
// pi-mcp-adapter). Older heads passed --extension <path>; it is accepted.
type Args struct {
	Model              string
	Thinking           string
	Session            string
	AppendSystemPrompt string
	MCPConfig          string
	Extension          string
	// Version: --version/-v, which Paseo's diagnostic runs on the binary.
	Version bool
}

// Probe reports whether this is one of Paseo's probes: `pi --mode rpc` in
// some cwd with nothing else (isAvailable, getDiagnostic, listModels,
// detectMcpAdapter in agent.ts), never a session: a session always gets
// --thinking (Paseo defaults it to medium) or --session.
func (a Args) Probe() bool {
	return a.Model == "" && a.Thinking == "" && a.Session == "" && a.AppendSystemPrompt == "" && a.MCPConfig == "" && a.Extension == ""
}

// maxPrompt bounds the appended system prompt: it travels in the facts, in
// one supervisor frame of 64 KiB.
const maxPrompt = 32 << 10

var thinkingLevels = map[string]bool{"off": true, "minimal": true, "low": true, "medium": true, "high": true, "xhigh": true}

// ParseArgs reads Paseo's argv. Anything else, a flag twice or a flag
// without its value is refused: Pi itself would fail on an unknown flag,
// and the command must not guess what a flag it does not know grants.
func ParseArgs(argv []string) (Args, error) {
	var a Args
	var l diag.List
	seen := map[string]bool{}
	for i := 0; i < len(argv); i++ {
		flag, value, inline := strings.Cut(argv[i], "=")
		if flag == "--version" || flag == "-v" {
			if inline {
				l.Addf(CodeArgv, "argv["+itoa(i)+"]", "%s takes no value", flag)
			}
			a.Version = true
			continue
		}
		var dst *string
		switch flag {
		case "--mode":
		case "--model":
			dst = &a.Model
		case "--thinking":
			dst = &a.Thinking
		case "--session":
			dst = &a.Session
		case "--append-system-prompt":
			dst = &a.AppendSystemPrompt
		case "--mcp-config":
			dst = &a.MCPConfig
		case "--extension", "-e":
			flag = "--extension"
			dst = &a.Extension
		default:
			// The message names the flag, never a value: a value may be a
			// prompt or a path the user typed.
			name := flag
			if !strings.HasPrefix(name, "-") {
				name = "a positional word"
			}
			l.Addf(CodeArgv, "argv["+itoa(i)+"]", "%s is not a flag Paseo passes to its Pi command; refused", truncate(name, 64))
			continue
		}
		if !inline {
			if i+1 >= len(argv) {
				l.Addf(CodeArgv, "argv["+itoa(i)+"]", "%s needs a value", flag)
				break
			}
			i++
			value = argv[i]
		}
		if seen[flag] {
			l.Addf(CodeArgv, "argv["+itoa(i)+"]", "%s given twice", flag)
			continue
		}
		seen[flag] = true
		if flag == "--mode" {
			if value != "rpc" {
				l.Addf(CodeArgv, "argv["+itoa(i)+"]", "--mode must be rpc: the sandboxed Pi speaks RPC only")
			}
			continue
		}
		*dst = value
	}
	if a.Thinking != "" && !thinkingLevels[a.Thinking] {
		l.Addf(CodeArgv, "thinking", "not a Pi thinking level")
	}
	if len(a.AppendSystemPrompt) > maxPrompt {
		l.Addf(CodeArgv, "append-system-prompt", "longer than %d bytes", maxPrompt)
	}
	if a.Model != "" {
		if _, _, ok := splitModel(a.Model); !ok {
			l.Addf(CodeArgv, "model", "--model must be <provider>/<id>")
		}
	}
	if len(l) > 0 {
		return a, l
	}
	return a, nil
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
