package nativesearch

import (
	"regexp"
)

// fd's closed list is bundle.SearchFdOptions (Lists[Fd]): what is on it
// and why the rest is not is written there, beside the client that
// forwards it. These are the checks of its values' kinds, and of find's.

func match(re string) func(string) bool { return regexp.MustCompile(re).MatchString }

var (
	fdType   = match(`^(f|file|d|directory|l|symlink|x|executable|e|empty|s|socket|p|pipe)$`)
	fdSize   = match(`^[+-]?[0-9]{1,12}(b|k|m|g|t|ki|mi|gi|ti|B|K|M|G|T|Ki|Mi|Gi|Ti)?$`)
	timeSpec = match(`^[0-9A-Za-z :.+-]{1,64}$`) // a duration (10min, 2weeks) or a date; fd parses it
	findType = match(`^[bcdpflsD](,[bcdpflsD])*$`)
	findSize = match(`^[+-]?[0-9]{1,12}[bcwkMG]?$`)
	signed   = match(`^[+-]?[0-9]{1,9}$`)
)
