package gitimport

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"

	"paseo.dev/paseo-policy/diag"
)

// refComponent is what the import accepts as one component of a ref name:
// stricter than git's check-ref-format, so a name is never a shell word,
// an option, a path trick or a lock file, and prints as itself.
var refComponent = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._+-]{0,254}$`)

// validRef reports whether name is refs/<...> made of accepted components,
// none ending in .lock or a dot, and no ".." anywhere.
func validRef(name string) bool {
	if !strings.HasPrefix(name, "refs/") || len(name) > 1024 || strings.Contains(name, "..") {
		return false
	}
	parts := strings.Split(name, "/")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts[1:] {
		if !refComponent.MatchString(p) || strings.HasSuffix(p, ".lock") || strings.HasSuffix(p, ".") {
			return false
		}
	}
	return true
}

// storeRef is one ref the store offers: its name and id, or bad when its
// name or content is not what the import reads (kept to refuse it only
// when it is granted).
type storeRef struct {
	id  string
	bad string // why it cannot be read; empty when it can
}

// readRefs reads the store's refs: packed-refs, then loose refs under
// refs/, which win as in git. Names and ids are data: a name that is not
// a valid ref, a symbolic ref, an id of the wrong shape are recorded as
// bad, never followed.
func readRefs(store storeDir, hexLen int, lim Limits) (map[string]storeRef, error) {
	refs := map[string]storeRef{}
	idRE := regexp.MustCompile(fmt.Sprintf(`^[0-9a-f]{%d}$`, hexLen))
	packed, ok, err := store.readAll("packed-refs", lim.MaxRefBytes)
	if err != nil {
		return nil, err
	}
	if ok {
		for i, line := range bytes.Split(packed, []byte("\n")) {
			s := string(line)
			switch {
			case s == "" || strings.HasPrefix(s, "#") || strings.HasPrefix(s, "^"):
				continue // the header, a peeled tag
			}
			id, name, found := strings.Cut(s, " ")
			switch {
			case !found:
				continue // not a ref line; git would refuse the file, the import reads no ref from it
			case !validRef(name):
				refs[name] = storeRef{bad: "not a ref name the import accepts"}
				continue
			case !idRE.MatchString(id):
				refs[name] = storeRef{bad: fmt.Sprintf("packed-refs line %d has no valid id", i+1)}
				continue
			}
			refs[name] = storeRef{id: id}
			if len(refs) > lim.MaxRefs {
				return nil, refusef(diag.GitImportStore, "store/packed-refs", "more than %d refs", lim.MaxRefs)
			}
		}
	}
	dir, ok, err := store.dir("refs")
	if err != nil || !ok {
		return refs, err
	}
	defer dir.close()
	if err := walkRefs(dir, "refs", 0, idRE, refs, lim); err != nil {
		return nil, err
	}
	return refs, nil
}

// maxRefDepth bounds how deep refs/ is walked.
const maxRefDepth = 16

func walkRefs(d storeDir, prefix string, depth int, idRE *regexp.Regexp, refs map[string]storeRef, lim Limits) error {
	if depth > maxRefDepth {
		return refusef(diag.GitImportStore, "store/"+d.name, "refs nested deeper than %d", maxRefDepth)
	}
	entries, err := d.list(lim.MaxRefs)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := prefix + "/" + e.name
		if e.dir {
			sub, _, err := d.dir(e.name)
			if err != nil {
				return err
			}
			err = walkRefs(sub, name, depth+1, idRE, refs, lim)
			sub.close()
			if err != nil {
				return err
			}
			continue
		}
		if !validRef(name) {
			// Kept to refuse it if granted, to list it if not; printed
			// quoted, never read.
			refs[name] = storeRef{bad: "not a ref name the import accepts"}
			continue
		}
		data, _, err := d.readAll(e.name, 4096)
		if err != nil {
			return err
		}
		id := strings.TrimSuffix(string(data), "\n")
		switch {
		case strings.HasPrefix(id, "ref: "):
			refs[name] = storeRef{bad: "a symbolic ref"}
		case !idRE.MatchString(id):
			refs[name] = storeRef{bad: "not an object id of this repository's length"}
		default:
			refs[name] = storeRef{id: id}
		}
		if len(refs) > lim.MaxRefs {
			return refusef(diag.GitImportStore, "store/refs", "more than %d refs", lim.MaxRefs)
		}
	}
	return nil
}
