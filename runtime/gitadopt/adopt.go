// Package gitadopt is issue 19's reviewed host step: after an agent's turn
// it sets a worktree's host index to the tree of its HEAD commit, and only
// when that tree holds exactly the gitlinks the index already has.
//
// A sandbox's commits reach the repository's objects and refs (through
// runtime/gitimport since issue 30), but never the host index: the index
// is the one file that tells host git where to recurse (a gitlink's
// <path>/.git, whose config would run), so the host keeps the old tree
// staged until this step adopts the new one. Everything
// it reads was written by the agent (refs, objects, the worktree), so it
// runs git with nothing that can run a program, reads HEAD once and works
// from that commit id, and checks with git's own listings, before and after.
package gitadopt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"paseo.dev/paseo-policy/diag"
)

// DefaultMaxEntries bounds each listing (the index, HEAD's tree): a tree
// of shared subtrees lists exponentially many paths, and the agent writes
// trees. Large monorepos hold a few hundred thousand files.
const DefaultMaxEntries = 2 << 20

// Options name the worktree and the daemon user's git.
type Options struct {
	// Worktree is the absolute, clean path of the worktree's top level.
	Worktree string
	// GitDir, when set, is the gitdir the worktree's .git must lead to
	// (the facts' workspace.git.gitdir); adoption writes its index.
	GitDir string
	// Home is HOME for git, the daemon user's: its ~/.gitconfig is read.
	Home string
	// MaxEntries bounds each listing; 0 means DefaultMaxEntries.
	MaxEntries int

	// readTreeOf, when set, is the commit read-tree reads instead of
	// HEAD's: tests use it to stand for a git whose read-tree disagrees
	// with its own listing.
	readTreeOf string
}

// Result is what an adoption did.
type Result struct {
	Commit   string `json:"commit"`   // HEAD's commit, as resolved once
	Entries  int    `json:"entries"`  // entries of its tree, now the index's
	Gitlinks int    `json:"gitlinks"` // gitlinks, the same before and after
	Changed  bool   `json:"changed"`  // false: the index already held the tree
}

// maxNamed bounds how many differing gitlinks a refusal names one by one.
const maxNamed = 20

// Adopt sets the worktree's index to HEAD's tree, or refuses with a
// diag.List (PP-GIT-ADOPT-*) and changes nothing. Other errors are git
// not running or failing where the agent has no say; they change nothing
// either, except a failure to put the old index back, which says so.
func Adopt(ctx context.Context, o Options) (Result, error) {
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	var refuse diag.List
	if !cleanAbs(o.Worktree) || (o.GitDir != "" && !cleanAbs(o.GitDir)) {
		refuse.Addf(diag.GitAdoptRepo, "worktree", "the worktree %q and gitdir %q must be absolute, clean paths without control characters", o.Worktree, o.GitDir)
		return Result{}, refuse
	}
	git := newGitRunner(o.Worktree, o.Home)

	repo, err := findRepo(ctx, git, o)
	if err != nil {
		return Result{}, err
	}
	commit, err := resolveHead(ctx, git, repo.hexLen)
	if err != nil {
		return Result{}, err
	}

	index := newListing(repo.hexLen, o.MaxEntries)
	if err := git.stream(ctx, index.indexEntry, "ls-files", "-s", "-z"); err != nil {
		if errors.Is(err, errTooMany) {
			return Result{}, fmt.Errorf("the index has more than %d entries: raise the bound", o.MaxEntries)
		}
		return Result{}, err
	}
	tree := newListing(repo.hexLen, o.MaxEntries)
	switch err := git.stream(ctx, tree.treeEntry, "ls-tree", "-r", "-z", "--full-tree", commit); {
	case errors.Is(err, errTooMany):
		refuse.Addf(diag.GitAdoptTree, "HEAD", "commit %s's tree has more than %d entries", commit, o.MaxEntries)
		return Result{}, refuse
	case exitCode(err) > 0:
		refuse.Addf(diag.GitAdoptTree, "HEAD", "git cannot list commit %s's tree: %v", commit, err)
		return Result{}, refuse
	case err != nil:
		return Result{}, err
	}

	if index.unmerged > 0 {
		refuse.Addf(diag.GitAdoptUnmerged, "index", "the index has %d unmerged entries (a merge, rebase or cherry-pick in progress); a person resolves them", index.unmerged)
	}
	if index.disorder != "" {
		return Result{}, fmt.Errorf("%w: ls-files listed %q out of order", errFormat, index.disorder)
	}
	if tree.disorder != "" {
		refuse.Addf(diag.GitAdoptTree, "HEAD", "commit %s's tree lists %q twice or out of order: not a tree git writes", commit, tree.disorder)
	}
	changes := gitlinkChanges(index.gitlinks, tree.gitlinks)
	for i, c := range changes {
		if i == maxNamed {
			refuse.Addf(diag.GitAdoptGitlinks, "HEAD", "and %d more gitlinks differ", len(changes)-maxNamed)
			break
		}
		refuse.Addf(diag.GitAdoptGitlinks, "HEAD", "%s", describe(commit, c))
	}
	if len(refuse) > 0 {
		return Result{}, refuse
	}

	res := Result{Commit: commit, Entries: tree.entries, Gitlinks: len(tree.gitlinks)}
	if index.digest() == tree.digest() {
		return res, nil
	}
	if err := writeIndex(ctx, git, repo.gitDir, commit, tree, o); err != nil {
		return Result{}, err
	}
	res.Changed = true
	return res, nil
}

