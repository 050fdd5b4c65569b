// Package testtree builds host trees for tests from a line format, beneath
// a directory that stands in for /, and merges JSON patches into base
// inputs. It is shared by the compiler's golden tests and the CLI tests.
package testtree

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Mounts reports whether spec has a mount line, which only root can build.
func Mounts(spec string) bool {
	for _, line := range strings.Split(spec, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "mount" {
			return true
		}
	}
	return false
}

// Build creates every entry of spec beneath base. Lines are
//
//	dir PATH | file PATH | symlink PATH TARGET | mount PATH
//
// where mount puts a fresh tmpfs at PATH (root only) and registers cleanup
// through the returned function.
func Build(base, spec string) (cleanup func(), err error) {
	var mounts []string
	cleanup = func() {
		for i := len(mounts) - 1; i >= 0; i-- {
			_ = unix.Unmount(mounts[i], unix.MNT_DETACH)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(spec))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return cleanup, fmt.Errorf("tree line %q: want KIND PATH", line)
		}
		p := filepath.Join(base, f[1])
		switch f[0] {
		case "dir":
			err = os.MkdirAll(p, 0o755)
		case "file":
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.WriteFile(p, []byte("// test file\n"), 0o600)
			}
		case "text": // text PATH CONTENT...: a file holding the rest of the line
			content := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(line, "text")), f[1]))
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.WriteFile(p, []byte(content+"\n"), 0o600)
			}
		case "symlink":
			if len(f) != 3 {
				return cleanup, fmt.Errorf("tree line %q: want symlink PATH TARGET", line)
			}
			if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				_ = os.RemoveAll(p)
				err = os.Symlink(f[2], p)
			}
		case "mount":
			if os.Geteuid() != 0 {
				return cleanup, fmt.Errorf("tree line %q needs root to mount; run the tests as root (CI does)", line)
			}
			if err = os.MkdirAll(p, 0o755); err == nil {
				if err = unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err == nil {
					mounts = append(mounts, p)
				}
			}
		case "remove":
			err = os.RemoveAll(p)
		default:
			return cleanup, fmt.Errorf("tree line %q: unknown kind", line)
		}
		if err != nil {
			return cleanup, fmt.Errorf("tree line %q: %w", line, err)
		}
	}
	return cleanup, sc.Err()
}

// MergePatch applies an RFC 7396 JSON merge patch to doc.
func MergePatch(doc, patch []byte) ([]byte, error) {
	var d, p any
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, err
	}
	return json.MarshalIndent(merge(d, p), "", "  ")
}

func merge(doc, patch any) any {
	pm, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	dm, ok := doc.(map[string]any)
	if !ok {
		dm = map[string]any{}
	}
	for k, v := range pm {
		if v == nil {
			delete(dm, k)
			continue
		}
		dm[k] = merge(dm[k], v)
	}
	return dm
}
