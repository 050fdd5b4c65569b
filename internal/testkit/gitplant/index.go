package gitplant

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
)

// The index is a file in the writable Git dir, so a sandbox can rewrite it
// byte by byte. Only version 2 (what git 2.39 writes here) is handled:
// "DIRC", version, count, entries padded to 8 bytes, extensions, SHA-1.

type indexEntry struct {
	fixed [62]byte // stat data, mode, id, flags: kept as Git wrote them
	name  string
}

// rewriteIndex reads the index, adds entries, drops Git's extensions (the
// cache-tree would no longer match) and appends ext, then writes it back.
func rewriteIndex(t testing.TB, path string, add []indexEntry, ext []byte) {
	t.Helper()
	data := []byte(readFile(t, path))
	if len(data) < 32 || string(data[:4]) != "DIRC" || binary.BigEndian.Uint32(data[4:]) != 2 {
		t.Fatalf("%s: not a version 2 index", path)
	}
	n, off := int(binary.BigEndian.Uint32(data[8:])), 12
	var ents []indexEntry
	for i := 0; i < n; i++ {
		var e indexEntry
		copy(e.fixed[:], data[off:off+62])
		nameLen := int(binary.BigEndian.Uint16(data[off+60:]) & 0xfff)
		e.name = string(data[off+62 : off+62+nameLen])
		ents = append(ents, e)
		off += (62 + nameLen + 8) &^ 7
	}
	ents = append(ents, add...)
	slices.SortFunc(ents, func(a, b indexEntry) int { return strings.Compare(a.name, b.name) })
	var out bytes.Buffer
	out.WriteString("DIRC")
	binary.Write(&out, binary.BigEndian, [2]uint32{2, uint32(len(ents))})
	for _, e := range ents {
		out.Write(e.fixed[:])
		out.WriteString(e.name)
		out.Write(make([]byte, ((62+len(e.name)+8)&^7)-62-len(e.name)))
	}
	out.Write(ext)
	sum := sha1.Sum(out.Bytes())
	out.Write(sum[:])
	writeFile(t, path, out.String())
}

// gitlink is an index entry for a submodule commit (mode 160000) at name.
func gitlink(t testing.TB, name, commit string) indexEntry {
	t.Helper()
	id, err := hex.DecodeString(commit)
	if err != nil || len(id) != 20 {
		t.Fatalf("gitlink %s: bad id %q", name, commit)
	}
	var e indexEntry
	e.name = name
	binary.BigEndian.PutUint32(e.fixed[24:], 0o160000)
	copy(e.fixed[40:60], id)
	binary.BigEndian.PutUint16(e.fixed[60:], uint16(len(name)))
	return e
}

// extension is one index extension: signature, length, payload.
func extension(sig string, payload []byte) []byte {
	var b bytes.Buffer
	b.WriteString(sig)
	binary.Write(&b, binary.BigEndian, uint32(len(payload)))
	b.Write(payload)
	return b.Bytes()
}

// fsmonitorExt is an FSMN extension, version 2: the token Git hands the
// core.fsmonitor hook, then an empty EWAH bitmap of dirty entries.
func fsmonitorExt(token string) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, uint32(2))
	b.WriteString(token)
	b.WriteByte(0)
	// EWAH: bit size, one 64-bit run-length word, the index of that word.
	var ewah bytes.Buffer
	binary.Write(&ewah, binary.BigEndian, uint32(0))
	binary.Write(&ewah, binary.BigEndian, uint32(1))
	binary.Write(&ewah, binary.BigEndian, uint64(0))
	binary.Write(&ewah, binary.BigEndian, uint32(0))
	binary.Write(&b, binary.BigEndian, uint32(ewah.Len()))
	b.Write(ewah.Bytes())
	return extension("FSMN", b.Bytes())
}
