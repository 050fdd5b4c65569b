package bridge

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
)

// startWithPipes starts cmd with stdin and n output pipes (stdout, then
// stderr) made here rather than by exec: exec's own pipes are closed by
// Wait, which would cut off output the bridge has not read yet.
func startWithPipes(t *testing.T, cmd *exec.Cmd, n int) (io.WriteCloser, []io.Reader) {
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = inR
	var outs []io.Reader
	var writers []*os.File
	for i := 0; i < n; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, r)
		writers = append(writers, w)
	}
	cmd.Stdout = writers[0]
	if n > 1 {
		cmd.Stderr = writers[1]
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	for _, w := range writers {
		w.Close() // the child holds its copies; EOF comes when it exits
	}
	return inW, outs
}

func exitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}