// writeIndex runs read-tree and holds its result to the tree as checked;
// when they differ, the old index's bytes go back.
func writeIndex(ctx context.Context, git gitRunner, gitDir, commit string, tree *listing, o Options) error {
	path := filepath.Join(gitDir, "index")
	saved, err := os.ReadFile(path)
	existed := err == nil
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// Another git writing the index holds index.lock; read-tree would fail
	// on it, and that is not the tree's fault.
	if _, err := os.Lstat(path + ".lock"); err == nil {
		return fmt.Errorf("%s.lock exists: another git is writing the index (or one died and left it); nothing changed", path)
	}
	target := commit
	if o.readTreeOf != "" {
		target = o.readTreeOf
	}
	// Plain read-tree: the index becomes the tree, the worktree is not
	// looked at, so unstaged changes stay unstaged changes. Not -m, -i or
	// --reset: they keep the stat data of unchanged entries, and writing
	// an index with a racily clean entry reads that file through its clean
	// filter (a program .gitattributes, the agent's, can select). Fresh
	// entries have no stat data, so nothing is read; the cost is that the
	// next host status hashes the files once.
	_, err = git.output(ctx, "read-tree", "--no-recurse-submodules", target)
	if exitCode(err) > 0 {
		// Git's own path checks (a .git entry, an empty component) refuse
		// what ls-tree listed; the index is left as it was.
		var refuse diag.List
		refuse.Addf(diag.GitAdoptTree, "HEAD", "git read-tree did not take commit %s's tree: %v", commit, err)
		return refuse
	}
	if err != nil {
		return err
	}
	// Decide on what host git will read: the index, through git's reader.
	after := newListing(tree.hexLen, o.MaxEntries)
	aerr := git.stream(ctx, after.indexEntry, "ls-files", "-s", "-z")
	if aerr == nil && after.unmerged == 0 && after.digest() == tree.digest() {
		return nil
	}
	why := fmt.Sprintf("the index read back is not commit %s's tree", commit)
	if aerr != nil {
		why = fmt.Sprintf("reading the index back failed (%v)", aerr)
	}
	if rerr := restoreIndex(path, saved, existed); rerr != nil {
		return fmt.Errorf("%s, and putting the old index back failed: %w; restore %s by hand", why, rerr, path)
	}
	if aerr != nil {
		return fmt.Errorf("%s; the old index is put back", why)
	}
	var refuse diag.List
	refuse.Addf(diag.GitAdoptTree, "HEAD", "read-tree made an index other than commit %s's tree as checked; the old index is put back", commit)
	return refuse
}

// restoreIndex puts saved back as the index, under git's own lock
// protocol (index.lock created exclusively, then renamed over the index).
func restoreIndex(path string, saved []byte, existed bool) error {
	lock := path + ".lock"
	f, err := os.OpenFile(lock, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
	if err != nil {
		return err
	}
	if !existed {
		cerr := f.Close()
		return errors.Join(cerr, os.Remove(path), os.Remove(lock))
	}
	_, werr := f.Write(saved)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return errors.Join(err, os.Remove(lock))
	}
	return os.Rename(lock, path)
}

