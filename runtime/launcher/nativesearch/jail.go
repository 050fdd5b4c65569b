package nativesearch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/childproc"
	"paseo.dev/paseo-policy/internal/pathform"
)

// The jail
//
// Each search is one process: this binary re-executed (/proc/self/exe,
// argv[0] jailArg0) into new user, mount, network, pid, ipc and uts
// namespaces, as the agent's uid and gid inside and out (a one-id map;
// no supplementary groups), holding CAP_SYS_ADMIN in its own user
// namespace only, for its mounts. Its init (jailMain, run from this
// package's init before main) mounts a tmpfs root holding the image's
// /usr (read-only, nosuid, nodev) and the workspace at its sandbox path
// (read-only, nosuid, nodev, noexec), both detached copies of the
// server's mounts (detachedTree) that it attaches; pivots into it and detaches the host's tree; opens the
// request's cwd beneath the workspace without following a link; sets the
// rlimits; restricts itself with Landlock (read the image and the
// workspace, execute rg and its loader only); drops every capability
// and sets no_new_privs; installs a seccomp filter; reports on a pipe that
// it is confined; and only then reads its one request (the cwd, the
// tool's argv and environment) from a second pipe, opens the cwd beneath
// the workspace and execs the image's tool with that environment. Nothing
// the agent wrote is executable, and a link it planted can lead only to
// the workspace or the image, which its sandbox sees anyway.
//
// The server keeps one such jail per tool made ahead of its request (warm;
// server.go): the jail's start (a re-exec of a large Go binary, its
// namespaces and mounts: 50-80 ms) is then off the request's path. A jail
// serves exactly one request whether made ahead or for it (Run).

const jailArg0 = "paseo-search-jail"

// Limits bound one search.
type Limits struct {
	CPU     time.Duration // RLIMIT_CPU (whole seconds, at least 1)
	Memory  uint64        // RLIMIT_AS, bytes
	Wall    time.Duration // killed after
	Stdout  int           // bytes; past it the search is killed and answered "fallback"
	Stderr  int           // bytes kept (the rest dropped)
	Threads int           // rg --threads
}

// DefaultLimits are the server's.
var DefaultLimits = Limits{CPU: 60 * time.Second, Memory: 2 << 30, Wall: 60 * time.Second, Stdout: 16 << 20, Stderr: 64 << 10, Threads: 2}

// Jail is what a search runs against.
type Jail struct {
	Workspace string // host path of the workspace (the staged bind the gofer serves)
	Dest      string // the workspace's path in the sandbox, and in the jail
	Usr       string // host path of the image's /usr
	UID, GID  uint32 // the agent's, from the bundle's process
	Limits    Limits
	// Covered are the names beneath the workspace (relative to it) that
	// the sandbox sees through a mount of their own (the Git layout's
	// .git), not the workspace's: the jail holds the workspace's own, so
	// a cat of one of them, or of anything beneath, is the sandbox's.
	Covered []string
}

// Result is a search's answer.
type Result struct {
	Stdout, Stderr []byte
	Exit           int // the tool's: rg 0 matched, 1 none, 2 an error; fd and find 0, or 1 an error
}

// ErrFallback means the search was not answered (a limit, the jail
// failed): the client runs the sandbox's own binary.
var ErrFallback = errors.New("nativesearch: not answered")

// ErrJail refuses the option: the jail cannot be built as designed.
type ErrJail struct{ Msg string }

func (e *ErrJail) Error() string { return string(diag.SearchJail) + ": " + e.Msg }

// Code is the refusal's stable code.
func (e *ErrJail) Code() diag.Code { return diag.SearchJail }

