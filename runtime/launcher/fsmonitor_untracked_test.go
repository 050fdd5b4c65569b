package launcher

import "testing"

// A store config that could change the sandbox's untracked scan in a way
// the cache does not record keeps the cache out; one that cannot does
// not.
func TestUntrackedScanConfig(t *testing.T) {
	for cfg, want := range map[string]string{
		"": "",
		"[core]\n\trepositoryformatversion = 0\n":     "",
		"[core]\n\texcludesFile = ~/x\n":              "",
		"[status]\n\tshowUntrackedFiles = all\n":      "",
		"[core]\n\tignoreCase = true\n":               "ignorecase",
		"[CORE]\n\tIGNORECASE\n":                      "ignorecase",
		"[include]\n\tpath = other\n":                 "include",
		"[includeIf \"gitdir:/x\"]\n\tpath = other\n": "include",
		"[extensions]\n\tworktreeConfig = true\n":     "worktreeconfig",
	} {
		if got := scanConfig([]byte(cfg)); got != want {
			t.Errorf("%q: %q, want %q", cfg, got, want)
		}
	}
}

// A store config that could change the bytes the sandbox's git hashes
// keeps the refreshed entries out; one that cannot does not.
func TestRefreshConvertConfig(t *testing.T) {
	for cfg, want := range map[string]string{
		"": "",
		"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n": "",
		"[core]\n\tautocrlf = true\n":                                "autocrlf",
		"[core]\n\teol = crlf\n":                                     "eol",
		"[filter \"lfs\"]\n\tclean = git-lfs clean -- %f\n":          "filter",
		"[core]\n\tattributesFile = ~/a\n":                           "attributesfile",
	} {
		if got := convertConfig([]byte(cfg)); got != want {
			t.Errorf("%q: %q, want %q", cfg, got, want)
		}
	}
}
