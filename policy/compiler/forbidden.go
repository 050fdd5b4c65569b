package compiler

import (
	"path"
	"strings"

	"paseo.dev/paseo-policy/internal/pathform"
	"paseo.dev/paseo-policy/policy/schema"
)

// forbid is one source the compiler never grants, whatever the roots say.
type forbid struct {
	path    string
	beneath bool // also refuse everything below path
	why     string
}

// systemForbidden are host paths no sandbox may receive, nor any path that
// contains them.
var systemForbidden = []forbid{
	{"/", false, "the host root"},
	{"/etc", true, "host configuration"},
	{"/proc", true, "the host's process filesystem"},
	{"/sys", true, "the host's sysfs"},
	{"/dev", true, "host devices"},
	{"/run", true, "host runtime state and sockets"},
	{"/var/run", true, "host runtime state and sockets"},
	{"/boot", true, "the host's kernel and boot loader"},
	{"/root", true, "root's home"},
	{"/home/paseo", true, "the official Paseo container's home volume (daemon identity, config, logs, every credential)"},
}

// componentForbidden are directory names that hold credentials wherever
// they appear.
var componentForbidden = []string{".ssh", ".aws", ".docker", ".gnupg", ".kube", ".azure"}

// baseForbidden are socket names that grant control of a container engine.
var baseForbidden = []string{"docker.sock", "containerd.sock"}

// forbiddenFor adds the deployment's own never-grant paths: the daemon's
// home and PASEO_HOME, the supervisor socket and runsc and supervisor state.
func forbiddenFor(dep schema.Deployment, sup schema.Supervisor) []forbid {
	return append(append([]forbid(nil), systemForbidden...), deploymentForbidden(dep, sup)...)
}

// deploymentForbidden is forbiddenFor without the system paths.
func deploymentForbidden(dep schema.Deployment, sup schema.Supervisor) []forbid {
	var list []forbid
	if dep.Daemon != nil {
		if dep.Daemon.Home != "" {
			// Below home is where workspaces often live; home itself and
			// its ancestors are refused.
			list = append(list, forbid{dep.Daemon.Home, false, "the daemon user's home"})
		}
		if dep.Daemon.PaseoHome != "" {
			list = append(list, forbid{dep.Daemon.PaseoHome, true, "PASEO_HOME (daemon identity, config and credentials)"})
		}
	}
	for _, p := range []string{sup.Socket, sup.RunscRoot, sup.StateDir} {
		if p != "" {
			list = append(list, forbid{p, true, "supervisor or runsc state"})
		}
	}
	return list
}

// forbiddenReason returns why p may never be granted, or "".
func forbiddenReason(p string, list []forbid) string {
	for _, f := range list {
		switch {
		case p == f.path:
			return f.why + " (" + f.path + ")"
		case f.beneath && pathform.Beneath(f.path, p):
			return "lies inside " + f.why + " (" + f.path + ")"
		case p != "/" && pathform.Beneath(p, f.path), p == "/":
			return "contains " + f.why + " (" + f.path + ")"
		}
	}
	parts := strings.Split(p, "/")
	for i, c := range parts {
		for _, bad := range componentForbidden {
			if c == bad {
				return "component " + c + " holds credentials"
			}
		}
		if c == ".config" && i+1 < len(parts) && parts[i+1] == "gcloud" {
			return "component .config/gcloud holds credentials"
		}
	}
	base := path.Base(p)
	for _, bad := range baseForbidden {
		if base == bad {
			return base + " controls a container engine"
		}
	}
	return ""
}
