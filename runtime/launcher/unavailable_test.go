package launcher

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"testing"
)

// A refused launch keeps its cause: errors.Is sees through the
// UnavailableError to the phase's error (here the bundle that is not
// there), as it does to the launcher's sentinels.
func TestUnavailableKeepsItsCause(t *testing.T) {
	state := t.TempDir()
	_, err := Launch(context.Background(), Options{BundleDir: filepath.Join(t.TempDir(), "none"), StateRoot: state, RunscPath: "/nonexistent/runsc"})
	var ue *UnavailableError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want an UnavailableError", err)
	}
	if !errors.Is(err, fs.ErrNotExist) || ue.Err == nil {
		t.Errorf("%v: the cause is flattened (errors.Is finds no fs.ErrNotExist)", err)
	}
	wrapped := &UnavailableError{Reason: "x", Err: errors.Join(errors.New("step"), ErrAuthFileInUse)}
	if !errors.Is(wrapped, ErrAuthFileInUse) {
		t.Errorf("errors.Is does not see ErrAuthFileInUse through %v", wrapped)
	}
}
