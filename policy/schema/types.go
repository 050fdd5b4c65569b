package schema

// The Go shapes of the CUE definitions. JSON names match the CUE fields; the
// CUE is the contract, these only carry decoded values.

// Facts is what the daemon knows about one agent launch.
type Facts struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Deployment struct {
		ID string `json:"id"`
	} `json:"deployment"`
	Agent struct {
		ID      string `json:"id"`
		Profile string `json:"profile"`
	} `json:"agent"`
	Workspace  Workspace  `json:"workspace"`
	Model      Model      `json:"model"`
	Credential Credential `json:"credential"`
	MCP        *MCP       `json:"mcp,omitempty"`
	State      State      `json:"state"`
	Launch     Launch     `json:"launch"`
}

type Workspace struct {
	ID  string `json:"id"`
	Cwd string `json:"cwd"`
	Git *Git   `json:"git,omitempty"`
}

type Git struct {
	Gitdir     string   `json:"gitdir"`
	Commondir  string   `json:"commondir,omitempty"`
	Alternates []string `json:"alternates,omitempty"`
	Write      bool     `json:"write"`
}

type Model struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
	BaseURL  string `json:"baseURL"`
	Thinking string `json:"thinking,omitempty"`
	// API is the provider API Pi speaks to the model (models.json's api),
	// for the model route; the daemon's models.json may say it instead.
	API string `json:"api,omitempty"`
}

type Credential struct {
	Mode        string   `json:"mode"`
	Env         string   `json:"env,omitempty"`
	SecretRef   string   `json:"secretRef,omitempty"`
	AuthFile    string   `json:"authFile,omitempty"`
	RefreshURLs []string `json:"refreshURLs,omitempty"`
}

type MCP struct {
	AgentsURL string `json:"agentsURL"`
	TokenRef  string `json:"tokenRef"`
}

type State struct {
	AgentDir   string `json:"agentDir"`
	SessionDir string `json:"sessionDir"`
	CacheDir   string `json:"cacheDir,omitempty"`
	GitStore   string `json:"gitStore,omitempty"`
}

type Launch struct {
	Extension string `json:"extension"`
	MCPConfig string `json:"mcpConfig,omitempty"`
	Session   string `json:"session,omitempty"`
	// AppendSystemPrompt is the text Paseo passes with
	// --append-system-prompt; the profile's append-system-prompt slot.
	AppendSystemPrompt string `json:"appendSystemPrompt,omitempty"`
}

// Registry is the operator's root-owned configuration.
type Registry struct {
	APIVersion  string                `json:"apiVersion"`
	Kind        string                `json:"kind"`
	Deployments map[string]Deployment `json:"deployments"`
	Image       Image                 `json:"image"`
	Network     Network               `json:"network"`
	Limits      Limits                `json:"limits"`
	Supervisor  Supervisor            `json:"supervisor"`
}

type Deployment struct {
	Topology string `json:"topology"`
	Peers    *Peers `json:"peers,omitempty"`
	Roots    Roots  `json:"roots"`
	// User is the uid/gid the deployment's sandboxes run as; nil means
	// the image's.
	User     *User     `json:"user,omitempty"`
	Mappings []Mapping `json:"mappings,omitempty"`
	Daemon   *Daemon   `json:"daemon,omitempty"`
	// MCP narrows the profile's MCP scope (registry.cue).
	MCP *MCPNarrow `json:"mcp,omitempty"`
	// Model holds the model route's grants beyond Pi's own requests
	// (registry.cue).
	Model *ModelGrants `json:"model,omitempty"`
	// MaxSandboxes is the supervisor's cap on the deployment's sandboxes
	// (the CUE default fills it; see registry.cue).
	MaxSandboxes int `json:"maxSandboxes"`
	// HibernateAfterSeconds is the supervisor's idle hibernation (0: off;
	// registry.cue).
	HibernateAfterSeconds int `json:"hibernateAfterSeconds,omitempty"`
	// FSMonitor is "on", "off" or "" (the profile's default; registry.cue).
	FSMonitor string `json:"fsmonitor,omitempty"`
	// Search is "native", "sandbox" or "" (in the sandbox; registry.cue).
	Search string `json:"search,omitempty"`
}

