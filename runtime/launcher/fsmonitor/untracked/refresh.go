package untracked

// The entries the jailed git refreshed (docs/spec.md, "The first status
// after a start: the entries the image's git refreshed").
//
// The jailed git runs with core.fsmonitor off, so it ignores the vouched
// index's FSMN bits and lstats every entry; where the stat data it reads
// is not the entry's (under the sandbox's settings: mtime seconds or
// size), it opens the file, hashes its bytes as Git stores them and, if
// that is the entry's object, writes the entry back with the stat data it
// read (read-cache.c refresh_cache_ent, fill_stat_cache_info): only the
// stat data changes. That is the case of a later session after one that
// rewrote files with the same bytes (`git reset --hard`, an editor's
// save): the seed (host git's index) holds the old mtimes, the vouch
// cannot vouch for them, and the sandbox's git would hash each through
// the gofer. Splice takes those stat data and clears the entries' FSMN
// bits, so the sandbox's first status does not touch them.
//
// An entry is taken only when all of these hold:
//   - the vouch did not vouch for it (its FSMN bit is set) and it is a
//     stage-0 regular file (100644 or 100755) with no assume-valid,
//     skip-worktree or intent-to-add flag;
//   - git's entry has the vouched entry's name, stage, mode, object name
//     and flags (anything else is not a refresh: then no entry is taken),
//     and stat data that differ from the vouched entry's;
//   - its size is not 0, or its object is the empty blob and the vouched
//     entry's size was 0 too: a size set to 0 is how Git smudges a racily
//     clean entry whose content it found changed (ce_smudge_racily_clean_entry),
//     the one change to stat data Git writes without a match;
//   - its mtime is in a whole second before racy (Racy: the token's time
//     and the written index's, whichever is earlier; Git's
//     is_racy_timestamp in whole seconds).
//
// Why a taken entry is never wrong. Git hashed the file's bytes after the
// token (the watches in place), found the entry's object, and recorded the
// stat data it read before hashing. A change before the token is in those
// bytes (and would have failed the match). A change after the token, even
// during git's own read, is named by the monitor's answer to the sandbox's
// first query (the FSMN's token), which clears the bit, so the sandbox's
// git lstats the file and compares with what was taken: under
// checkStat=minimal its mtime seconds and size. The change is stamped at
// or after the token's time, in a later second than the recorded mtime
// (the racy rule), so the seconds differ and Git hashes the file again.
// Without the token's part of the rule, an entry touched in the token's
// second and edited after it, the same size in the same second, would
// compare equal (TestRefreshedInTheTokensSecondIsNotTaken's control).
// The other stat fields (ctime, inode, device, owner) are the jail's view
// of the same host inodes; the sandbox's git does not compare them
// (checkStat=minimal, trustctime=false), and a git that did would hash
// again, never trust.

import (
	"errors"
	"fmt"
	"time"

	"paseo.dev/paseo-policy/internal/gitindex"
)

// refresh is the vouched index's bytes up to its checksum with the
// refreshed entries' stat data and the rewritten FSMN.
type refresh struct {
	body           []byte
	taken, skipped int
}

// refreshed takes built's refreshed entries into vouched's bytes (vx and
// bx being the two parsed, with the same names and stages in the same
// order). An error takes none.
func refreshed(vouched []byte, vx *gitindex.Index, built []byte, bx *gitindex.Index, racy time.Time) (*refresh, error) {
	if racy.IsZero() {
		return nil, errors.New("no racy time given")
	}
	racySec := racy.Unix()
	if racySec > 0xffffffff || racySec <= 0 {
		return nil, errors.New("the racy time is past what an index records")
	}
	fm, err := gitindex.ReadFSMonitor(vouched, vx)
	if err != nil {
		return nil, fmt.Errorf("the vouched index: %w", err)
	}
	empty := vx.EmptyBlob()
	dirty := append([]bool(nil), fm.Dirty...)
	take := make([]bool, len(vx.Entries))
	r := &refresh{}
	for i, v := range vx.Entries {
		b := bx.Entries[i]
		if b.Mode != v.Mode || b.OID != v.OID || b.AssumeValid != v.AssumeValid || b.SkipWorktree != v.SkipWorktree || b.IntentToAdd != v.IntentToAdd {
			return nil, fmt.Errorf("git's entry %d is not the vouched one but for its stat data", i)
		}
		if !dirty[i] || b.Stat == v.Stat || v.Stage != 0 || (v.Mode != 0o100644 && v.Mode != 0o100755) ||
			v.AssumeValid || v.SkipWorktree || v.IntentToAdd {
			continue
		}
		smudged := (b.Stat.Size == 0) != (v.OID == empty) || b.Stat.Size == 0 && v.Stat.Size != 0
		if smudged || int64(b.Stat.MtimeSec) >= racySec {
			r.skipped++
			continue
		}
		take[i], dirty[i] = true, false
		r.taken++
	}
	body := make([]byte, 0, len(vouched)+64)
	body = append(body, vouched[:vx.EntriesEnd]...)
	for i, v := range vx.Entries {
		if take[i] {
			// The mode is in these bytes too, and the same.
			o := bx.Entries[i].Off
			copy(body[v.Off:v.Off+gitindex.StatBytes], built[o:o+gitindex.StatBytes])
		}
	}
	for _, x := range vx.Extensions {
		if x.Sig == "FSMN" {
			body = gitindex.AppendFSMonitor(body, fm.Token, dirty)
		} else {
			body = append(body, vouched[x.Off:x.Off+8+x.Size]...)
		}
	}
	r.body = body
	return r, nil
}