// Probe checks what the jail needs of this kernel: Landlock (ABI 1 or
// later) and user namespaces. The option refuses the launch without them;
// the design never runs a search with less.
func Probe() error {
	if runtime.GOARCH != "amd64" {
		// The seccomp filter admits x86-64's calls only (confine.go), and
		// Landlock executes its loader by name.
		return &ErrJail{Msg: "the search jail is built for amd64 only, this is " + runtime.GOARCH}
	}
	abi, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 || int(abi) < 1 {
		return &ErrJail{Msg: fmt.Sprintf("Landlock is not available (%v)", e)}
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && string(bytes.TrimSpace(b)) == "0" {
		return &ErrJail{Msg: "user namespaces are disabled (user.max_user_namespaces = 0)"}
	}
	return nil
}

// Check checks j's form.
func (j Jail) Check() error {
	for _, p := range []string{j.Workspace, j.Dest, j.Usr} {
		if code, msg := pathform.Check(p); code != "" {
			return &ErrJail{Msg: fmt.Sprintf("%s: %s", p, msg)}
		}
	}
	if j.Dest == "/" || j.Dest == "/usr" || pathform.Beneath("/usr", j.Dest) {
		return &ErrJail{Msg: "the workspace cannot be mounted at " + j.Dest}
	}
	if j.UID == 0 || j.GID == 0 {
		return &ErrJail{Msg: "the search never runs as uid or gid 0"}
	}
	return nil
}

// CheckTools checks that the image under j.Usr holds every tool the
// server may run (toolSpecs: rg, fd, find), each a regular file at the
// path the jail execs. Without one a request for it would fail in the jail
// and fall back, per request, to the sandbox's own binary: the launch of a
// plan that grants the search is refused instead (PP-SEARCH-JAIL), as it
// is for a kernel that cannot build the jail.
func (j Jail) CheckTools() error {
	for _, t := range []Tool{Rg, Fd, Find} {
		p := path.Join(j.Usr, strings.TrimPrefix(toolSpecs[t].bin, "/usr/"))
		if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
			return &ErrJail{Msg: fmt.Sprintf("the image has no %s at %s", t, p)}
		}
	}
	return nil
}

// jailConfig is what the init reads from its argv: what the jail is made
// for (its tool, where the workspace goes, the limits), never a request.
type jailConfig struct {
	Tool   Tool   `json:"tool"` // the init execs specOf(Tool).bin
	Dest   string `json:"dest"`
	CPU    uint64 `json:"cpu"`
	Memory uint64 `json:"memory"`
	// Scratch mounts the descriptor fdScratch read-write at ScratchPath
	// (the launcher's git only: gitjail.go); FSize is then RLIMIT_FSIZE,
	// otherwise 0.
	Scratch bool   `json:"scratch,omitempty"`
	FSize   uint64 `json:"fsize,omitempty"`
}

