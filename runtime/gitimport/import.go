// Package gitimport brings an agent's Git work from its private store into
// the shared repository (issue 30; docs/gitimport.md): the one host step
// that reads the store, which the sandbox wrote whole.
//
// It never runs git in the store, never opens it as a repository, and
// never follows a path in it. It reads the store's objects and refs by
// descriptor, as regular files, verifies loose objects by hash, copies
// them into a quarantine repository it creates (with its own config, the
// shared repository's objects as its alternate), indexes the store's packs
// itself, and has host git in the shared repository fetch the granted tips
// from the quarantine with fsck on, so every object is hashed again and no
// existing object is replaced. Then it moves the granted refs, and only
// those, in one compare-and-swap transaction. A refusal before the fetch
// changes nothing in the shared repository.
package gitimport

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"paseo.dev/paseo-policy/diag"
	"paseo.dev/paseo-policy/internal/hostgit"
	"paseo.dev/paseo-policy/internal/pathform"
)

// Options name the shared repository, the agent's store and the grant.
type Options struct {
	// Repo is the shared repository's Git dir: the common dir of the
	// agent's worktree (the facts' workspace.git.commondir, or gitdir
	// for a main worktree).
	Repo string
	// StateRoot is the registered state root the store lies beneath;
	// Store is the store (the facts' state.gitStore).
	StateRoot, Store string
	// Agent is the agent id: refs/heads/<Agent>/* and
	// refs/paseo/<Agent>/stash are its namespace.
	Agent string
	// Branch is the worktree's branch, a full ref name (refs/heads/...).
	Branch string
	// Base is Branch's value at launch, or after this agent's last
	// import, recorded where the agent cannot write; empty when the
	// branch did not exist. The import moves Branch only from Base.
	Base string
	// Home is HOME for git: the daemon user's (its ~/.gitconfig is read).
	Home string
	// WorkDir holds the quarantine while the import runs (default: the
	// system's temporary directory).
	WorkDir string
	// Cred, when set, is the user every git runs as (the caller is root);
	// the quarantine is made that user's.
	Cred   *Cred
	Limits Limits
}

// Limits bound what the import reads of the store.
type Limits struct {
	MaxFiles       int   // object files (loose and packs), and entries of one directory
	MaxObjectBytes int64 // one loose object file
	MaxPackBytes   int64 // one pack
	MaxRefs        int   // refs, loose and packed
	MaxRefBytes    int64 // packed-refs
}

// DefaultLimits fit an agent's busy session with room.
var DefaultLimits = Limits{MaxFiles: 1 << 20, MaxObjectBytes: 512 << 20, MaxPackBytes: 4 << 30, MaxRefs: 1 << 16, MaxRefBytes: 64 << 20}

// RefUpdate is one ref the import moved.
type RefUpdate struct {
	Ref string `json:"ref"`
	Old string `json:"old"` // empty: created
	New string `json:"new"`
}

// Result is what an import did.
type Result struct {
	Updated []RefUpdate `json:"updated"`
	// Ignored lists the store's refs outside the grant whose value
	// differs from the repository's (PP-GIT-IMPORT-REF): never written.
	// The store's copy of main goes stale whenever the host moves main,
	// so a difference there says nothing about the agent and does not
	// refuse the import.
	Ignored diag.List `json:"ignored,omitempty"`
	Loose   int       `json:"loose"` // loose objects copied and verified
	Packs   int       `json:"packs"` // packs indexed
	// Branch is the branch's value in the repository when the import
	// ended with the repository and the store agreeing on it (moved to
	// the store's value, or already there); empty otherwise. A caller
	// keeps it as the next Base.
	Branch string `json:"branch,omitempty"`
}

