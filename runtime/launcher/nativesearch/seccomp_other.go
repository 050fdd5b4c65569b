//go:build !amd64

package nativesearch

import "errors"

// seccomp refuses: the filter (seccomp_amd64.go) names amd64's system
// calls, and Probe refuses the option on any other architecture before a
// search is asked; this keeps a jail from ever running unfiltered.
func seccomp() error {
	return errors.New("nativesearch: the search jail's seccomp filter is built for amd64 only")
}
