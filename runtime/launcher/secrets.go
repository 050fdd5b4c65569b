package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/internal/pathform"
)

// SecretSource returns the value of secret ref of one deployment. The
// deployment is part of the lookup: a ref means nothing outside the
// deployment whose facts name it, so deployment A's facts naming B's ref
// find nothing. The launcher wipes the returned bytes once they are in
// its private copy, so a source returns a fresh slice on every call.
type SecretSource func(deployment, ref string) ([]byte, error)

// deploymentID is policy/schema/facts.cue's #ID: what the manifest's deployment
// must look like before it names a directory.
var deploymentID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// ErrSecretUnknown means the deployment has no secret by that ref. Its
// message names the ref asked for and nothing else the directory holds.
var ErrSecretUnknown = errors.New("no such secret in this deployment")

// SecretsDir reads secret <ref> of deployment <d> from the file
// dir/<d>/<ref>. Each step is opened beneath the one before it with
// openat2 (no symlinks, no magic links, no ..) and checked on the
// descriptor: every directory root-owned and not writable by group or
// others, the secret a regular root-owned file with mode 0600 or stricter.
// Errors name the deployment and ref, never a value or another ref.
func SecretsDir(dir string) SecretSource {
	return func(deployment, ref string) ([]byte, error) {
		if !deploymentID.MatchString(deployment) || deployment == "." || deployment == ".." {
			return nil, fmt.Errorf("deployment %q is not a valid deployment id for the secrets dir", deployment)
		}
		if code, _ := pathform.Check("/" + ref); code != "" || ref == "" {
			return nil, fmt.Errorf("secret reference %q of deployment %s is not a clean relative name", ref, deployment)
		}
		top, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("secrets dir: %w", err)
		}
		defer unix.Close(top)
		if err := checkSecretsDirFD(top, "the secrets dir"); err != nil {
			return nil, err
		}
		fd, err := openSecret(top, deployment, ref)
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), "secret")
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, err
		}
		if st.Uid != 0 || st.Mode&0o077 != 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil, fmt.Errorf("secret %s of deployment %s must be a regular file owned by root with mode 0600 or stricter", ref, deployment)
		}
		var buf bytes.Buffer
		if _, err := buf.ReadFrom(f); err != nil {
			return nil, fmt.Errorf("secret %s of deployment %s: reading: %w", ref, deployment, err)
		}
		return bytes.TrimRight(buf.Bytes(), "\r\n"), nil
	}
}

// openSecret walks deployment/ref one component at a time from the
// secrets dir, checking each directory on its descriptor, and returns the
// secret opened read-only.
func openSecret(top int, deployment, ref string) (int, error) {
	parts := append([]string{deployment}, strings.Split(ref, "/")...)
	cur := top
	defer func() {
		if cur != top {
			unix.Close(cur)
		}
	}()
	for i, name := range parts {
		last := i == len(parts)-1
		flags := unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC
		if last {
			flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
		}
		fd, err := unix.Openat2(cur, name, &unix.OpenHow{Flags: uint64(flags),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		if err != nil {
			return -1, secretOpenError(deployment, ref, i, err)
		}
		if last {
			return fd, nil
		}
		what := "the directory of secret " + ref + " of deployment " + deployment
		if i == 0 {
			what = "the secrets dir of deployment " + deployment
		}
		if err := checkSecretsDirFD(fd, what); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if cur != top {
			unix.Close(cur)
		}
		cur = fd
	}
	return -1, fmt.Errorf("secret %s of deployment %s: empty reference", ref, deployment)
}

// secretOpenError says which step failed without listing the directory:
// a missing deployment dir or ref is ErrSecretUnknown; a symlink, an
// escape or a file where a directory belongs is refused as such.
func secretOpenError(deployment, ref string, step int, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT) && step == 0:
		return fmt.Errorf("secret %s: the secrets dir has no directory for deployment %s: %w", ref, deployment, ErrSecretUnknown)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("secret %s of deployment %s: %w", ref, deployment, ErrSecretUnknown)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("secret %s of deployment %s: a symlink on the way is refused", ref, deployment)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("secret %s of deployment %s: a path escaping the deployment dir is refused", ref, deployment)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("secret %s of deployment %s: a file where a directory belongs", ref, deployment)
	}
	return fmt.Errorf("secret %s of deployment %s: %w", ref, deployment, err)
}

// checkSecretsDirFD refuses a directory someone other than root could
// change: whoever can write it can put any file at any ref.
func checkSecretsDirFD(fd int, what string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("%s must be a directory owned by root and not writable by group or others", what)
	}
	return nil
}