var agentID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// Import brings the granted refs of the store, and the objects they need,
// into the repository; or refuses with a diag.List (PP-GIT-IMPORT-*).
// Other errors are git or the filesystem failing where the agent has no
// say.
func Import(ctx context.Context, o Options) (Result, error) {
	if o.Limits == (Limits{}) {
		o.Limits = DefaultLimits
	}
	if err := o.check(); err != nil {
		return Result{}, err
	}
	git := newGitRunner(o.Home, o.Cred)
	format, err := git.run(ctx, o.Repo, nil, "rev-parse", "--show-object-format")
	if err != nil {
		return Result{}, refusef(diag.GitImportRepo, "repo", "%q is not a Git dir git can use: %v", o.Repo, err)
	}
	format = strings.TrimSpace(format)
	hexLen := map[string]int{"sha1": 40, "sha256": 64}[format]
	if hexLen == 0 {
		return Result{}, refusef(diag.GitImportRepo, "repo", "object format %q", format)
	}
	if o.Base != "" && !regexp.MustCompile(fmt.Sprintf(`^[0-9a-f]{%d}$`, hexLen)).MatchString(o.Base) {
		return Result{}, refusef(diag.GitImportRepo, "base", "the base must be a lowercase object id of %d hex digits", hexLen)
	}

	store, err := openStore(o.StateRoot, o.Store)
	if err != nil {
		return Result{}, err
	}
	defer store.close()
	refs, err := readRefs(store, hexLen, o.Limits)
	if err != nil {
		return Result{}, err
	}
	shared, err := sharedRefs(ctx, git, o.Repo, hexLen)
	if err != nil {
		return Result{}, err
	}
	// The whole store is listed even when no ref moves: a store with a
	// link where the import looks is refused either way, so its state is
	// said at every import, not at the first one that has work.
	objs, err := readObjects(store, hexLen, o.Limits)
	if err != nil {
		return Result{}, err
	}
	res, updates, err := o.plan(refs, shared)
	if err != nil || len(updates) == 0 {
		return res, err
	}

	q, err := os.MkdirTemp(o.WorkDir, "paseo-git-import-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(q)
	if o.Cred != nil {
		if err := os.Chown(q, int(o.Cred.UID), int(o.Cred.GID)); err != nil {
			return Result{}, err
		}
	}
	if err := quarantine(ctx, git, q, o.Repo, format, store, objs, hexLen, o.Limits); err != nil {
		return Result{}, err
	}
	res.Loose, res.Packs = len(objs.loose), len(objs.packs)
	var tips strings.Builder
	var fetch []string
	for i, u := range updates {
		fmt.Fprintf(&tips, "create refs/import/%d %s\n", i, u.New)
		fetch = append(fetch, fmt.Sprintf("refs/import/%d", i))
	}
	if _, err := git.run(ctx, q, strings.NewReader(tips.String()), "update-ref", "--stdin"); err != nil {
		return Result{}, refusef(diag.GitImportObject, "store/refs", "a granted ref names an object the store and the repository lack: %v", err)
	}
	// Everything after this point writes the shared repository: first
	// objects, each hashed and checked by index-pack --strict, never one
	// it already has; then the refs, all or none.
	args := []string{
		"-c", "fetch.fsckObjects=true", "-c", "transfer.fsckObjects=true",
		"-c", "fetch.unpackLimit=1", "-c", "transfer.unpackLimit=1",
		"-c", "protocol.allow=never", "-c", "protocol.file.allow=always",
		"fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--no-recurse-submodules", "--no-auto-gc", "--no-auto-maintenance",
		"--upload-pack=git-upload-pack", q,
	}
	if _, err := git.run(ctx, o.Repo, nil, append(args, fetch...)...); err != nil {
		return Result{}, refusef(diag.GitImportObject, "store/objects", "the repository's fetch with fsck refused the store's objects: %v", err)
	}
	var tx strings.Builder
	zero := strings.Repeat("0", hexLen)
	for _, u := range updates {
		old := u.Old
		if old == "" {
			old = zero
		}
		fmt.Fprintf(&tx, "update %s %s %s\n", u.Ref, u.New, old)
	}
	if _, err := git.run(ctx, o.Repo, strings.NewReader(tx.String()), "update-ref", "-m", "paseo-policy git import "+o.Agent, "--stdin"); err != nil {
		return Result{}, refusef(diag.GitImportMoved, "repo", "a granted ref moved while the import ran; no ref was written: %v", err)
	}
	res.Updated = updates
	for _, u := range updates {
		if u.Ref == o.Branch {
			res.Branch = u.New
		}
	}
	return res, nil
}

func (o Options) check() error {
	var l diag.List
	for _, p := range []struct{ name, v string }{{"repo", o.Repo}, {"stateRoot", o.StateRoot}, {"store", o.Store}} {
		if code, _ := pathform.Check(p.v); code != "" || !filepath.IsAbs(p.v) {
			l.Addf(diag.GitImportRepo, p.name, "%q must be an absolute, clean path", p.v)
		}
	}
	if !agentID.MatchString(o.Agent) || !refComponent.MatchString(o.Agent) {
		l.Addf(diag.GitImportRepo, "agent", "%q is not an agent id the namespace can be made of", o.Agent)
	}
	if !strings.HasPrefix(o.Branch, "refs/heads/") || !validRef(o.Branch) {
		l.Addf(diag.GitImportRepo, "branch", "%q must be a full branch name, refs/heads/...", o.Branch)
	}
	if len(l) > 0 {
		return l
	}
	if pathform.Beneath(o.Repo, o.Store) || pathform.Beneath(o.Store, o.Repo) {
		l.Addf(diag.GitImportRepo, "store", "the store must lie apart from the repository")
		return l
	}
	return nil
}

// grantOf maps a ref of the store to the ref it may move in the shared
// repository, or "" when the grant does not cover it.
func (o Options) grantOf(name string) string {
	switch {
	case name == o.Branch:
		return name
	case strings.HasPrefix(name, "refs/heads/"+o.Agent+"/"):
		return name
	case name == "refs/stash":
		return "refs/paseo/" + o.Agent + "/stash"
	}
	return ""
}

// plan decides the updates: each granted ref of the store whose value
// differs from the repository's, the branch only from Base. Every refusal
// is collected; any refusal means no update.
func (o Options) plan(refs map[string]storeRef, shared map[string]string) (Result, []RefUpdate, error) {
	var res Result
	var refuse diag.List
	var updates []RefUpdate
	for _, name := range slices.Sorted(maps.Keys(refs)) {
		r := refs[name]
		target := o.grantOf(name)
		if target == "" {
			if r.bad != "" || shared[name] != r.id {
				res.Ignored.Addf(diag.GitImportRef, "store/"+fmt.Sprintf("%q", name), "outside the grant (the branch %s, refs/heads/%s/*, refs/stash): never written", o.Branch, o.Agent)
			}
			continue
		}
		if r.bad != "" {
			refuse.Addf(diag.GitImportRef, "store/"+fmt.Sprintf("%q", name), "granted, and %s", r.bad)
			continue
		}
		cur := shared[target]
		if cur == r.id {
			if target == o.Branch {
				res.Branch = cur
			}
			continue // already there
		}
		if target == o.Branch && cur != o.Base {
			refuse.Addf(diag.GitImportMoved, target, "the repository has it at %s, not at the base %s it was given: moved since launch or the last import; a person merges it", orNone(cur), orNone(o.Base))
			continue
		}
		updates = append(updates, RefUpdate{Ref: target, Old: cur, New: r.id})
	}
	if len(refuse) > 0 {
		return Result{}, nil, refuse
	}
	return res, updates, nil
}

func orNone(id string) string {
	if id == "" {
		return "(none)"
	}
	return id
}

// sharedRefs lists the shared repository's refs (its own: trusted).
func sharedRefs(ctx context.Context, git gitRunner, repo string, hexLen int) (map[string]string, error) {
	out, err := git.run(ctx, repo, nil, "for-each-ref", "--format=%(objectname) %(refname)")
	if err != nil {
		return nil, err
	}
	refs := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		id, name, ok := strings.Cut(line, " ")
		if !ok || len(id) != hexLen {
			return nil, fmt.Errorf("git for-each-ref: unexpected line %q", line)
		}
		refs[name] = id
	}
	return refs, nil
}

