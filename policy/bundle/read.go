package bundle

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// fileNames are the files a bundle is made of, in the order Read opens them.
var fileNames = []string{ConfigFile, EgressFile, ManifestFile, PinsFile, HostsFile, ResolvFile, MCPConfigFile, GitHeadFile, ModelsFile, FSMonitorHookFile, FSMonitorIndexFile, SearchClientFile, SearchSpoolFile}

// optional files may be absent: pins.json (a bundle not yet bound to a
// host) and the MCP config (no private MCP route).
func optional(name string) bool {
	return name == PinsFile || name == MCPConfigFile || name == GitHeadFile || name == ModelsFile || name == FSMonitorHookFile || name == FSMonitorIndexFile || name == SearchClientFile || name == SearchSpoolFile
}

// Read loads the files a bundle is made of from dir. Each file is opened
// once, beneath a descriptor of dir and without following symlinks, must
// be a regular file, and is read whole through that descriptor: what the
// caller verifies is exactly what it then uses, and nothing opens the file
// again. Missing optional files (pins.json, files/mcp.json) are left out;
// a missing policy file is an error, and Verify refuses a missing file the
// manifest lists.
func Read(dir string) (Files, error) {
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("bundle %s: %w", dir, err)
	}
	defer d.Close()
	f := Files{}
	for _, n := range fileNames {
		data, err := readBeneath(int(d.Fd()), n, filepath.Join(dir, filepath.FromSlash(n)))
		if err != nil {
			if errors.Is(err, unix.ENOENT) && optional(n) {
				continue
			}
			return nil, fmt.Errorf("bundle %s: %w", dir, err)
		}
		f[n] = data
	}
	return f, nil
}

// MaxFileBytes bounds one bundle file as read: the compiler writes tens of
// kilobytes, and a launcher must not be made to hold an unbounded file in
// memory.
const MaxFileBytes = 16 << 20

// readBeneath opens name beneath dirfd (no symlinks, no escape, no magic
// links), refuses anything but a regular file (a FIFO would block the
// reader, a device is not a bundle file) and reads it through the
// descriptor.
func readBeneath(dirfd int, name, path string) ([]byte, error) {
	fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	file := os.NewFile(uintptr(fd), path)
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (mode %s)", path, fi.Mode())
	}
	data, err := io.ReadAll(io.LimitReader(file, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxFileBytes)
	}
	return data, nil
}
