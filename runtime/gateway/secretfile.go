package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/runtime/launcher/routeproxy"
)

// readSecretFile reads a credential file the operator mounted, checked on
// the descriptor it is read from: an absolute path with no symlink on it
// (a kubelet's Secret volume links each key through ..data; a volumeMount
// with subPath binds the file itself, which is how the rendering mounts
// it), a regular file, nothing for others and no write for its group (a
// Secret's defaultMode 0400, group-readable under the Pod's fsGroup), at
// most a token's size. One trailing newline is dropped. The error never
// holds the content.
func readSecretFile(path string) ([]byte, error) {
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return nil, fmt.Errorf("%s: give a clean absolute path", path)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("%s is a symlink or has one on its path; mount the Secret's key with subPath", path)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, fmt.Errorf("%s is not a regular file", path)
	case st.Mode&0o027 != 0:
		return nil, fmt.Errorf("%s has mode %04o: a credential file must give others nothing and its group no write (0400 or 0440)", path, st.Mode&0o7777)
	case st.Size > routeproxy.MaxTokenBytes+2:
		return nil, fmt.Errorf("%s is larger than a credential (%d bytes at most)", path, routeproxy.MaxTokenBytes)
	}
	// One buffer, never grown: no copy of the key is left behind in a
	// buffer a reallocation dropped.
	buf := make([]byte, routeproxy.MaxTokenBytes+3)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		clear(buf)
		return nil, fmt.Errorf("%s: reading: %w", path, err)
	}
	v := buf[:n]
	if len(v) > routeproxy.MaxTokenBytes+2 {
		clear(buf)
		return nil, fmt.Errorf("%s is larger than a credential (%d bytes at most)", path, routeproxy.MaxTokenBytes)
	}
	if bytes.HasSuffix(v, []byte("\r\n")) {
		v = v[:len(v)-2]
	} else if bytes.HasSuffix(v, []byte("\n")) {
		v = v[:len(v)-1]
	}
	return v, nil
}