// quarantine makes q a bare repository of the import's own (no template,
// its own config, the shared repository's objects as its alternate) and
// fills it with the store's objects: loose ones verified by hash, packs
// indexed by git from their bytes alone.
func quarantine(ctx context.Context, git gitRunner, q, repo, format string, store storeDir, objs storeObjects, hexLen int, lim Limits) error {
	if _, err := git.run(ctx, q, nil, "init", "--quiet", "--bare", "--template=", "--object-format="+format); err != nil {
		return err
	}
	alt := filepath.Join(q, "objects/info")
	if err := os.MkdirAll(alt, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(alt, "alternates"), []byte(filepath.Join(repo, "objects")+"\n"), 0o644); err != nil {
		return err
	}
	objects, ok, err := store.dir("objects")
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	defer objects.close()
	for _, o := range objs.loose {
		if err := copyLoose(objects, o, filepath.Join(q, "objects"), hexLen, lim.MaxObjectBytes); err != nil {
			return err
		}
	}
	if len(objs.packs) == 0 {
		return nil
	}
	pack, _, err := objects.dir("pack")
	if err != nil {
		return err
	}
	defer pack.close()
	for _, name := range objs.packs {
		f, _, ok, err := pack.file(name, lim.MaxPackBytes)
		if err != nil {
			return err
		}
		if !ok {
			return refusef(diag.GitImportStore, "store/objects/pack/"+name, "vanished while the import read the store")
		}
		_, err = git.run(ctx, q, f, "index-pack", "--stdin")
		f.Close()
		if err != nil {
			var ge *hostgit.Error
			if errors.As(err, &ge) {
				return refusef(diag.GitImportObject, "store/objects/pack/"+name, "git cannot index it: %v", err)
			}
			return err
		}
	}
	return nil
}
