package routeproxy

import (
	"bytes"
	"io"
	"sync/atomic"
	"testing"
)

// FuzzBodyPolicy: no body makes a check panic (the proxy runs as root),
// and an admitted body's re-encoding, what the provider gets, is
// admitted again and names the route's model.
func FuzzBodyPolicy(f *testing.F) {
	for _, bs := range piBodies {
		for _, b := range bs {
			f.Add([]byte(b))
		}
	}
	for _, c := range bodyAttacks {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := decodeStrict(data)
		if err != nil {
			return
		}
		for api, p := range BodyPolicies {
			if p.Check(n, "m-1") != nil {
				continue
			}
			again, err := decodeStrict(n.bytes())
			if err != nil {
				t.Fatalf("%s: the re-encoding of an admitted body does not decode: %v", api, err)
			}
			if rf := p.Check(again, "m-1"); rf != nil {
				t.Fatalf("%s: the re-encoding of an admitted body is refused: %v", api, rf)
			}
			if m, ok := again.get("model"); ok && (m.kind != kindString || m.str != "m-1") {
				t.Fatalf("%s: an admitted body names model %q", api, m.str)
			}
		}
	})
}

// FuzzScrub: whatever the provider streams around the key, in whatever
// chunks, the sandbox gets as many bytes and none of the key's spellings.
// Run by hand (go test -fuzz=FuzzScrub): one-byte chunks make it too slow
// for make fuzz's 300000 runs; go test runs its seeds.
func FuzzScrub(f *testing.F) {
	doc, _, _ := echoDoc(scrubKey)
	f.Add([]byte(doc), uint8(7))
	f.Add([]byte("data: "+scrubKey[:20]), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, size uint8) {
		var n atomic.Int64
		s := newScrubber([]byte(scrubKey), &n)
		b := &scrubBody{s: s, src: io.NopCloser(&chunked{data: bytes.Clone(data), size: int(size%64) + 1}), readBuf: make([]byte, 8<<10)}
		out, err := io.ReadAll(b)
		if err != nil || len(out) != len(data) {
			t.Fatalf("%d bytes of %d (%v)", len(out), len(data), err)
		}
		for _, sp := range keySpellings([]byte(scrubKey)) {
			if bytes.Contains(out, sp) {
				t.Fatalf("the spelling %q passed", sp)
			}
		}
	})
}
