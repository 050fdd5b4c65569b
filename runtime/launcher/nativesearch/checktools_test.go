package nativesearch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// An image missing one of the tools (or holding a link where the jail
// execs it) is refused at launch, naming the tool; the control, an image
// with all four as regular files, passes.
func TestCheckToolsNamesTheMissingTool(t *testing.T) {
	usr := t.TempDir()
	put := func(tool Tool) string {
		p := filepath.Join(usr, strings.TrimPrefix(toolSpecs[tool].bin, "/usr/"))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	j := Jail{Usr: usr}
	put(Rg)
	put(Find)
	var je *ErrJail
	if err := j.CheckTools(); !errors.As(err, &je) || !strings.Contains(je.Msg, "has no fd") {
		t.Fatalf("an image without fd: %v, want ErrJail naming fd", err)
	}
	fd := put(Fd)
	if err := j.CheckTools(); err != nil {
		t.Fatalf("control, an image with rg, fd and find: %v", err)
	}
	if err := os.Remove(fd); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(usr, "bin/rg"), fd); err != nil {
		t.Fatal(err)
	}
	if err := j.CheckTools(); !errors.As(err, &je) || !strings.Contains(je.Msg, "has no fd") {
		t.Fatalf("fd a link: %v, want ErrJail naming fd", err)
	}

}
