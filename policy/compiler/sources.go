package compiler

import (
	"errors"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/internal/pathsafe"
	"paseo.dev/paseo-policy/policy/schema"
)

// source is one fact path turned into a bind source: where it appears in
// the sandbox (the path the daemon uses) and the host object behind it.
type source struct {
	fact string
	dest string
	host string
	// root is the registered root host lies beneath: the launcher opens
	// the source beneath it again at launch (pins.json).
	root string
	id   pathsafe.Identity
}

// sources checks fact paths against one deployment's roots, mappings and
// never-grant list, and resolves them on the host. Problems are collected.
type sources struct {
	diags  *diag.List
	depID  string
	dep    schema.Deployment
	forbid []forbid
	res    pathsafe.Resolver
	// resolved holds every source resolved, by host path, for pins.json.
	resolved map[string]source
}

// lexical reports a malformed fact path; ok is false when it was refused.
func (s *sources) lexical(fact, p string) bool {
	if code, msg := pathform.Check(p); code != "" {
		s.diags.Addf(code, fact, "%s", msg)
		return false
	}
	return true
}

// hostPath maps a fact path to the host: itself for host topology, through
// the longest matching mapping for docker.
func (s *sources) hostPath(fact, p string) (string, bool) {
	if s.dep.Topology != "docker" {
		return p, true
	}
	best := -1
	for i, m := range s.dep.Mappings {
		if pathform.Beneath(m.Container, p) && (best < 0 || len(m.Container) > len(s.dep.Mappings[best].Container)) {
			best = i
		}
	}
	if best < 0 {
		s.diags.Addf(diag.PathUnmapped, fact, "docker deployment %s maps no container path above this one; facts speak in container paths and host paths are refused", s.depID)
		return "", false
	}
	m := s.dep.Mappings[best]
	rel := pathform.Rel(m.Container, p)
	if rel == "." {
		return m.Host, true
	}
	if m.Host == "/" {
		return "/" + rel, true
	}
	return m.Host + "/" + rel, true
}

// check runs every lexical and policy check on a fact path and returns the
// host path, without touching the filesystem.
func (s *sources) check(fact, p, rootKind string, roots []string) (string, bool) {
	if !s.lexical(fact, p) {
		return "", false
	}
	if why := forbiddenReason(p, s.forbid); why != "" {
		s.diags.Addf(diag.PathForbidden, fact, "never granted: %s", why)
		return "", false
	}
	host, ok := s.hostPath(fact, p)
	if !ok {
		return "", false
	}
	if host != p {
		if why := forbiddenReason(host, s.forbid); why != "" {
			s.diags.Addf(diag.PathForbidden, fact, "maps to a host path that is never granted: %s", why)
			return "", false
		}
	}
	if rootOf(roots, host) == "" {
		s.diags.Addf(diag.PathOutsideRoot, fact, "not beneath any %s root registered for deployment %s", rootKind, s.depID)
		return "", false
	}
	return host, true
}

// resolve checks a fact path and opens it beneath its root, requiring kind.
func (s *sources) resolve(fact, p, rootKind string, roots []string, kind pathsafe.Kind) (source, bool) {
	host, ok := s.check(fact, p, rootKind, roots)
	if !ok {
		return source{}, false
	}
	id, err := s.res.Resolve(rootOf(roots, host), host)
	if err != nil {
		s.addResolveError(fact, err)
		return source{}, false
	}
	if id.Kind != kind {
		s.diags.Addf(diag.PathType, fact, "is a %s; a %s is required", id.Kind, kind)
		return source{}, false
	}
	src := source{fact: fact, dest: p, host: host, root: rootOf(roots, host), id: id}
	if s.resolved == nil {
		s.resolved = map[string]source{}
	}
	s.resolved[host] = src
	return src, true
}

// exists reports whether a path names an existing object. A path that fails
// its checks is reported as not existing: the failure is already reported
// for the fact that named its parent.
func (s *sources) exists(p, rootKind string, roots []string) bool {
	host, ok := s.hostPathQuiet(p)
	if !ok || rootOf(roots, host) == "" {
		return false
	}
	_, err := s.res.Resolve(rootOf(roots, host), host)
	var pe *pathsafe.Error
	return !(errors.As(err, &pe) && pe.Code == diag.PathMissing)
}

// hostPathQuiet maps like hostPath but reports nothing.
func (s *sources) hostPathQuiet(p string) (string, bool) {
	saved := *s.diags
	host, ok := s.hostPath("", p)
	*s.diags = saved
	return host, ok
}

func (s *sources) addResolveError(fact string, err error) {
	var pe *pathsafe.Error
	if errors.As(err, &pe) {
		s.diags.Addf(pe.Code, fact, "%s", pe.Msg)
		return
	}
	s.diags.Addf(diag.PathMissing, fact, "%v", err)
}

// rootOf returns the longest root that contains p, or "".
func rootOf(roots []string, p string) string {
	best := ""
	for _, r := range roots {
		if pathform.Beneath(r, p) && len(r) > len(best) {
			best = r
		}
	}
	return best
}
