package diag

// The stable codes. Adding one is fine; renaming or reusing one breaks
// callers and golden files, so don't.
const (
	// Input decoding and schema.
	InputSyntax       Code = "PP-INPUT-SYNTAX"         // the file is not valid CUE or JSON
	InputKind         Code = "PP-INPUT-KIND"           // apiVersion/kind do not name this input
	InputTooLarge     Code = "PP-INPUT-TOO-LARGE"      // facts or registry larger than 1 MiB
	InputNotRegular   Code = "PP-INPUT-NOT-REGULAR"    // facts or registry named a device, FIFO, directory or socket
	InputDuplicateKey Code = "PP-INPUT-DUPLICATE-KEY"  // a JSON object (or CUE struct) gives the same key twice
	InputNotData      Code = "PP-INPUT-NOT-DATA"       // CUE input uses definitions, references, comprehensions or other non-data syntax
	SchemaUnknown     Code = "PP-SCHEMA-UNKNOWN-FIELD" // a field the contract does not define
	SchemaInvalid     Code = "PP-SCHEMA-INVALID"       // a value of the wrong type or outside its constraint
	SchemaIncomplete  Code = "PP-SCHEMA-INCOMPLETE"    // a required field is missing
	SecretInFacts     Code = "PP-SECRET-IN-FACTS"      // something that looks like a secret value, not a reference
	SecretMarker      Code = "PP-SECRET-MARKER"        // an input string, or a bundle at launch, holds the secret placeholder marker @@paseo-secret:
	SecretSlot        Code = "PP-SECRET-SLOT"          // a bundle at launch carries a secret slot (the credential's env entry as a placeholder), which compilers wrote before the model route and no launcher fills now
	ProfileUnknown    Code = "PP-PROFILE-UNKNOWN"      // facts name a profile that is not embedded
	ProfileInvalid    Code = "PP-PROFILE-INVALID"      // an embedded profile breaks the profile schema
	DeploymentUnknown Code = "PP-DEPLOYMENT-UNKNOWN"   // deployment.id is not in the registry

	// Paths.
	PathRelative     Code = "PP-PATH-RELATIVE"     // not absolute
	PathDotDot       Code = "PP-PATH-DOTDOT"       // contains a .. component
	PathControl      Code = "PP-PATH-CONTROL"      // NUL, newline or another control character
	PathNonCanonical Code = "PP-PATH-NONCANONICAL" // //, /./ or a trailing slash
	PathSymlink      Code = "PP-PATH-SYMLINK"      // a component is a symlink (or a magic link)
	PathOutsideRoot  Code = "PP-PATH-OUTSIDE-ROOT" // not beneath any registered root of its kind
	PathForbidden    Code = "PP-PATH-FORBIDDEN"    // a source that may never be granted
	PathMissing      Code = "PP-PATH-MISSING"      // the source does not exist
	PathType         Code = "PP-PATH-TYPE"         // a file where a directory is needed, or the reverse
	PathCrossMount   Code = "PP-PATH-XDEV"         // resolution crosses a mount point beneath the root
	PathReplaced     Code = "PP-PATH-REPLACED"     // launch and doctor: a pinned source is now another object (device, inode or kind) than at compile time
	PathUnmapped     Code = "PP-PATH-UNMAPPED"     // docker topology: no mapping covers the container path
	PathLayout       Code = "PP-PATH-LAYOUT"       // paths that must nest (session in sessionDir) do not
	// State a sandbox writes and a later Pi reads.
	StateShared       Code = "PP-STATE-SHARED"          // a per-agent state dir not named for the agent
	StateSettings     Code = "PP-STATE-SETTINGS"        // the daemon's settings.json says what its allowlist does not (code a sandbox can write, a command)
	CredentialContent Code = "PP-CRED-AUTHFILE-CONTENT" // an oauth-file auth.json holding more than OAuth credentials

	// Git metadata checked against the repository on disk.
	GitMismatch  Code = "PP-GIT-MISMATCH"   // the cwd's .git, the gitdir's commondir or objects/info/alternates lead elsewhere than the facts say
	GitNotRepo   Code = "PP-GIT-NOT-GITDIR" // a Git fact names a directory that does not look like a Git dir (HEAD, objects/, refs/) or an object store (pack/)
	GitIndex     Code = "PP-GIT-INDEX"      // the worktree's index cannot be read whole (too large, damaged, a split index), so its submodules cannot be pinned
	GitSubmodule Code = "PP-GIT-SUBMODULE"  // the index lists a submodule (gitlink) whose path the worktree lacks
	GitStore     Code = "PP-GIT-STORE"      // Git writes are granted without a private store (state.gitStore), or the store is not this agent's own directory apart from the workspace and the repository

	// Host git adopting an agent's commit into the host index (paseo-policy git adopt).
	GitAdoptRepo     Code = "PP-GIT-ADOPT-REPO"     // the directory is not a worktree's top level, its .git leads to another gitdir than expected, or the repository is a partial clone (a missing object would be fetched)
	GitAdoptHead     Code = "PP-GIT-ADOPT-HEAD"     // HEAD does not name a commit: an unborn branch, a missing object, a tree, a blob or a tag
	GitAdoptUnmerged Code = "PP-GIT-ADOPT-UNMERGED" // the index has unmerged entries (a merge, rebase or cherry-pick in progress): a person resolves it
	GitAdoptGitlinks Code = "PP-GIT-ADOPT-GITLINKS" // HEAD's tree adds, removes or changes a gitlink (mode 160000) the index has; each differing path is named
	GitAdoptTree     Code = "PP-GIT-ADOPT-TREE"     // HEAD's tree cannot be adopted as it is: unreadable, paths out of order or twice, over the entry bound, or read-tree made another index than the tree checked (the old index is put back)

	// Host git importing an agent's Git store into the shared repository (paseo-policy git import).
	GitImportRepo   Code = "PP-GIT-IMPORT-REPO"   // the request is malformed (paths, agent id, branch, base) or the shared repository cannot be used as given
	GitImportStore  Code = "PP-GIT-IMPORT-STORE"  // the store holds what the import does not read: a symlink, a device, a file over its bound, too many files, a name of the wrong shape
	GitImportRef    Code = "PP-GIT-IMPORT-REF"    // a ref the store offers is malformed (a granted one: refused) or outside the grant (never written; listed)
	GitImportObject Code = "PP-GIT-IMPORT-OBJECT" // an object is not what its name says (a loose object whose content hashes elsewhere), a pack git cannot index, a granted ref naming a missing object, or fsck refused what the repository received
	GitImportMoved  Code = "PP-GIT-IMPORT-MOVED"  // the repository's branch is not at the value the import was given (moved since launch or the last import); nothing is written

	// Credentials.
	CredentialShape   Code = "PP-CRED-SHAPE"            // fields that do not fit the credential mode
	CredentialExposed Code = "PP-CRED-AUTHFILE-PRESENT" // an auth.json would be visible in a mode that must not see it
	ModelRoute        Code = "PP-MODEL-ROUTE"           // the model route cannot be built as the facts and the daemon's models.json say (no TLS, an API the profile does not route, models.json headers or another base URL)
	ModelHostedTool   Code = "PP-MODEL-HOSTED-TOOL"     // the registry grants a provider-side tool the model route does not know, twice, or an MCP connector (never grantable)
	ModelSigned       Code = "PP-MODEL-SIGNED"          // api-key mode for an API whose requests are signed or carry a minted token (Bedrock SigV4, Vertex ADC): no static key the route could add
	ModelNotTurn      Code = "PP-MODEL-NOT-TURN"        // the model's API is one of Pi's that carries no agent turn (a classifier or image generation): Pi's agent never streams a turn through it

	// Read-only searches answered outside gVisor (grant search workspace).
	SearchGateway Code = "PP-SEARCH-GATEWAY" // the registry turns the native search on (deployments.<id>.search "native") where it cannot be served: network mode none has no gateway
	SearchRequest Code = "PP-SEARCH-REQUEST" // a search or listing request off the closed lists: a tool, an option or find test, a value, a path not beneath the workspace (the client then runs the sandbox's own rg, fd or find)
	SearchJail    Code = "PP-SEARCH-JAIL"    // the search jail cannot be built as designed (no Landlock, no user namespaces): a plan that grants the search is refused at launch
	// The workspace monitor.
	FSMonitor Code = "PP-FSMONITOR" // the registry requires the workspace monitor (deployments.<id>.fsmonitor "on") where it cannot be served: network mode none has no gateway

	// Renderings of a compiled bundle for another engine.
	KubeRender Code = "PP-KUBE-RENDER" // the plan (or the cluster options) cannot be rendered for Kubernetes as it is: an image not by digest, routes without a gateway address, a bind without a pin, a writable bundle file

	// Authority the compiler never grants.
	HostNetwork Code = "PP-NET-HOST"    // network mode host
	DirectFS    Code = "PP-DIRECTFS"    // runsc --directfs
	RootUID     Code = "PP-UID-ROOT"    // uid or gid 0 for the agent
	Capability  Code = "PP-CAPABILITY"  // any Linux capability
	URLInvalid  Code = "PP-URL-INVALID" // a URL the egress renderer cannot pin to host and port
	DestUnsafe  Code = "PP-DEST-UNSAFE" // an egress destination that is loopback, link-local, metadata, unspecified, multicast, broadcast, reserved or written in a non-canonical numeric form
	Registry    Code = "PP-REGISTRY"    // the operator registry is inconsistent
	EnvInvalid  Code = "PP-ENV-INVALID" // an environment name the allowlist cannot carry
	Internal    Code = "PP-INTERNAL"    // a bug: the compiler broke one of its own invariants
)

