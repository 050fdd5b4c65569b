package acceptance

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"paseo.dev/paseo-policy/internal/testkit/testbundle"
	"paseo.dev/paseo-policy/runtime/launcher"
	"paseo.dev/paseo-policy/runtime/launcher/statedir"
)

// Attacks on a hibernated sandbox's checkpoint (docs/threat-model.md,
// threat 66): the image holds the agent's memory, the injected key
// included, so whoever reads it has the key. The daemon user (uid 1000,
// the socket group's daemon, not root) tries to read every image file.
// The key is random per run and only compared, never printed.

func init() { registerOutside("hibernate", hibernateAttacks) }

// TestHibernateAttacks runs this family alone (make acceptance runs it in
// TestAcceptance with the rest).
func TestHibernateAttacks(t *testing.T) {
	testbundle.Prerequisites(t)
	attacks := hibernateAttacks(t, &scene{})
	judgeOutside(attacks, t.Errorf, t.Errorf)
	for _, a := range attacks {
		t.Log(a)
	}
}

func hibernateAttacks(t *testing.T, _ *scene) []OutsideAttack {
	return []OutsideAttack{daemonReadsCheckpoint(t)}
}

// daemonReadsCheckpoint: the product's image (root's 0700 directory under
// the state root) against the same image files kept where the daemon user
// can read them (0755 directories, 0644 files: the image beside the
// bundle, in daemon-readable state). The win is a read, as uid 1000, of
// bytes that hold the key.
func daemonReadsCheckpoint(t *testing.T) OutsideAttack {
	a := OutsideAttack{Name: "daemon-user-reads-checkpoint", Attacker: "daemon-user",
		Goal:    "read a hibernated sandbox's checkpoint image as the daemon user and find the injected model key in the agent's memory",
		Control: "the same image files in daemon-readable storage (directories 0755, files 0644) instead of the launcher's root-only hibernate directory"}
	key := "pp-hib-" + randomHex(16)
	// The image holds whatever the agent held. With the model route the
	// provider key is not among it (model-key-in-checkpoint); a secret in
	// the sandbox's memory is what this attack looks for, so the sandbox
	// gets one as the launch before the route gave it the key (the test
	// writes it into the spec: the product has no path for it).
	sc := testbundle.New(t, testbundle.Options{Argv: testbundle.Script(`read line; echo "seen ${#FAKE_LLM_KEY}"; read line`), FactsPatch: directModel})
	testbundle.KeyInEnv(t, sc.Bundle, "FAKE_LLM_KEY", key)
	id := "pp-acchib-" + randomHex(4)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		_, err := launcher.Launch(context.Background(), launcher.Options{BundleDir: sc.Bundle, ID: id, StateRoot: sc.State, RunscPath: sc.Runsc,
			Stdin: inR, Stdout: outW, OnStart: func() { close(started) }})
		outW.Close()
		inR.Close()
		done <- err
	}()
	defer func() {
		inW.Close()
		<-done
		_ = launcher.RemoveHibernation(sc.State, id)
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("hibernate attack: launch: %v", err)
	}
	fmt.Fprintln(inW, "go")
	line, _ := bufio.NewReader(outR).ReadString('\n')
	if strings.TrimSpace(line) != fmt.Sprintf("seen %d", len(key)) {
		t.Fatalf("hibernate attack: the agent did not get its key: %q", line)
	}
	img, err := launcher.Checkpoint(launcher.CheckpointOptions{ID: id, StateRoot: sc.State, RunscPath: sc.Runsc})
	if err != nil {
		t.Fatalf("hibernate attack: checkpoint: %v", err)
	}
	select {
	case <-done:
		done <- nil // for the deferred wait
	case <-time.After(60 * time.Second):
		t.Fatal("hibernate attack: the checkpointed launch did not end")
	}
	product := filepath.Join(statedir.HibernateDir(sc.State, id), "image")
	// Every directory above the sandbox's own hibernate directory is opened
	// to the daemon (the state root and the test's temp dirs are 0700), so
	// what holds on the product's side is that directory's mode alone.
	for d := filepath.Dir(statedir.HibernateDir(sc.State, id)); d != "/" && d != "/tmp"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// The control: the same files where the daemon may read.
	base := t.TempDir()
	control := filepath.Join(base, "daemon-state", "image")
	if err := os.MkdirAll(control, 0o755); err != nil {
		t.Fatal(err)
	}
	// Go's temp dirs are 0700 (the test's and its parent): opened to the
	// daemon user like the rest of the control's path.
	for _, d := range []string{filepath.Dir(base), base, filepath.Dir(control)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name := range img.Files {
		data, err := os.ReadFile(filepath.Join(product, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(control, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, side := range []struct {
		tally *Tally
		dir   string
	}{{&a.Contained, product}, {&a.ControlRun, control}} {
		for name := range img.Files {
			side.tally.Attempts++
			if data, err := readAsDaemon(filepath.Join(side.dir, name)); err == nil && bytes.Contains(data, []byte(key)) {
				side.tally.Wins++
			}
		}
	}
	a.Evidence = fmt.Sprintf("%d image files read as uid 1000 on each side; a win is a file whose bytes hold the key", len(img.Files))
	return a
}

// readAsDaemon reads path as uid/gid 1000 (the daemon user) with cat.
func readAsDaemon(path string) ([]byte, error) {
	cmd := exec.Command("/bin/cat", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	return cmd.Output()
}
