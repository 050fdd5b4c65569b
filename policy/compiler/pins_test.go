package compiler

import (
	"slices"
	"testing"

	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/bundle"
	"paseo.dev/paseo-policy/policy/schema"
)

// pins.json has one pin per host bind, with the registered root it lies
// beneath, and names the manifest it was compiled with; file binds (the
// extension, auth.json in oauth-file mode) and docker's mapped paths too.
func TestEveryBindIsPinnedBeneathItsRoot(t *testing.T) {
	for _, name := range []string{"host-pi-session-api-key", "host-pi-session-oauth", "docker-pi-session", "host-git-readonly"} {
		t.Run(name, func(t *testing.T) {
			_, in, res := caseInputs(t, name)
			r, diags := Compile(in, Options{Resolver: res})
			if len(diags) > 0 {
				t.Fatal(diags)
			}
			pairs, err := r.Files.PinnedBinds()
			if err != nil {
				t.Fatal(err)
			}
			dep := r.Manifest.Deployment
			reg, rd := schema.LoadRegistry(in.Registry)
			if len(rd) > 0 {
				t.Fatal(rd)
			}
			roots := reg.Deployments[dep].Roots
			all := slices.Concat(roots.Workspace, roots.State, roots.Launch)
			kinds := map[string]string{}
			for _, p := range pairs {
				if !slices.Contains(all, p.Pin.Root) || !pathform.Beneath(p.Pin.Root, p.Pin.Source) {
					t.Errorf("pin %s: root %s is not a registered root above %s", p.Pin.Destination, p.Pin.Root, p.Pin.Source)
				}
				kinds[p.Pin.Destination] = p.Pin.Kind
			}
			facts, fd := schema.NewLoader().Facts(in.Facts)
			if len(fd) > 0 {
				t.Fatal(fd)
			}
			// File binds are pinned like directories: the extension always,
			// auth.json in oauth-file mode.
			want := []string{facts.Launch.Extension}
			if facts.Credential.Mode == "oauth-file" {
				want = append(want, facts.Credential.AuthFile)
			}
			for _, dest := range want {
				if kinds[dest] != "file" {
					t.Errorf("file bind %s pinned as %q, want a file pin", dest, kinds[dest])
				}
			}
			pins, err := r.Files.Pins()
			if err != nil || pins.Manifest != bundle.Digest(r.Files[bundle.ManifestFile]) || len(pins.Pins) != len(pairs) {
				t.Errorf("pins.json: %v, %d pins for %d binds", err, len(pins.Pins), len(pairs))
			}
		})
	}
}
