package launcher

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"golang.org/x/sys/unix"

	"paseo.dev/paseo-policy/bundle"
	"paseo.dev/paseo-policy/internal/pathform"
)

// SecretSource returns the value of a secret by reference.
type SecretSource func(ref string) ([]byte, error)

// SecretsDir reads secret <ref> from the file dir/<ref>. The file must be
// owned by root and unreadable by group and others, and is opened without
// following symlinks.
func SecretsDir(dir string) SecretSource {
	return func(ref string) ([]byte, error) {
		if code, _ := pathform.Check("/" + ref); code != "" {
			return nil, fmt.Errorf("secret reference is not a clean relative name")
		}
		dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("secrets dir: %w", err)
		}
		defer unix.Close(dfd)
		fd, err := unix.Openat2(dfd, ref, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", ref, err)
		}
		f := os.NewFile(uintptr(fd), filepath.Join(dir, ref))
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return nil, err
		}
		if st.Uid != 0 || st.Mode&0o077 != 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
			return nil, fmt.Errorf("secret %s must be a regular file owned by root with mode 0600 or stricter", ref)
		}
		data, err := readAll(f)
		if err != nil {
			return nil, err
		}
		return bytes.TrimRight(data, "\r\n"), nil
	}
}

func readAll(f *os.File) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(f)
	return buf.Bytes(), err
}

// placeholder matches the compiler's secret placeholder.
var placeholder = regexp.MustCompile(`@@paseo-secret:([a-z0-9][a-z0-9._/-]{0,127})@@`)

// SecretRefs lists, sorted and once each, the secret references the
// bundle's placeholders name: what a launch will ask its SecretSource for.
func SecretRefs(files bundle.Files) []string {
	var refs []string
	for _, name := range bundle.SecretFiles {
		for _, m := range placeholder.FindAllSubmatch(files[name], -1) {
			refs = append(refs, string(m[1]))
		}
	}
	slices.Sort(refs)
	return slices.Compact(refs)
}

// injectSecrets replaces every placeholder in config.json. A missing secret
// is an error: a sandbox never starts with a placeholder for a credential.
// Errors name the reference, never a value.
func injectSecrets(cfg []byte, secrets SecretSource) ([]byte, error) {
	var firstErr error
	out := placeholder.ReplaceAllFunc(cfg, func(m []byte) []byte {
		ref := string(placeholder.FindSubmatch(m)[1])
		if secrets == nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("bundle needs secret %s and no secret source was given", ref)
			}
			return m
		}
		v, err := secrets(ref)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			return m
		}
		if !validEnvValue(v) {
			if firstErr == nil {
				firstErr = fmt.Errorf("secret %s contains characters that cannot go in an environment variable", ref)
			}
			return m
		}
		return jsonEscape(v)
	})
	return out, firstErr
}

func validEnvValue(v []byte) bool {
	for _, c := range v {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return len(v) > 0
}

// jsonEscape escapes a value for a JSON string body.
func jsonEscape(v []byte) []byte {
	var b bytes.Buffer
	for _, c := range v {
		switch c {
		case '"', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.Bytes()
}
