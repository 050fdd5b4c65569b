package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Record is what the launcher writes about one sandbox before it creates
// anything for it, and removes after teardown. Every object a launch makes
// is named from the id (run dir, netns file, veth, nftables table, lease,
// cgroup), so a record is enough for gc to remove what a crashed launcher
// left, and `ps` can tell a live sandbox from an orphan. A teardown with a
// failed step keeps the record, naming the failures (Teardown): that
// launch is over, so ps shows it as garbage and gc removes what is left,
// whether or not the process that ran it still lives.
type Record struct {
	ID         string    `json:"id"`
	Bundle     string    `json:"bundle"`
	Profile    string    `json:"profile"`
	Agent      string    `json:"agent"`
	Deployment string    `json:"deployment"`
	Network    string    `json:"network"`
	Uplink     string    `json:"uplink,omitempty"`
	Started    time.Time `json:"started"`
	// RanBefore is how long the sandbox ran before this launch, when the
	// launch is a wake: wall time counts running time.
	RanBefore time.Duration `json:"ranBefore,omitempty"`
	// Launcher identifies the owning launcher process; the start time
	// guards against pid reuse.
	LauncherPID   int    `json:"launcherPid"`
	LauncherStart uint64 `json:"launcherStart"`
	// Teardown lists the teardown steps that failed (the launch result's
	// Teardown), written when the launch ended; empty while it runs.
	Teardown []UndoFailure `json:"teardown,omitempty"`
}

// UndoFailure is one teardown step that failed: what it was undoing and
// why it failed. What it left behind is garbage that ps shows and gc
// removes.
type UndoFailure struct {
	Step  string `json:"step"`
	Error string `json:"error"`
}

func (f UndoFailure) String() string { return f.Step + ": " + f.Error }

// RecordsDir holds the records, one <id>.json each.
func RecordsDir(root string) string { return filepath.Join(root, "records") }

func recordPath(root, id string) string {
	return filepath.Join(RecordsDir(root), id+".json")
}

// WriteRecord writes r, which must be new: a record of the id already
// there fails (fs.ErrExist), as the id is in use.
func WriteRecord(root string, r Record) error {
	if err := os.MkdirAll(RecordsDir(root), 0o700); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.OpenFile(recordPath(root, r.ID), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("record for %s: %w (is the id in use?)", r.ID, err)
	}
	_, werr := f.Write(append(data, '\n'))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}

// RemoveRecord removes id's record; none there is fine.
func RemoveRecord(root, id string) error {
	if err := os.Remove(recordPath(root, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// KeepFailedRecord rewrites r with the teardown steps that failed, in
// place of removing it (write and rename: a reader sees the old record or
// the new one).
func KeepFailedRecord(root string, r Record, failed []UndoFailure) error {
	r.Teardown = failed
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := recordPath(root, r.ID) + ".tmp" // not *.json: Records skips it
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, recordPath(root, r.ID))
}

// Ended reports whether the launch the record names is over: its
// launcher is gone, or its teardown ended with failures. Its leftovers
// are gc's.
func (r Record) Ended() bool { return len(r.Teardown) > 0 || !r.LauncherAlive() }

// Records lists the launcher's records, sorted by id.
func Records(root string) ([]Record, error) {
	ents, err := os.ReadDir(RecordsDir(root))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		r, err := readRecord(filepath.Join(RecordsDir(root), e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Lookup is the one lookup of a record by id: the record of sandbox id,
// and whether there is one. An id that cannot name a record has none.
func Lookup(root, id string) (Record, bool, error) {
	if ValidID(id) != nil {
		return Record{}, false, nil
	}
	r, err := readRecord(recordPath(root, id))
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, err
	}
	return r, true, nil
}

func readRecord(path string) (Record, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, fmt.Errorf("record %s: %w", filepath.Base(path), err)
	}
	return r, nil
}

// ProcessStart is the start time of pid in clock ticks since boot (field
// 22 of /proc/<pid>/stat), or 0 if the process does not exist.
func ProcessStart(pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) may contain spaces; fields after the last
	// ')' are space separated, starting with field 3.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// LauncherAlive reports whether the launcher that wrote r still runs.
func (r Record) LauncherAlive() bool {
	return r.LauncherPID > 0 && r.LauncherStart != 0 && ProcessStart(r.LauncherPID) == r.LauncherStart
}
