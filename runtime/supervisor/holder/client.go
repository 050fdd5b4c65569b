package holder

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/linerpc"
)

// The supervisor's side: spawning a holder and talking to it.

// exe is what the supervisor re-executes as a holder. /proc/self/exe is
// this very binary even after an upgrade replaced the file on disk, so a
// holder always speaks the protocol of the supervisor that started it.
const exe = "/proc/self/exe"

// LaunchError is a holder's report that its sandbox did not start.
// Unavailable says the launcher found the sandbox cannot run on this host;
// Diagnostics are the preflight checks that refused it, with their codes.
type LaunchError struct {
	Message     string
	Unavailable bool
	Diagnostics diag.List
}

func (e *LaunchError) Error() string { return e.Message }

// Spawn starts a holder for spec and waits until its sandbox runs (or the
// launch failed: *LaunchError). The holder runs in a session of its own,
// so signals for the supervisor's process group do not reach it; this
// process reaps it if it is still the parent when the holder ends. The
// spec travels over a pipe, and spec.ModelKey's value is wiped here once
// sent.
func Spawn(spec Spec) error {
	if err := os.MkdirAll(Dir(spec.StateRoot), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(Log(spec.StateRoot, spec.ID), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("holder log: %v", err)
	}
	defer logf.Close()
	specR, specW, err := os.Pipe()
	if err != nil {
		return err
	}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		specR.Close()
		specW.Close()
		return err
	}
	defer readyR.Close()
	cmd := exec.Command(exe)
	cmd.Args = []string{"paseo-sandbox-holder", spec.ID}
	cmd.Env = []string{Env + "=1", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stderr = specR, logf
	cmd.ExtraFiles = []*os.File{readyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	specR.Close()
	readyW.Close()
	if err != nil {
		specW.Close()
		return fmt.Errorf("starting the holder: %v", err)
	}
	go func() { _ = cmd.Wait() }()
	err = json.NewEncoder(specW).Encode(spec)
	specW.Close()
	if spec.ModelKey != nil {
		clear(spec.ModelKey.Value) // the holder has it now; no copy stays here
	}
	if err != nil {
		return fmt.Errorf("holder spec: %v", err)
	}
	line, rerr := bufio.NewReader(readyR).ReadBytes('\n')
	var r ready
	if json.Unmarshal(line, &r) != nil {
		return fmt.Errorf("the holder ended before its sandbox started (%v); see %s", rerr, logf.Name())
	}
	if r.OK {
		return nil
	}
	return &LaunchError{Message: r.Error, Unavailable: r.Unavailable, Diagnostics: r.Diagnostics}
}

// Dead tells a holder that is gone (nothing listens on its socket, or the
// socket is gone) from one that is only slow to answer.
func Dead(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// Conn is one connection to a holder. Events carries what an attach on it
// pushes (closed when the connection ends).
type Conn struct {
	conn   *linerpc.Conn[Event]
	Events <-chan Event
}

// Dial connects to a holder's socket. events bounds the events buffered
// for an attach connection (control calls need none); a full buffer stops
// reading until the consumer catches up.
func Dial(sock string, events int) (*Conn, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	return newConn(c, events), nil
}

func newConn(c net.Conn, events int) *Conn {
	conn := linerpc.New[Event](c, events, "holder", "h")
	return &Conn{conn: conn, Events: conn.Events}
}

// Call sends a request (V and ID are filled in) and waits for its
// response; a holder's refusal, of the request or of the connection (a
// frame it could not read), comes back as *Error.
func (c *Conn) Call(ctx context.Context, req Request, result any) error {
	line, err := c.conn.Call(ctx, func(id string) any {
		req.V, req.ID = Version, id
		return req
	})
	if err != nil {
		return linerpc.Refusal[*Error](err, "holder")
	}
	return linerpc.Decode[*Error](line, "holder", result)
}

// Close drops the connection (and with it an attach's stream).
func (c *Conn) Close() error { return c.conn.Close() }

// Attach makes this connection the sandbox's attachment: a new epoch
// (fencing the earlier one), then every record after cursor and live
// output on c.Events, ending with an EventDetached.
func (c *Conn) Attach(ctx context.Context, cursor uint64) (AttachResult, error) {
	var r AttachResult
	err := c.Call(ctx, Request{Op: OpAttach, Cursor: cursor}, &r)
	return r, err
}

// call runs one request on a fresh connection to the holder at sock.
func call(ctx context.Context, sock string, req Request, result any) error {
	c, err := Dial(sock, 1)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Call(ctx, req, result)
}

// Inspect asks the holder for its sandbox's state.
func Inspect(ctx context.Context, sock string) (State, error) {
	var st State
	err := call(ctx, sock, Request{Op: OpInspect}, &st)
	return st, err
}

// Write relays input to the sandbox's stdin under the attachment epoch.
func Write(ctx context.Context, sock string, epoch uint64, inputID string, data []byte) (WriteResult, error) {
	var r WriteResult
	err := call(ctx, sock, Request{Op: OpWrite, Epoch: epoch, InputID: inputID, Data: data}, &r)
	return r, err
}

// Ack acknowledges output up to cursor, so the bridge may drop it.
func Ack(ctx context.Context, sock string, cursor uint64) (AckResult, error) {
	var r AckResult
	err := call(ctx, sock, Request{Op: OpAck, Cursor: cursor}, &r)
	return r, err
}

// CloseInput closes the sandbox's stdin for the attachment epoch.
func CloseInput(ctx context.Context, sock string, epoch uint64) (CloseResult, error) {
	var r CloseResult
	err := call(ctx, sock, Request{Op: OpCloseInput, Epoch: epoch}, &r)
	return r, err
}

// SetMCPToken hands the holder's route proxy the daemon's current bearer.
func SetMCPToken(ctx context.Context, sock, token string) error {
	return call(ctx, sock, Request{Op: OpMCPToken, MCPToken: token}, nil)
}

// Signal has the holder signal its sandbox (name: one of Signals).
func Signal(ctx context.Context, sock, name string) (SignalResult, error) {
	var r SignalResult
	err := call(ctx, sock, Request{Op: OpSignal, Signal: name}, &r)
	return r, err
}

// Stop stops the sandbox (the launcher tears everything down) and waits
// for it to end.
func Stop(ctx context.Context, sock string) (State, error) {
	var st State
	err := call(ctx, sock, Request{Op: OpStop}, &st)
	return st, err
}

// Release ends a holder whose sandbox has ended; it exits after answering.
func Release(ctx context.Context, sock string) error {
	return call(ctx, sock, Request{Op: OpRelease}, nil)
}
