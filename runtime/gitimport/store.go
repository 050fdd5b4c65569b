package gitimport

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
)

// The store is the agent's: every byte, name and link in it was written by
// the sandbox. It is opened beneath its state root by descriptor, each
// entry opened relative to its directory's descriptor with symlinks and
// mount crossings refused, and only regular files are read.

const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// storeDir is an open directory of the store and its name for messages.
type storeDir struct {
	fd   int
	name string // relative to the store, for diagnostics
}

func (d storeDir) close() { unix.Close(d.fd) }

// openStore opens store beneath root (both absolute and clean).
func openStore(root, store string) (storeDir, error) {
	if !pathform.Beneath(root, store) || root == store {
		return storeDir{}, refusef(diag.GitImportRepo, "store", "the store %q must lie beneath its state root %q", store, root)
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return storeDir{}, refusef(diag.GitImportRepo, "store", "the state root %q: %v", root, err)
	}
	defer unix.Close(rootFD)
	fd, err := unix.Openat2(rootFD, pathform.Rel(root, store), &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath})
	if err != nil {
		return storeDir{}, refusef(diag.GitImportStore, "store", "the store %q cannot be opened beneath %q without following a link: %v", store, root, err)
	}
	return storeDir{fd: fd, name: "."}, nil
}

// entry is one directory entry, as the directory lists it (no stat).
type entry struct {
	name string
	dir  bool
}

// list returns d's entries, sorted, refusing more than max and any that is
// neither a regular file nor a directory (a symlink, a device, a fifo).
// The type is checked again on the descriptor when an entry is opened.
func (d storeDir) list(max int) ([]entry, error) {
	dup, err := unix.Dup(d.fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), d.name)
	defer f.Close()
	var out []entry
	for {
		des, err := f.ReadDir(256)
		for _, de := range des {
			t := de.Type()
			if !t.IsRegular() && !t.IsDir() {
				return nil, refusef(diag.GitImportStore, "store/"+d.name, "%q is a %v, not a regular file or directory; the import follows no link", de.Name(), t.Type())
			}
			out = append(out, entry{name: de.Name(), dir: t.IsDir()})
			if len(out) > max {
				return nil, refusef(diag.GitImportStore, "store/"+d.name, "more than %d entries", max)
			}
		}
		if errors.Is(err, io.EOF) || len(des) == 0 {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// dir opens the subdirectory name of d; ok is false when it does not exist.
func (d storeDir) dir(name string) (storeDir, bool, error) {
	fd, err := unix.Openat2(d.fd, name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: beneath})
	switch {
	case errors.Is(err, unix.ENOENT):
		return storeDir{}, false, nil
	case err != nil:
		return storeDir{}, false, refusef(diag.GitImportStore, "store/"+d.join(name), "cannot be opened as a directory without following a link: %v", err)
	}
	return storeDir{fd: fd, name: d.join(name)}, true, nil
}

// file opens the regular file name of d, no larger than max bytes; ok is
// false when it does not exist.
func (d storeDir) file(name string, max int64) (*os.File, int64, bool, error) {
	fd, err := unix.Openat2(d.fd, name, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC, Resolve: beneath})
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, 0, false, nil
	case err != nil:
		return nil, 0, false, refusef(diag.GitImportStore, "store/"+d.join(name), "cannot be opened without following a link: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, 0, false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, 0, false, refusef(diag.GitImportStore, "store/"+d.join(name), "is not a regular file")
	}
	if st.Size > max {
		unix.Close(fd)
		return nil, 0, false, refusef(diag.GitImportStore, "store/"+d.join(name), "is %d bytes, over the bound of %d", st.Size, max)
	}
	return os.NewFile(uintptr(fd), d.join(name)), st.Size, true, nil
}

// readAll reads the regular file name of d whole (at most max bytes).
func (d storeDir) readAll(name string, max int64) ([]byte, bool, error) {
	f, size, ok, err := d.file(name, max)
	if !ok || err != nil {
		return nil, ok, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, size+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(data)) > max {
		return nil, false, refusef(diag.GitImportStore, "store/"+d.join(name), "grew over the bound of %d bytes while read", max)
	}
	return data, true, nil
}

func (d storeDir) join(name string) string {
	if d.name == "." {
		return name
	}
	return d.name + "/" + name
}

var (
	fanoutName = regexp.MustCompile(`^[0-9a-f]{2}$`)
	packName   = regexp.MustCompile(`^pack-[0-9a-f]{40}([0-9a-f]{24})?\.pack$`)
)

// storeObjects are the store's objects as the import takes them: loose
// objects by id, and packs (whose .idx, written by the agent, is never
// read: the quarantine indexes every pack itself).
type storeObjects struct {
	loose []looseObject
	packs []string // names in objects/pack
}

type looseObject struct {
	id   string
	path string // fanout/rest, relative to objects/
}

// readObjects lists objects/ of the store. Loose object names must be the
// repository's id length; anything in objects/ that is not a fanout
// directory, pack/ or info/ is refused, and so is a link anywhere in them.
func readObjects(store storeDir, hexLen int, lim Limits) (storeObjects, error) {
	var out storeObjects
	objects, ok, err := store.dir("objects")
	if err != nil || !ok {
		return out, err
	}
	defer objects.close()
	entries, err := objects.list(lim.MaxFiles)
	if err != nil {
		return out, err
	}
	rest := regexp.MustCompile(fmt.Sprintf(`^[0-9a-f]{%d}$`, hexLen-2))
	n := 0
	for _, e := range entries {
		switch {
		case e.name == "info":
			// The start script's alternates: never read, never followed.
		case e.name == "pack" && e.dir:
			pack, _, err := objects.dir("pack")
			if err != nil {
				return out, err
			}
			names, err := pack.list(lim.MaxFiles)
			pack.close()
			if err != nil {
				return out, err
			}
			for _, p := range names {
				if !p.dir && packName.MatchString(p.name) {
					out.packs = append(out.packs, p.name)
				}
				// .idx, .rev, .keep, .bitmap, .mtimes, multi-pack-index,
				// tmp_pack_*: the agent's, never read.
			}
		case fanoutName.MatchString(e.name) && e.dir:
			fan, _, err := objects.dir(e.name)
			if err != nil {
				return out, err
			}
			names, err := fan.list(lim.MaxFiles)
			fan.close()
			if err != nil {
				return out, err
			}
			for _, o := range names {
				if o.dir || !rest.MatchString(o.name) {
					if len(o.name) > 8 && o.name[:8] == "tmp_obj_" {
						continue // an object git was writing when the sandbox stopped
					}
					return out, refusef(diag.GitImportStore, "store/objects/"+e.name, "%q is no loose object of this repository's id length", o.name)
				}
				out.loose = append(out.loose, looseObject{id: e.name + o.name, path: e.name + "/" + o.name})
			}
		default:
			return out, refusef(diag.GitImportStore, "store/objects", "%q is neither a fanout directory nor pack/ or info/", e.name)
		}
		n = len(out.loose) + len(out.packs)
		if n > lim.MaxFiles {
			return out, refusef(diag.GitImportStore, "store/objects", "more than %d object files", lim.MaxFiles)
		}
	}
	return out, nil
}