// jailRequest is the one request a jail reads, from its request pipe,
// once it is confined: the cwd (opened beneath the workspace in the jail)
// and the tool's argv and environment.
type jailRequest struct {
	Cwd  string   `json:"cwd"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
}

// maxJailRequest bounds what a jail reads from its request pipe.
const maxJailRequest = 4 * MaxRequest

// readyTimeout bounds a jail's build, from its start to its report that
// it is confined.
const readyTimeout = 10 * time.Second

// Run runs r (already checked against j.Dest) in a new jail.
func (j Jail) Run(ctx context.Context, r Request) (Result, error) {
	return j.runIn(ctx, nil, r)
}

// runIn runs r in p, a jail prepared for r's tool (the server's warm
// one), or in a new jail when p is nil. p is used or discarded: a jail
// serves one request at most.
func (j Jail) runIn(ctx context.Context, p *prepared, r Request) (Result, error) {
	err := j.Check()
	if err == nil {
		err = r.Check(j.Dest)
	}
	if err != nil {
		if p != nil {
			p.discard()
		}
		return Result{}, err
	}
	var env []string
	if r.Lang != "" {
		env = []string{"LC_ALL=" + r.Lang}
	}
	if p == nil || p.tool != r.tool() || !p.alive() {
		if p != nil {
			p.discard()
		}
		return j.run(ctx, r.tool(), r.Cwd, r.Argv(), env)
	}
	return j.serve(ctx, p, r.Cwd, r.Argv(), env)
}

// PlainPaths reports whether r's cwd and every path it names (its paths,
// fd's --search-path, find's -newer) are, now, names beneath the
// workspace with no link on the way (or missing). rg follows a link it is
// given as a path, and each tool follows one on the way, and the jail
// holds nothing a link out of the workspace could lead to: the sandbox's
// tool would read there what the jail cannot, so such a request is
// answered "fallback". A matter of the same answer, not of safety: a link
// made after this check meets the jail.
func (j Jail) PlainPaths(r Request) bool {
	ws, err := unix.Open(j.Workspace, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(ws)
	plain := func(rel string, missingOK bool) bool {
		// Not O_NOFOLLOW: with it, O_PATH opens a trailing link itself.
		fd, err := unix.Openat2(ws, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
			Resolve: plainResolve})
		if err != nil {
			return missingOK && err == unix.ENOENT
		}
		unix.Close(fd)
		return true
	}
	if !plain(r.Cwd, false) {
		return false
	}
	for _, p := range r.names() {
		if !plain(j.rel(r.Cwd, p), true) {
			return false
		}
	}
	return true
}

// plainResolve resolves a name the agent gave beneath the directory it is
// opened from, following no link and crossing no mount.
const plainResolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// rel is a request's path p (relative to cwd, or absolute beneath
// j.Dest) relative to the workspace's top.
func (j Jail) rel(cwd, p string) string {
	if strings.HasPrefix(p, "/") {
		return pathform.Rel(j.Dest, p)
	}
	return path.Join(cwd, p)
}

// run runs the image's t with argv and env in cwd (relative to the
// workspace) in a new jail.
func (j Jail) run(ctx context.Context, t Tool, cwd string, toolArgv, env []string) (Result, error) {
	p, err := j.prepare(t)
	if err != nil {
		return Result{}, err
	}
	return j.serve(ctx, p, cwd, toolArgv, env)
}

// A prepared jail is one built and confined for its tool (namespaces,
// mounts, rlimits, Landlock, no capability, no_new_privs, seccomp: all of
// buildJail but the cwd and the exec), waiting for its one request on a
// pipe only the server holds. The server writes the request only after
// the jail reported, on a second pipe, that its confinement is complete;
// the jail reads it, opens the cwd, and execs the tool: it serves exactly
// one request, and then it is gone.
type prepared struct {
	tool      Tool
	pid       int      // the jail's, on the host
	req       *os.File // the request pipe's write end
	out, errb *capped
	kill      context.CancelFunc
	killed    context.Context
	exited    chan struct{} // closed when the jail was reaped
	err       error         // Wait's, once exited is closed
}

// alive reports whether p's jail is still waiting (not reaped).
func (p *prepared) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// discard ends p's jail unused and waits for it.
func (p *prepared) discard() {
	p.kill()
	p.req.Close()
	<-p.exited
}

// prepare builds a jail for t and waits, up to readyTimeout, until it
// reports that it is confined.
func (j Jail) prepare(t Tool) (*prepared, error) {
	if _, ok := toolSpecs[t]; !ok {
		return nil, fmt.Errorf("%w: no tool %q", ErrFallback, t)
	}
	return j.prepareWith(t, "", 0)
}

// prepareWith is prepare for any tool specOf knows, with scratch (a host
// directory, or "") mounted read-write at ScratchPath and fsize the
// jail's RLIMIT_FSIZE.
func (j Jail) prepareWith(t Tool, scratch string, fsize uint64) (*prepared, error) {
	if _, ok := specOf(t); !ok {
		return nil, fmt.Errorf("%w: no tool %q", ErrFallback, t)
	}
	ws, err := detachedTree(j.Workspace, true)
	if err != nil {
		return nil, err
	}
	defer ws.Close()
	usr, err := detachedTree(j.Usr, false)
	if err != nil {
		return nil, err
	}
	defer usr.Close()
	extra := []*os.File{ws, usr}
	if scratch != "" {
		sc, err := detachedWritable(scratch)
		if err != nil {
			return nil, err
		}
		defer sc.Close()
		extra = append(extra, sc)
	}
	lim := j.Limits
	cfg, err := json.Marshal(jailConfig{Tool: t, Dest: j.Dest, CPU: uint64(max(lim.CPU/time.Second, 1)), Memory: lim.Memory,
		Scratch: scratch != "", FSize: fsize})
	if err != nil {
		return nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFallback, err)
	}
	defer reqR.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		reqW.Close()
		return nil, fmt.Errorf("%w: %v", ErrFallback, err)
	}
	defer readyR.Close()
	defer readyW.Close()
	killed, kill := context.WithCancel(context.Background())
	p := &prepared{tool: t, req: reqW, kill: kill, killed: killed, exited: make(chan struct{}),
		out: &capped{max: lim.Stdout, over: kill}, errb: &capped{max: lim.Stderr}}
	cmd := exec.CommandContext(killed, "/proc/self/exe")
	cmd.Args = []string{jailArg0, string(cfg)}
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = p.out, p.errb
	// fdWorkspace, fdUsr, fdRequest, fdReady, and fdScratch when made.
	cmd.ExtraFiles = []*os.File{ws, usr, reqR, readyW}
	if len(extra) > 2 {
		cmd.ExtraFiles = append(cmd.ExtraFiles, extra[2])
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: int(j.UID), HostID: int(j.UID), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: int(j.GID), HostID: int(j.GID), Size: 1}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: j.UID, Gid: j.GID, Groups: []uint32{}},
		AmbientCaps:                []uintptr{unix.CAP_SYS_ADMIN},
		Pdeathsig:                  syscall.SIGKILL,
	}
	// From a thread that lives until the jail is reaped, so its
	// parent-death signal means the server is gone (internal/childproc).
	waited, err := childproc.Start(cmd)
	if err != nil {
		kill()
		reqW.Close()
		return nil, fmt.Errorf("%w: %v", ErrFallback, err)
	}
	p.pid = cmd.Process.Pid
	go func() {
		p.err = <-waited
		close(p.exited)
	}()
	// The jail's ends are its own now: the ready pipe ends (EOF) if it
	// dies before it reports.
	reqR.Close()
	readyW.Close()
	readyR.SetReadDeadline(time.Now().Add(readyTimeout))
	var b [1]byte
	if n, _ := readyR.Read(b[:]); n != 1 || b[0] != jailReady {
		p.discard()
		return nil, fmt.Errorf("%w: the jail was not built: %s", ErrFallback, firstLine(p.errb.bytes()))
	}
	return p, nil
}

// serve sends p's jail its one request (the cwd, argv and env of the
// tool p was made for) and waits for the tool, killed past j's wall time,
// when ctx ends, or past j's output bound.
func (j Jail) serve(ctx context.Context, p *prepared, cwd string, toolArgv, env []string) (Result, error) {
	defer p.kill()
	lim := j.Limits
	argv := toolArgv
	if spec, _ := specOf(p.tool); spec.threads {
		argv = append([]string{fmt.Sprintf("--threads=%d", max(lim.Threads, 1))}, toolArgv...)
	}
	b, err := json.Marshal(jailRequest{Cwd: cwd, Argv: argv, Env: env})
	if err != nil {
		p.discard()
		return Result{}, err
	}
	wall := time.AfterFunc(lim.Wall, p.kill)
	defer wall.Stop()
	defer context.AfterFunc(ctx, p.kill)()
	_, werr := p.req.Write(b)
	p.req.Close()
	<-p.exited
	err = p.err
	res := Result{Stdout: p.out.bytes(), Stderr: p.errb.bytes()}
	if p.out.overflow() {
		return Result{}, fmt.Errorf("%w: output over %d bytes", ErrFallback, lim.Stdout)
	}
	if p.killed.Err() != nil {
		return Result{}, fmt.Errorf("%w: past %s, or the server closed", ErrFallback, lim.Wall)
	}
	if werr != nil {
		return Result{}, fmt.Errorf("%w: the request: %v", ErrFallback, werr)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return res, nil
	case errors.As(err, &ee) && ee.Exited() && ee.ExitCode() <= 2:
		res.Exit = ee.ExitCode()
		return res, nil
	case errors.As(err, &ee):
		return Result{}, fmt.Errorf("%w: %v: %s", ErrFallback, err, firstLine(res.Stderr))
	default:
		return Result{}, fmt.Errorf("%w: %v", ErrFallback, err)
	}
}

// detachedTree is a detached copy of the mount at p (not of what is mounted
// beneath it), read-only, nosuid, nodev (and noexec): the jail attaches it
// in its own mount namespace, where a bind by name or by a descriptor of
// this namespace's mounts is refused.
func detachedTree(p string, noexec bool) (*os.File, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return nil, &ErrJail{Msg: fmt.Sprintf("%s: %v", p, err)}
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if noexec {
		attr.Attr_set |= unix.MOUNT_ATTR_NOEXEC
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return nil, &ErrJail{Msg: fmt.Sprintf("%s: read-only: %v", p, err)}
	}
	return os.NewFile(uintptr(fd), p), nil
}

func firstLine(b []byte) string {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

// capped keeps up to max bytes; past them it drops the rest and calls over.
type capped struct {
	mu   sync.Mutex
	b    bytes.Buffer
	max  int
	over func()
	past bool
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.b.Len(); len(p) > room {
		c.b.Write(p[:max(room, 0)])
		if !c.past && c.over != nil {
			c.over()
		}
		c.past = true
		return len(p), nil
	}
	c.b.Write(p)
	return len(p), nil
}

func (c *capped) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.b.Bytes())
}

func (c *capped) overflow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.past
}
