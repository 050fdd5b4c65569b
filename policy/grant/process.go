package grant

import (
	"errors"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func process(s *specs.Spec) *specs.Process {
	if s.Process == nil {
		s.Process = &specs.Process{}
	}
	return s.Process
}

// Argv is one or more words of the process's argv, appended in plan order.
// Repeated argv keys are matched by occurrence in a diff.
type Argv struct {
	Words []string
	Provenance
}

func (Argv) Kind() Kind              { return KindProcess }
func (Argv) Subject() string         { return "argv" }
func (g Argv) Key() string           { return key(g) }
func (Argv) Access() Access          { return Set }
func (Argv) Restricts() bool         { return false }
func (Argv) Against(Grant) Direction { return Changed }
func (g Argv) Apply(s *specs.Spec) error {
	p := process(s)
	p.Args = append(p.Args, g.Words...)
	return nil
}
func (g Argv) Validate() error {
	if len(g.Words) == 0 {
		return errors.New("an argv grant holds at least one word")
	}
	return nil
}

// Cwd is the process's working directory.
type Cwd struct {
	Dir string
	Provenance
}

func (Cwd) Kind() Kind                  { return KindProcess }
func (Cwd) Subject() string             { return "cwd" }
func (g Cwd) Key() string               { return key(g) }
func (Cwd) Access() Access              { return Set }
func (Cwd) Restricts() bool             { return false }
func (Cwd) Against(Grant) Direction     { return Changed }
func (g Cwd) Apply(s *specs.Spec) error { process(s).Cwd = g.Dir; return nil }
func (g Cwd) Validate() error {
	if !absolute(g.Dir) {
		return errors.New("cwd must be absolute")
	}
	return nil
}

// NoNewPrivileges keeps setuid binaries and file capabilities from raising
// privilege.
type NoNewPrivileges struct {
	On bool
	Provenance
}

func (NoNewPrivileges) Kind() Kind      { return KindProcess }
func (NoNewPrivileges) Subject() string { return "noNewPrivileges" }
func (g NoNewPrivileges) Key() string   { return key(g) }
func (NoNewPrivileges) Access() Access  { return Set }
func (NoNewPrivileges) Restricts() bool { return true }
func (g NoNewPrivileges) Against(old Grant) Direction {
	return flagDirection(old.(NoNewPrivileges).On, g.On)
}
func (g NoNewPrivileges) Apply(s *specs.Spec) error { process(s).NoNewPrivileges = g.On; return nil }
func (NoNewPrivileges) Validate() error             { return nil }

// Terminal says whether the process gets a terminal; Pi RPC needs pipes.
type Terminal struct {
	On bool
	Provenance
}

func (Terminal) Kind() Kind                  { return KindProcess }
func (Terminal) Subject() string             { return "terminal" }
func (g Terminal) Key() string               { return key(g) }
func (Terminal) Access() Access              { return Set }
func (Terminal) Restricts() bool             { return true }
func (Terminal) Against(Grant) Direction     { return Changed }
func (g Terminal) Apply(s *specs.Spec) error { process(s).Terminal = g.On; return nil }
func (Terminal) Validate() error             { return nil }

// Capabilities is the process's Linux capabilities: none, in every set.
// It is the only capability grant there is; anything else is refused.
type Capabilities struct {
	Provenance
}

func (Capabilities) Kind() Kind              { return KindProcess }
func (Capabilities) Subject() string         { return "capabilities" }
func (g Capabilities) Key() string           { return key(g) }
func (Capabilities) Access() Access          { return Set }
func (Capabilities) Restricts() bool         { return true }
func (Capabilities) Against(Grant) Direction { return Changed }
func (Capabilities) Validate() error         { return nil }
func (Capabilities) Apply(s *specs.Spec) error {
	process(s).Capabilities = &specs.LinuxCapabilities{
		Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{},
	}
	return nil
}

// Identity is the process's uid or gid; never 0.
type Identity struct {
	Field string // uid | gid
	ID    uint32
	Provenance
}

func (Identity) Kind() Kind              { return KindIdentity }
func (g Identity) Subject() string       { return g.Field }
func (g Identity) Key() string           { return key(g) }
func (Identity) Access() Access          { return Set }
func (Identity) Restricts() bool         { return false }
func (Identity) Against(Grant) Direction { return Changed }
func (g Identity) Apply(s *specs.Spec) error {
	if err := g.Validate(); err != nil {
		return err
	}
	if g.Field == "uid" {
		process(s).User.UID = g.ID
	} else {
		process(s).User.GID = g.ID
	}
	return nil
}
func (g Identity) Validate() error {
	if g.Field != "uid" && g.Field != "gid" {
		return errors.New("identity is a uid or a gid")
	}
	if g.ID == 0 {
		return errors.New("identity must be a non-zero id")
	}
	return nil
}

// Env is one environment variable, NAME=value, in plan order.
type Env struct {
	Name, Value string
	Provenance
}

func (Env) Kind() Kind              { return KindEnv }
func (g Env) Subject() string       { return g.Name }
func (g Env) Key() string           { return key(g) }
func (Env) Access() Access          { return Set }
func (Env) Restricts() bool         { return false }
func (Env) Against(Grant) Direction { return Changed }
func (g Env) Apply(s *specs.Spec) error {
	p := process(s)
	p.Env = append(p.Env, g.Name+"="+g.Value)
	return nil
}
func (g Env) Validate() error {
	if g.Name == "" || strings.ContainsAny(g.Name, "=\x00") || strings.Contains(g.Value, "\x00") {
		return errors.New("env name must be non-empty without = or NUL, and the value without NUL")
	}
	return nil
}

// Hostname is the UTS hostname.
type Hostname struct {
	Name string
	Provenance
}

func (Hostname) Kind() Kind                  { return KindHostname }
func (Hostname) Subject() string             { return "hostname" }
func (g Hostname) Key() string               { return key(g) }
func (Hostname) Access() Access              { return Set }
func (Hostname) Restricts() bool             { return true }
func (Hostname) Against(Grant) Direction     { return Changed }
func (g Hostname) Apply(s *specs.Spec) error { s.Hostname = g.Name; return nil }
func (g Hostname) Validate() error {
	if g.Name == "" {
		return errors.New("hostname must not be empty")
	}
	return nil
}

// Namespace is a fresh namespace of one type.
type Namespace struct {
	Type string // pid, ipc, uts, mount, network, …
	Provenance
}

func (Namespace) Kind() Kind              { return KindNamespace }
func (g Namespace) Subject() string       { return g.Type }
func (g Namespace) Key() string           { return key(g) }
func (Namespace) Access() Access          { return New }
func (Namespace) Restricts() bool         { return true }
func (Namespace) Against(Grant) Direction { return Changed }
func (g Namespace) Apply(s *specs.Spec) error {
	l := linux(s)
	l.Namespaces = append(l.Namespaces, specs.LinuxNamespace{Type: specs.LinuxNamespaceType(g.Type)})
	return nil
}
func (g Namespace) Validate() error {
	switch specs.LinuxNamespaceType(g.Type) {
	case specs.PIDNamespace, specs.NetworkNamespace, specs.MountNamespace, specs.IPCNamespace,
		specs.UTSNamespace, specs.UserNamespace, specs.CgroupNamespace, specs.TimeNamespace:
		return nil
	}
	return errors.New("unknown namespace type")
}

func linux(s *specs.Spec) *specs.Linux {
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	return s.Linux
}

// flagDirection compares a restricting flag: turning it off widens.
func flagDirection(oldOn, newOn bool) Direction {
	switch {
	case oldOn && !newOn:
		return Widened
	case !oldOn && newOn:
		return Narrowed
	}
	return Changed
}
