package preflight

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// The runsc digest cache
//
// Hashing the 96 MiB runsc binary is most of what a launch adds to a bare
// `runsc run` (about 70 ms here). The cache remembers the digest for the
// binary's identity: device, inode, size, and modification and change
// times in nanoseconds. Any write, rename over, chmod or touch of the file
// changes its ctime, which user space cannot set back; only root (who is
// trusted here anyway) could forge an identity by moving the clock. The
// cache file itself is trusted only when it is a regular root-owned file
// that nobody else can write, in a directory only root can write.

type fileIdentity struct {
	Dev, Ino, Size uint64
	Mtime, Ctime   int64 // ns
}

type digestEntry struct {
	Path     string       `json:"path"`
	Identity fileIdentity `json:"identity"`
	SHA256   string       `json:"sha256"`
}

func identityOf(fi fs.FileInfo) (fileIdentity, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileIdentity{}, false
	}
	return fileIdentity{Dev: st.Dev, Ino: st.Ino, Size: uint64(st.Size),
		Mtime: st.Mtim.Sec*1e9 + st.Mtim.Nsec, Ctime: st.Ctim.Sec*1e9 + st.Ctim.Nsec}, true
}

// trustedRootFile reports whether p is a regular file owned by root, not
// writable by others, in a directory owned by root and not writable by
// others.
func trustedRootFile(p string) bool {
	for _, q := range []string{p, filepath.Dir(p)} {
		var st syscall.Stat_t
		if err := syscall.Lstat(q, &st); err != nil || st.Uid != 0 || st.Mode&0o022 != 0 {
			return false
		}
	}
	fi, err := os.Lstat(p)
	return err == nil && fi.Mode().IsRegular()
}

func lookupDigest(cacheFile, path string, id fileIdentity) (string, bool) {
	if cacheFile == "" || !trustedRootFile(cacheFile) {
		return "", false
	}
	data, err := os.ReadFile(cacheFile)
	if err != nil {
		return "", false
	}
	var e digestEntry
	if json.Unmarshal(data, &e) != nil || e.Path != path || e.Identity != id || len(e.SHA256) != 64 {
		return "", false
	}
	return e.SHA256, true
}

// storeDigest writes the cache atomically; failures only cost the next
// launch a full hash, so they are ignored.
func storeDigest(cacheFile, path string, id fileIdentity, sum string) {
	if cacheFile == "" || os.Geteuid() != 0 {
		return
	}
	if err := os.MkdirAll(filepath.Dir(cacheFile), 0o700); err != nil {
		return
	}
	data, err := json.Marshal(digestEntry{Path: path, Identity: id, SHA256: sum})
	if err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(cacheFile), ".runsc-digest-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr != nil || cerr != nil {
		os.Remove(tmp.Name())
		return
	}
	if os.Rename(tmp.Name(), cacheFile) != nil {
		os.Remove(tmp.Name())
	}
}
