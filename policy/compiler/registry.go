package compiler

import (
	"fmt"
	"maps"
	"slices"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/schema"
)

// LoadRegistry loads a registry and checks it whole, as every compile
// does: what `paseo-policy check-registry` and the supervisor run on their
// own. Diagnostic paths start with "registry".
func LoadRegistry(in schema.Input) (*schema.Registry, diag.List) {
	reg, rd := schema.LoadRegistry(in)
	var l diag.List
	for _, d := range rd {
		d.Path = prefixed("registry", d.Path)
		l = append(l, d)
	}
	if reg == nil {
		return nil, l.Sorted()
	}
	checkRegistry(&l, reg)
	if len(l) > 0 {
		return nil, l.Sorted()
	}
	return reg, nil
}

// checkRegistry validates every deployment, the image and the network, not
// only the entry a compile uses: a registry with one bad entry is refused
// as a whole, so an operator's mistake shows on the first compile of any
// deployment rather than the day that entry is used.
func checkRegistry(l *diag.List, reg *schema.Registry) {
	ids := slices.Sorted(maps.Keys(reg.Deployments))
	// A root of one deployment may not reach another's daemon home or
	// PASEO_HOME either: the union of every deployment's never-grant list.
	all := append([]forbid(nil), systemForbidden...)
	for _, id := range ids {
		all = append(all, deploymentForbidden(reg.Deployments[id], reg.Supervisor)...)
	}
	for _, id := range ids {
		checkDeployment(l, id, reg.Deployments[id], all)
	}
	checkRootfs(l, reg, ids, all)
	checkDNS(l, reg.Network)
}

// checkRootfs keeps the image apart from what sandboxes may write and from
// what they may never see: the rootfs is every sandbox's read-only root, so
// a rootfs that is a workspace (or holds one) would let one agent plant the
// next agent's tools, and one that holds a daemon home would show it to all.
func checkRootfs(l *diag.List, reg *schema.Registry, ids []string, all []forbid) {
	const fact = "registry.image.rootfs"
	rootfs := reg.Image.Rootfs
	if code, msg := pathform.Check(rootfs); code != "" {
		l.Addf(diag.Registry, fact, "%s", msg)
		return
	}
	if rootfs == "/" {
		l.Addf(diag.Registry, fact, "the image rootfs may not be the host root")
		return
	}
	// The supervisor's state dir is the documented home of unpacked
	// images (/var/lib/paseo-sandbox/rootfs), so only a rootfs that is or
	// contains supervisor state is refused, not one beneath it.
	list := append([]forbid(nil), systemForbidden...)
	for _, id := range ids {
		list = append(list, deploymentForbidden(reg.Deployments[id], schema.Supervisor{})...)
	}
	if why := forbiddenReason(rootfs, list); why != "" {
		l.Addf(diag.Registry, fact, "every sandbox sees the image rootfs, so it may not be or hold a path that is never granted: %s", why)
		return
	}
	for _, p := range []string{reg.Supervisor.Socket, reg.Supervisor.RunscRoot, reg.Supervisor.StateDir} {
		if p != "" && pathform.Beneath(rootfs, p) {
			l.Addf(diag.Registry, fact, "the image rootfs contains supervisor or runsc state (%s)", p)
			return
		}
	}
	for _, id := range ids {
		dep := reg.Deployments[id]
		for _, r := range deploymentHostPaths(dep) {
			if code, _ := pathform.Check(r.path); code != "" || forbiddenReason(r.path, all) != "" {
				continue // refused on its own; comparing would only repeat it
			}
			switch {
			case pathform.Beneath(r.path, rootfs):
				l.Addf(diag.Registry, fact, "the image rootfs lies inside %s of deployment %s (%s)", r.what, id, r.path)
				return
			case pathform.Beneath(rootfs, r.path):
				l.Addf(diag.Registry, fact, "the image rootfs contains %s of deployment %s (%s)", r.what, id, r.path)
				return
			}
		}
	}
}

type hostPath struct{ what, path string }

// deploymentHostPaths are the host paths a deployment's sandboxes may be
// granted: its roots and, for docker, its mapping targets.
func deploymentHostPaths(dep schema.Deployment) []hostPath {
	var out []hostPath
	for _, r := range dep.Roots.Workspace {
		out = append(out, hostPath{"a workspace root", r})
	}
	for _, r := range dep.Roots.State {
		out = append(out, hostPath{"a state root", r})
	}
	for _, r := range dep.Roots.Launch {
		out = append(out, hostPath{"a launch root", r})
	}
	for _, m := range dep.Mappings {
		out = append(out, hostPath{"a mapping's host side", m.Host})
	}
	return out
}

// checkDNS checks the DNS mode against the resolver and the resolver as an
// egress destination.
func checkDNS(l *diag.List, n schema.Network) {
	switch {
	case n.DNS == "resolver" && n.Resolver == "":
		l.Addf(diag.Registry, "registry.network.resolver", "dns mode resolver needs a resolver address")
	case n.DNS == "pinned" && n.Resolver != "":
		l.Addf(diag.Registry, "registry.network.resolver", "dns mode pinned takes no resolver; names are pinned in /etc/hosts")
	}
	checkResolver(l, n.Resolver)
}

// checkDeployment validates the operator's entry for one deployment
// against the never-grant list of the whole registry.
func checkDeployment(l *diag.List, id string, dep schema.Deployment, all []forbid) {
	base := "registry.deployments." + id
	checkUser(l, base, dep.User)
	for _, kind := range []string{"workspace", "state", "launch"} {
		roots := map[string][]string{"workspace": dep.Roots.Workspace, "state": dep.Roots.State, "launch": dep.Roots.Launch}[kind]
		for i, r := range roots {
			fact := fmt.Sprintf("%s.roots.%s[%d]", base, kind, i)
			if code, msg := pathform.Check(r); code != "" {
				l.Addf(diag.Registry, fact, "root %s", msg)
				continue
			}
			if why := forbiddenReason(r, all); why != "" {
				l.Addf(diag.Registry, fact, "root can never be granted: %s", why)
			}
		}
	}
	switch dep.Topology {
	case "docker":
		if len(dep.Mappings) == 0 {
			l.Addf(diag.Registry, base+".mappings", "a docker deployment needs mappings from container paths to host paths")
		}
	case "host":
		if len(dep.Mappings) > 0 {
			l.Addf(diag.Registry, base+".mappings", "mappings are for docker deployments; host facts already speak in host paths")
		}
	}
	seen := map[string]bool{}
	for i, m := range dep.Mappings {
		fact := fmt.Sprintf("%s.mappings[%d]", base, i)
		bad := false
		for _, p := range []string{m.Container, m.Host} {
			if code, msg := pathform.Check(p); code != "" {
				l.Addf(diag.Registry, fact, "mapping %s", msg)
				bad = true
			}
		}
		if !bad {
			// A mapping's host side is what container paths turn into;
			// "/" or a forbidden path there would map facts onto the host
			// root or the daemon's secrets.
			if why := forbiddenReason(m.Host, all); why != "" {
				l.Addf(diag.Registry, fact+".host", "a mapping's host side can never be granted: %s", why)
			}
		}
		if seen[m.Container] {
			l.Addf(diag.Registry, fact, "container path %s is mapped twice", m.Container)
		}
		seen[m.Container] = true
	}
}
