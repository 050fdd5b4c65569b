package preflight

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// runscInfo is what one open of the runsc binary showed: the static-ness and
// the digest are taken from the same open file, so both describe one object.
type runscInfo struct {
	path    string
	openErr error
	static  error
	sha256  string // hex
}

func inspectRunsc(path string) runscInfo { return inspectRunscCached(path, "") }

// inspectRunscCached is inspectRunsc with a digest cache (see digestcache.go):
// when cacheFile records the digest for the file's current identity, the
// binary is not read again.
func inspectRunscCached(path, cacheFile string) runscInfo {
	info := runscInfo{path: path}
	if path == "" {
		info.openErr = because(ErrNotGiven, "no runsc path given")
		return info
	}
	f, err := os.Open(path)
	if err != nil {
		info.openErr = fmt.Errorf("runsc binary: %w", err)
		return info
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		info.openErr = fmt.Errorf("runsc binary: %w", err)
		return info
	}
	switch {
	case !st.Mode().IsRegular():
		info.openErr = because(ErrNotRegular, "runsc binary %s is not a regular file (%s)", path, st.Mode().Type())
		return info
	case st.Mode().Perm()&0o111 == 0:
		info.openErr = because(ErrNotExecutable, "runsc binary %s is not executable (mode %s)", path, st.Mode().Perm())
		return info
	case st.Mode().Perm()&0o022 != 0:
		info.openErr = because(ErrWritable, "runsc binary %s is writable by group or others (mode %s); root would execute whatever they put there", path, st.Mode().Perm())
		return info
	}
	id, idOK := identityOf(st)
	if sum, ok := lookupDigest(cacheFile, path, id); idOK && ok {
		info.sha256 = sum
	} else {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			info.openErr = fmt.Errorf("reading runsc binary %s: %w", path, err)
			return info
		}
		info.sha256 = hex.EncodeToString(h.Sum(nil))
		if idOK {
			storeDigest(cacheFile, path, id, info.sha256)
		}
	}
	info.static = staticELF(f)
	if info.static != nil {
		info.static = fmt.Errorf("runsc binary %s: %w", path, info.static)
	}
	return info
}

// staticELF requires an executable ELF with no program interpreter
// (PT_INTERP) and no shared-library dependencies (DT_NEEDED): the launcher
// runs runsc in a stripped-down mount namespace where no loader or libc can
// be relied on, and a dynamic runsc would trust the host's libraries.
func staticELF(r io.ReaderAt) error {
	f, err := elf.NewFile(r)
	if err != nil {
		return because(ErrNotELF, "not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return because(ErrNotELF, "ELF type %s is not an executable", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp, _ := io.ReadAll(io.LimitReader(p.Open(), 4096))
			return because(ErrDynamic, "dynamically linked: has program interpreter %q (PT_INTERP)", string(bytes.TrimRight(interp, "\x00")))
		}
	}
	needed, err := f.DynString(elf.DT_NEEDED)
	if err != nil {
		return fmt.Errorf("reading dynamic section: %w", err)
	}
	if len(needed) > 0 {
		return because(ErrDynamic, "dynamically linked: needs shared libraries %s (DT_NEEDED)", strings.Join(needed, ", "))
	}
	return nil
}

func (i runscInfo) staticErr() error {
	if i.openErr != nil {
		return i.openErr
	}
	return i.static
}

func (i runscInfo) digestErr(digestFile string) error {
	if i.openErr != nil {
		return i.openErr
	}
	if digestFile == "" {
		return because(ErrNotGiven, "no runsc digest file given")
	}
	want, err := readDigestFile(digestFile, filepath.Base(i.path))
	if err != nil {
		return err
	}
	if want != i.sha256 {
		return because(ErrDigestDiffers, "runsc binary %s has sha256 %s but %s records %s; rebuild it with tools/runsc/build.sh or fix the digest file", i.path, i.sha256, digestFile, want)
	}
	return nil
}

// readDigestFile parses sha256sum output ("<hex>  <name>" or "<hex> *<name>"
// per line) and returns the digest for name. A file with a single entry is
// taken as the digest whatever name it records.
func readDigestFile(path, name string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("runsc digest file: %w", err)
	}
	type entry struct{ digest, name string }
	var entries []entry
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		digest, rest, _ := strings.Cut(text, " ")
		digest = strings.ToLower(digest)
		if b, err := hex.DecodeString(digest); err != nil || len(b) != sha256.Size {
			return "", because(ErrDigestFile, "runsc digest file %s line %d: first field is not a sha256 hex digest", path, line)
		}
		entries = append(entries, entry{digest, strings.TrimPrefix(strings.TrimSpace(rest), "*")})
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("runsc digest file %s: %w", path, err)
	}
	switch {
	case len(entries) == 0:
		return "", because(ErrDigestFile, "runsc digest file %s has no digest", path)
	case len(entries) == 1:
		return entries[0].digest, nil
	}
	for _, e := range entries {
		if e.name == name {
			return e.digest, nil
		}
	}
	return "", because(ErrDigestFile, "runsc digest file %s has no entry for %s", path, name)
}
