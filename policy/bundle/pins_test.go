package bundle

import (
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func bindMount(dest, src string) specs.Mount {
	return specs.Mount{Destination: dest, Type: "bind", Source: src, Options: []string{"bind", "rw"}}
}

func TestPairBinds(t *testing.T) {
	ws := Pin{Destination: "/w", Source: "/srv/ws/a", Root: "/srv/ws", Kind: "dir"}
	ext := Pin{Destination: "/x.mjs", Source: "/srv/launch/x.mjs", Root: "/srv/launch", Kind: "file"}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		bindMount("/w", "/srv/ws/a"),
		bindMount("/etc/hosts", HostsFile),
		bindMount("/x.mjs", "/srv/launch/x.mjs"),
	}
	got, err := PairBinds(mounts, []Pin{ext, ws})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Mount != 1 || got[0].Pin != ws || got[1].Mount != 3 || got[1].Pin != ext {
		t.Fatalf("pairs %+v", got)
	}

	for name, tc := range map[string]struct {
		mounts []specs.Mount
		pins   []Pin
		want   string
	}{
		"unpinned bind":       {mounts, []Pin{ws}, "bind /x.mjs: source /srv/launch/x.mjs has no pin"},
		"pin without bind":    {mounts[:2], []Pin{ws, ext}, "pin /x.mjs (source /srv/launch/x.mjs) belongs to no bind"},
		"other destination":   {[]specs.Mount{bindMount("/elsewhere", "/srv/ws/a")}, []Pin{ws}, "has no pin"},
		"two pins":            {mounts[:2], []Pin{ws, ws}, "more than one pin"},
		"rbind option":        {[]specs.Mount{{Destination: "/w", Source: "/srv/ws/b", Options: []string{"rbind"}}}, nil, "has no pin"},
		"relative source":     {[]specs.Mount{bindMount("/w", "files/other")}, nil, "neither a host path nor a bundle file"},
		"source outside root": {mounts[:2], []Pin{{Destination: "/w", Source: "/srv/ws/a", Root: "/srv/other", Kind: "dir"}}, "does not lie beneath its root"},
		"root prefix only":    {mounts[:2], []Pin{{Destination: "/w", Source: "/srv/ws/a", Root: "/srv/w", Kind: "dir"}}, "does not lie beneath its root"},
		"no root":             {mounts[:2], []Pin{{Destination: "/w", Source: "/srv/ws/a", Kind: "dir"}}, "not an absolute clean path"},
		"odd kind":            {mounts[:2], []Pin{{Destination: "/w", Source: "/srv/ws/a", Root: "/srv/ws", Kind: "other"}}, "cannot be bound"},
	} {
		if _, err := PairBinds(tc.mounts, tc.pins); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
}

// pins.json is tied to the manifest's bytes: another compile's pins (or
// none at all) do not pass.
func TestPinsNameTheirManifest(t *testing.T) {
	f := Files{ManifestFile: []byte(`{"kind":"Manifest"}`)}
	doc := func(manifest string) []byte {
		b, _ := Marshal(Pins{APIVersion: APIVersion, Kind: PinsKind, Manifest: manifest, Pins: []Pin{}})
		return b
	}
	f[PinsFile] = doc(Digest(f[ManifestFile]))
	if _, err := f.Pins(); err != nil {
		t.Fatal(err)
	}
	f[PinsFile] = doc(Digest([]byte("another manifest")))
	if _, err := f.Pins(); err == nil || !strings.Contains(err.Error(), "pins from another compile are refused") {
		t.Fatalf("foreign pins: %v", err)
	}
	f[PinsFile] = []byte(`[]`)
	if _, err := f.Pins(); err == nil {
		t.Fatal("the old list form of pins.json was accepted")
	}
}
