package gitplant

import (
	"bytes"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"os"
	"testing"
)

// Forged object indexes. Git reads a multi-pack-index and a commit-graph
// without checking their trailing hash or re-hashing what they point at:
// a multi-pack-index maps an object id to an offset in a pack, and git
// returns whatever object sits there; a commit-graph gives a commit's root
// tree and parents, which a history walk takes instead of parsing the
// commit. Both files are made by real git and then rewritten here, so the
// forgery is git's own format with one lie in it (and a fresh checksum,
// so even `verify` of the trailer passes).

// ForgeMIDX rewrites the multi-pack-index at path, which git wrote over
// one pack holding exactly one object, so that it lists claim instead of
// that object: git then answers claim with the pack's object.
func ForgeMIDX(t testing.TB, path, claim string) {
	t.Helper()
	data := readBytes(t, path)
	id := hexID(t, claim)
	if len(data) < 12 || string(data[:4]) != "MIDX" || data[5] != 1 {
		t.Fatalf("%s: not a SHA-1 multi-pack-index", path)
	}
	chunks := chunkTable(t, data, 12, int(data[6]))
	fanout, oids := chunks["OIDF"], chunks["OIDL"]
	if binary.BigEndian.Uint32(data[fanout+255*4:]) != 1 {
		t.Fatalf("%s: forge needs a multi-pack-index of one object", path)
	}
	forgeOne(data, fanout, oids, id)
	rehash(data)
	writeFile(t, path, string(data))
}

// ForgeCommitGraph rewrites the commit-graph at path so that it gives
// commit the root tree tree.
func ForgeCommitGraph(t testing.TB, path, commit, tree string) {
	t.Helper()
	data := readBytes(t, path)
	c, tr := hexID(t, commit), hexID(t, tree)
	if len(data) < 8 || string(data[:4]) != "CGPH" || data[5] != 1 || data[7] != 0 {
		t.Fatalf("%s: not a single SHA-1 commit-graph", path)
	}
	chunks := chunkTable(t, data, 8, int(data[6]))
	fanout, oids, cdat := chunks["OIDF"], chunks["OIDL"], chunks["CDAT"]
	n := int(binary.BigEndian.Uint32(data[fanout+255*4:]))
	for i := 0; i < n; i++ {
		if bytes.Equal(data[oids+i*20:oids+i*20+20], c) {
			copy(data[cdat+i*36:], tr) // a CDAT entry: tree, two parent positions, generation and date
			rehash(data)
			writeFile(t, path, string(data))
			return
		}
	}
	t.Fatalf("%s: %s is not in the graph", path, commit)
}

// forgeOne makes a one-object fanout and id list name id.
func forgeOne(data []byte, fanout, oids int, id []byte) {
	for i := 0; i < 256; i++ {
		v := uint32(0)
		if i >= int(id[0]) {
			v = 1
		}
		binary.BigEndian.PutUint32(data[fanout+i*4:], v)
	}
	copy(data[oids:], id)
}

// chunkTable reads a chunk table of n chunks (and its terminator) at off:
// 4-byte id, 8-byte offset each.
func chunkTable(t testing.TB, data []byte, off, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := 0; i < n; i++ {
		e := data[off+i*12:]
		out[string(e[:4])] = int(binary.BigEndian.Uint64(e[4:12]))
	}
	for _, c := range []string{"OIDF", "OIDL"} {
		if _, ok := out[c]; !ok {
			t.Fatalf("chunk %s missing", c)
		}
	}
	return out
}

// rehash rewrites the trailing SHA-1 over everything before it.
func rehash(data []byte) {
	sum := sha1.Sum(data[:len(data)-20])
	copy(data[len(data)-20:], sum[:])
}

func hexID(t testing.TB, id string) []byte {
	t.Helper()
	b, err := hex.DecodeString(id)
	if err != nil || len(b) != 20 {
		t.Fatalf("object id %q: want 40 hex digits", id)
	}
	return b
}

func readBytes(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