// Compiled bundles read back (the manifest's grants).
const (
	ManifestVersion  Code = "PP-MANIFEST-VERSION"   // manifest.json of a kind or apiVersion this build does not read
	GrantUnknownKind Code = "PP-GRANT-UNKNOWN-KIND" // a grant's kind (or kind and subject) that no grant type decodes
	GrantInvalid     Code = "PP-GRANT-INVALID"      // a grant with fields of another kind, a wrong type, a non-canonical number, a derived access that disagrees, or a payload its type refuses
)

// The launcher's preflight (runtime/launcher/preflight), one code per
// check: a launch refused by it (and doctor's report) carries the codes of
// every check that failed. docs/launcher.md, "Preflight codes", lists them.
const (
	PreflightRoot          Code = "PP-PREFLIGHT-ROOT"           // not running as root
	PreflightKernel        Code = "PP-PREFLIGHT-KERNEL"         // a kernel older than 5.6 (no openat2), or a release that cannot be read
	PreflightRunscStatic   Code = "PP-PREFLIGHT-RUNSC-STATIC"   // runsc missing, not a regular root-owned executable others cannot write, or not a static ELF
	PreflightRunscDigest   Code = "PP-PREFLIGHT-RUNSC-DIGEST"   // runsc's sha256 is not the one its digest file records (or there is no such record)
	PreflightCgroup        Code = "PP-PREFLIGHT-CGROUP"         // neither cgroup2 nor v1 with the cpu, memory and pids controllers
	PreflightNftables      Code = "PP-PREFLIGHT-NFTABLES"       // doctor's nftables probe failed
	PreflightBundleDigests Code = "PP-PREFLIGHT-BUNDLE-DIGESTS" // the bundle cannot be read, or a file differs from its manifest digest, or pins.json is another compile's
	PreflightBundleHooks   Code = "PP-PREFLIGHT-BUNDLE-HOOKS"   // config.json has OCI hooks (or is no OCI config)
	PreflightBundlePins    Code = "PP-PREFLIGHT-BUNDLE-PINS"    // pins.json does not pair with the host binds, or (doctor) a pinned source no longer opens as compiled
	PreflightImageErofs    Code = "PP-PREFLIGHT-IMAGE-EROFS"    // an EROFS image file config.json mounts has no digest grant or another digest
	PreflightBundleValid   Code = "PP-PREFLIGHT-BUNDLE-VALID"   // another finding of the bundle validator (ocicheck)
)

