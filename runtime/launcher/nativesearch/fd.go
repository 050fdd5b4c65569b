package nativesearch

import (
	"regexp"
)

// fd's closed list (the image's fd 8.6). Nothing on it runs a program
// (-x/--exec, -X/--exec-batch, -l/--list-details, which runs ls),
// follows a link (-L/--follow), reads a file the request does not name
// (--ignore-file), looks up users (--owner: the jail has no /etc),
// changes its cwd (--base-directory), crosses or stops at mounts
// differently from the sandbox (--one-file-system: the jail's workspace
// is one mount) or sets its threads (the server does). Pi's find tool
// sends `--color=never --hidden [--no-require-git] --glob --max-results N
// [--full-path] [--ignore-case] -- PATTERN PATH`.

// FdFlags are fd's options without a value that a request may carry.
var FdFlags = map[string]bool{
	"hidden": true, "no-ignore": true, "no-ignore-vcs": true, "no-ignore-parent": true, "no-require-git": true,
	"no-global-ignore-file": true, "unrestricted": true,
	"case-sensitive": true, "ignore-case": true, "glob": true, "regex": true, "fixed-strings": true,
	"full-path": true, "absolute-path": true, "print0": true, "prune": true, "quiet": true,
	"show-errors": true, "strip-cwd-prefix": true, "color=never": true,
}

// FdValued are fd's options with a value, each with its value's check.
var FdValued = map[string]func(string) bool{
	"extension": anyText, "exclude": anyText,
	"type":      fdType,
	"max-depth": number, "min-depth": number, "exact-depth": number, "max-results": number,
	"size":           match(`^[+-]?[0-9]{1,12}(b|k|m|g|t|ki|mi|gi|ti|B|K|M|G|T|Ki|Mi|Gi|Ti)?$`),
	"changed-within": timeSpec, "changed-before": timeSpec,
	"search-path": anyText, // a path: checked as the request's paths are (OptionList.Paths)
}

func match(re string) func(string) bool { return regexp.MustCompile(re).MatchString }

var (
	fdType   = match(`^(f|file|d|directory|l|symlink|x|executable|e|empty|s|socket|p|pipe)$`)
	timeSpec = match(`^[0-9A-Za-z :.+-]{1,64}$`) // a duration (10min, 2weeks) or a date; fd parses it
)
