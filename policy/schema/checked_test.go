package schema

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
)

func baseRegistry(t *testing.T) Input {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "testdata", "base", "registry.json"))
	if err != nil {
		t.Fatal(err)
	}
	return Input{Name: "registry.json", Data: data}
}

// forgetCheckedRegistries empties the cache for one test and again after
// it, so no test depends on what another left there.
func forgetCheckedRegistries(t *testing.T) {
	reset := func() {
		checkedRegistries.mu.Lock()
		checkedRegistries.m = nil
		checkedRegistries.mu.Unlock()
	}
	reset()
	t.Cleanup(reset)
}

func rememberedRegistries() int {
	checkedRegistries.mu.Lock()
	defer checkedRegistries.mu.Unlock()
	return len(checkedRegistries.m)
}

// fullCheck loads a registry through every check, never the cache.
func fullCheck(t *testing.T, in Input) *Registry {
	t.Helper()
	var r Registry
	if ds := NewLoader().load(in, "#Registry", registryPrecheck, &r); len(ds) > 0 {
		t.Fatal(ds)
	}
	return &r
}

// A remembered registry decodes to the value a full check gives, and each
// caller gets its own: writing into one Registry changes no other.
func TestCheckedRegistryDecodedAfresh(t *testing.T) {
	forgetCheckedRegistries(t)
	in := baseRegistry(t)
	want := fullCheck(t, in)
	first, ds := NewLoader().Registry(in)
	if len(ds) > 0 {
		t.Fatal(ds)
	}
	if n := rememberedRegistries(); n != 1 {
		t.Fatalf("%d registries remembered after one check, want 1", n)
	}
	if !reflect.DeepEqual(first, want) {
		t.Fatalf("first load differs from a full check:\n%+v\n%+v", first, want)
	}
	// Scribble on the first result: its map, a nested slice, a scalar.
	for name, d := range first.Deployments {
		d.Topology = "scribbled"
		d.Roots.Workspace[0] = "/scribbled"
		first.Deployments[name] = d
	}
	first.Deployments["scribbled"] = Deployment{}
	first.Image.Version = "scribbled"
	again, ds := NewLoader().Registry(in)
	if len(ds) > 0 {
		t.Fatal(ds)
	}
	if !reflect.DeepEqual(again, want) {
		t.Fatalf("a remembered registry differs from a full check (a caller's writes reached it?):\n%+v\n%+v", again, want)
	}
}

// The cache is keyed by the bytes, not by the caller's buffer: a caller
// that rewrites its buffer after a load gets the new content checked.
func TestCheckedRegistryKeyedByContent(t *testing.T) {
	forgetCheckedRegistries(t)
	in := baseRegistry(t)
	buf := bytes.Clone(in.Data)
	if _, ds := NewLoader().Registry(Input{Name: in.Name, Data: buf}); len(ds) > 0 {
		t.Fatal(ds)
	}
	// Same length, now an unknown field: must be refused, not remembered.
	i := bytes.Index(buf, []byte(`"kind"`))
	copy(buf[i:], `"kinx"`)
	if r, ds := NewLoader().Registry(Input{Name: in.Name, Data: buf}); r != nil || !ds.Has("kinx") {
		t.Fatalf("rewritten buffer: registry %v, diagnostics %v; want the unknown field refused", r != nil, ds)
	}
}

// A refused registry is never remembered: its diagnostics come from a
// full check every time, and they are the same every time.
func TestRefusedRegistryNotRemembered(t *testing.T) {
	forgetCheckedRegistries(t)
	in := baseRegistry(t)
	bad := Input{Name: in.Name, Data: bytes.Replace(in.Data, []byte(`"topology": "host"`), []byte(`"topology": "hots"`), 1)}
	first, ds1 := NewLoader().Registry(bad)
	second, ds2 := NewLoader().Registry(bad)
	if first != nil || second != nil || len(ds1) == 0 {
		t.Fatalf("a bad topology compiled: %v", ds1)
	}
	if ds1.Error() != ds2.Error() {
		t.Fatalf("diagnostics differ between two loads:\n%v\n%v", ds1, ds2)
	}
	if n := rememberedRegistries(); n != 0 {
		t.Fatalf("%d refused registries remembered", n)
	}
}

// Loads on many goroutines, each with its own Loader, over two registries
// and from an empty cache (so misses, stores and hits interleave), give
// every goroutine the value a lone load gives. Run under -race.
func TestCheckedRegistryConcurrent(t *testing.T) {
	forgetCheckedRegistries(t)
	a := baseRegistry(t)
	b := Input{Name: a.Name, Data: bytes.Replace(a.Data, []byte(`"host-alice"`), []byte(`"host-bob"`), 1)}
	wantA, dsA := NewLoader().Registry(a)
	wantB, dsB := NewLoader().Registry(b)
	if len(dsA)+len(dsB) > 0 {
		t.Fatal(dsA, dsB)
	}
	forgetCheckedRegistries(t)
	var wg sync.WaitGroup
	errs := make(chan string, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, want := a, wantA
			if i%2 == 1 {
				in, want = b, wantB
			}
			ld := NewLoader()
			for range 3 {
				got, ds := ld.Registry(in)
				if len(ds) > 0 || !reflect.DeepEqual(got, want) {
					errs <- "a concurrent load gave a different registry"
					return
				}
				got.Deployments["scribbled"] = Deployment{} // its own to write
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if n := rememberedRegistries(); n != 2 {
		t.Errorf("%d registries remembered, want 2", n)
	}
}