// The launcher's refusals after preflight (runtime/launcher), one code per
// kind of launch-phase failure: a refused launch or wake carries one, at
// the path launch.<phase>. docs/launcher.md, "Launch codes", lists them.
const (
	LaunchBundle        Code = "PP-LAUNCH-BUNDLE"          // the bundle cannot be read as a launch plan, or asks for what this launcher does not enforce (a network mode, the workspace monitor without the sandbox network)
	LaunchSecret        Code = "PP-LAUNCH-SECRET"          // a secret the launch needs (the model key, the MCP bearer) is not found, cannot be read, or is not a valid token; or there is no secret source
	LaunchResolve       Code = "PP-LAUNCH-RESOLVE"         // an egress host or the model provider's host does not resolve, has no IPv4 address, or resolves to an unsafe destination
	LaunchID            Code = "PP-LAUNCH-ID"              // the container id is not a valid name, or is in use: its run dir or record exists, or runsc knows it
	LaunchAuthFileInUse Code = "PP-LAUNCH-AUTHFILE-IN-USE" // another sandbox (running, hibernated, or with a record and no launcher) holds the oauth-file auth.json
	LaunchStateDir      Code = "PP-LAUNCH-STATE-DIR"       // a dir of the launcher's state root (the locks dir) is not root's 0700
	LaunchHibernatePath Code = "PP-LAUNCH-HIBERNATE-PATH"  // the checkpoint dir is not root's 0700, or a dir on the way to it is not root's, or is writable by group or others and not sticky
	LaunchWake          Code = "PP-LAUNCH-WAKE"            // a wake cannot restore: no id, no checkpoint, an image file changed, another network mode, the wall time used up
	LaunchHost          Code = "PP-LAUNCH-HOST"            // another step on this host failed (the sandbox network, staging the run dir, starting runsc): a fault here, not the bundle's
)

// The cluster gateway's refusals at start (runtime/gateway, `paseo-policy
// gateway`): nothing listens unless every check passed. docs/kubernetes.md,
// "The cluster gateway", lists them.
const (
	GatewayBundle  Code = "PP-GATEWAY-BUNDLE"  // the bundle cannot be read or fails verification (ocicheck), has no route, or has a route the gateway does not serve (a subscription login, a listener other than the gateway)
	GatewaySecret  Code = "PP-GATEWAY-SECRET"  // a route's credential file is missing, not given, given for a route the bundle lacks, a symlink or behind one, not a regular file, open to others or writable by its group, too large, or not a valid token
	GatewayResolve Code = "PP-GATEWAY-RESOLVE" // the model provider's host does not resolve, has no IPv4 address, or resolves to an unsafe destination
	GatewayListen  Code = "PP-GATEWAY-LISTEN"  // the listen address is not an IP address, or a route's port cannot be listened on
)
