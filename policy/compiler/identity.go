package compiler

import (
	"fmt"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/policy/schema"
)

// sandboxUser is the uid and gid the deployment's sandboxes run as, and the
// facts they come from: the deployment's user when the registry sets one
// (the daemon user's, so the workspace it owns stays writable and what the
// agent creates stays its own), the image's otherwise. Every owner the
// compiler writes (the process identity, HOME, the agent-dir projection)
// comes from here, so they never disagree.
func (c *compilation) sandboxUser() (uid, gid uint32, uidFact, gidFact string) {
	if u := c.dep.User; u != nil {
		base := "registry.deployments." + c.facts.Deployment.ID + ".user"
		return u.UID, u.GID, base + ".uid", base + ".gid"
	}
	return c.reg.Image.UID, c.reg.Image.GID, "registry.image.uid", "registry.image.gid"
}

// ownerOptions are the tmpfs options that make the sandbox user own a mount.
func (c *compilation) ownerOptions() (string, string) {
	uid, gid, _, _ := c.sandboxUser()
	return fmt.Sprintf("uid=%d", uid), fmt.Sprintf("gid=%d", gid)
}

// maxID bounds a deployment's uid and gid as the image's are (registry.cue).
const maxID = 65535

// checkUser refuses a deployment user that is root or out of range, here
// rather than in the schema so the refusal names the field and the reason.
func checkUser(l *diag.List, base string, u *schema.User) {
	if u == nil {
		return
	}
	for _, f := range []struct {
		name string
		v    uint32
	}{{"uid", u.UID}, {"gid", u.GID}} {
		switch {
		case f.v == 0:
			l.Addf(diag.Registry, base+".user."+f.name, "a deployment's sandboxes never run as root")
		case f.v > maxID:
			l.Addf(diag.Registry, base+".user."+f.name, "%s %d is out of range (1-%d)", f.name, f.v, maxID)
		}
	}
}