// ModelGrants are a deployment's model route grants: the provider-side
// tools (grant.ModelHostedTools) its requests may use.
type ModelGrants struct {
	HostedTools []string `json:"hostedTools,omitempty"`
}

// MCPNarrow is a deployment's narrowing of the MCP scope; a nil list
// keeps the profile's, an empty one keeps nothing (so no omitempty: the
// two must not encode alike).
type MCPNarrow struct {
	Methods []string `json:"methods"`
	Tools   []string `json:"tools"`
}

// MCPScope is a profile's MCP scope.
type MCPScope struct {
	Methods []string `json:"methods"`
	Tools   []string `json:"tools"`
}

type Peers struct {
	UIDs []int `json:"uids"`
	GIDs []int `json:"gids"`
}

type Roots struct {
	Workspace []string `json:"workspace"`
	State     []string `json:"state"`
	Launch    []string `json:"launch"`
}

type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type Mapping struct {
	Container string `json:"container"`
	Host      string `json:"host"`
}

type Daemon struct {
	Home        string `json:"home,omitempty"`
	PaseoHome   string `json:"paseoHome,omitempty"`
	MCPUpstream string `json:"mcpUpstream,omitempty"`
}

type Image struct {
	Version string  `json:"version"`
	Rootfs  string  `json:"rootfs"`
	Digest  string  `json:"digest"`
	UID     uint32  `json:"uid"`
	GID     uint32  `json:"gid"`
	Path    string  `json:"path"`
	Erofs   []Erofs `json:"erofs,omitempty"`
}

// Erofs is one EROFS file of an image directory.
type Erofs struct {
	Dir    string `json:"dir"`
	File   string `json:"file"`
	Digest string `json:"digest"`
}

type Network struct {
	Mode     string `json:"mode"`
	DNS      string `json:"dns"`
	Resolver string `json:"resolver,omitempty"`
}

type Limits struct {
	MemoryBytes int64   `json:"memoryBytes"`
	Pids        int64   `json:"pids"`
	Nproc       uint64  `json:"nproc"`
	Nofile      uint64  `json:"nofile"`
	CPUs        float64 `json:"cpus"`
	TmpfsBytes  int64   `json:"tmpfsBytes"`
	OutputBytes int64   `json:"outputBytes"`
	WallSeconds int64   `json:"wallSeconds"`
}

type Supervisor struct {
	Socket    string `json:"socket"`
	RunscRoot string `json:"runscRoot"`
	StateDir  string `json:"stateDir"`
}

// Profile is a reviewed launch profile.
type Profile struct {
	Name    string            `json:"name"`
	Summary string            `json:"summary"`
	Argv    []Word            `json:"argv"`
	Env     map[string]string `json:"env"`
	Mounts  []FixedMount      `json:"mounts"`
	State   struct {
		AgentDir   string   `json:"agentDir"`
		AgentFiles []string `json:"agentFiles"`
		SessionDir string   `json:"sessionDir"`
	} `json:"state"`
	Limits map[string]float64 `json:"limits"`
	Egress []string           `json:"egress"`
	MCP    *MCPScope          `json:"mcp,omitempty"`
	// ModelRoute lists, per provider API, the "METHOD /path" requests the
	// model route forwards (paths below model.baseURL's).
	ModelRoute map[string][]string `json:"modelRoute,omitempty"`
	// ModelHeaders lists, per provider API, the feature headers the model
	// route passes on: "name: value", one entry per admitted value.
	ModelHeaders map[string][]string `json:"modelHeaders,omitempty"`
	// FSMonitor: the profile asks for the workspace monitor (profile.cue).
	FSMonitor bool `json:"fsmonitor,omitempty"`
	// NativeSearch: the profile can use the native search (profile.cue).
	NativeSearch bool     `json:"nativeSearch,omitempty"`
	Capabilities []string `json:"capabilities"`
}

type Word struct {
	Lit  string `json:"lit,omitempty"`
	Slot string `json:"slot,omitempty"`
}

type FixedMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Options     []string `json:"options"`
	Reason      string   `json:"reason"`
}