func describe(commit string, c change) string {
	switch {
	case c.Index == "":
		return fmt.Sprintf("commit %s's tree adds a gitlink at %q (%s) that the index does not have", commit, c.Path, c.Tree)
	case c.Tree == "":
		return fmt.Sprintf("commit %s's tree drops the index's gitlink at %q (%s)", commit, c.Path, c.Index)
	}
	return fmt.Sprintf("commit %s's tree moves the gitlink at %q from %s to %s", commit, c.Path, c.Index, c.Tree)
}

// repo is what git says about the worktree, checked against Options.
type repo struct {
	hexLen int
	gitDir string
}

func findRepo(ctx context.Context, git gitRunner, o Options) (repo, error) {
	var refuse diag.List
	out, err := git.output(ctx, "rev-parse", "--show-object-format", "--show-toplevel", "--absolute-git-dir")
	if exitCode(err) > 0 {
		refuse.Addf(diag.GitAdoptRepo, "worktree", "git does not take %q for a worktree: %v", o.Worktree, err)
		return repo{}, refuse
	}
	if err != nil {
		return repo{}, err
	}
	format, rest, _ := strings.Cut(out, "\n")
	var r repo
	switch format {
	case "sha1":
		r.hexLen = 40
	case "sha256":
		r.hexLen = 64
	default:
		return repo{}, fmt.Errorf("%w: rev-parse --show-object-format said %q", errFormat, format)
	}
	gitDir, ok := strings.CutPrefix(rest, o.Worktree+"\n")
	if !ok {
		refuse.Addf(diag.GitAdoptRepo, "worktree", "%q is not the top level of its worktree: git says %q", o.Worktree, rest)
		return repo{}, refuse
	}
	r.gitDir = strings.TrimSuffix(gitDir, "\n")
	if o.GitDir != "" && r.gitDir != o.GitDir {
		refuse.Addf(diag.GitAdoptRepo, "worktree", "the worktree's .git leads to %q, not to %q", r.gitDir, o.GitDir)
		return repo{}, refuse
	}
	// A promisor remote makes git fetch any object it lacks, so an agent's
	// commit naming missing objects would have the host fetch (and run the
	// transport) on its behalf; GIT_NO_LAZY_FETCH covers git 2.44 and later.
	promisor, err := git.output(ctx, "config", "--get-regexp", `^(extensions\.partialclone|remote\..*\.promisor)$`)
	switch code := exitCode(err); {
	case err == nil:
		refuse.Addf(diag.GitAdoptRepo, "worktree", "the repository has a promisor remote (%q): git would fetch whatever object a commit names and the store lacks", strings.TrimSpace(promisor))
		return repo{}, refuse
	case code != 1: // 1: no such key
		return repo{}, err
	}
	return r, nil
}

// resolveHead reads HEAD once and returns the commit id every later step
// uses, so a ref moved meanwhile changes nothing that was checked.
func resolveHead(ctx context.Context, git gitRunner, hexLen int) (string, error) {
	var refuse diag.List
	out, err := git.output(ctx, "rev-parse", "--verify", "-q", "HEAD")
	if exitCode(err) > 0 {
		refuse.Addf(diag.GitAdoptHead, "HEAD", "HEAD does not resolve to an object (an unborn branch, or a ref naming nothing)")
		return "", refuse
	}
	if err != nil {
		return "", err
	}
	id, ok := strings.CutSuffix(out, "\n")
	if !ok || !isHex(id, hexLen) {
		return "", fmt.Errorf("%w: rev-parse --verify HEAD said %q", errFormat, out)
	}
	// An object id names its content: its type cannot change after this.
	typ, err := git.output(ctx, "cat-file", "-t", id)
	if exitCode(err) > 0 {
		refuse.Addf(diag.GitAdoptHead, "HEAD", "HEAD names %s, which the object store does not have", id)
		return "", refuse
	}
	if err != nil {
		return "", err
	}
	if typ != "commit\n" {
		refuse.Addf(diag.GitAdoptHead, "HEAD", "HEAD names %s, a %q, not a commit", id, strings.TrimSpace(typ))
		return "", refuse
	}
	return id, nil
}

// cleanAbs reports whether p is absolute, clean and free of control
// characters (git prints paths one a line).
func cleanAbs(p string) bool {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return false
	}
	return !strings.ContainsFunc(p, unicode.IsControl)
}
