package launcher

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
)

// Who owns a checkpoint (gc of orphaned images)
//
// A hibernated sandbox has no launch record: its launch ended at the
// checkpoint. What will wake it is the process that took it, the holder,
// which keeps the sandbox's stdio and bridge; the supervisor knows its
// sandboxes across restarts only through their holders (it adopts a
// holder that answers on its socket and drops a dead one's socket), and a
// new holder cannot take over another's checkpoint. So a checkpoint is
// owned exactly while its owner process lives (pid and start time, as a
// record's launcher). Once the owner is dead, nothing can adopt or wake
// the image, and gc removes it with its address lease. Fail safe: an
// owner that cannot be read (a checkpoint taken before owners were
// recorded, a damaged file), or one in another pid namespace than gc's
// (its pid means nothing here), counts as alive; the supervisor's delete,
// or an operator, removes it.

type owner struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	// PidNS is the owner's pid namespace (readlink /proc/self/ns/pid).
	PidNS string `json:"pidNS"`
}

func pidNamespace() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

func writeOwner(dir string) error {
	pid := os.Getpid()
	data, err := json.Marshal(owner{PID: pid, Start: processStart(pid), PidNS: pidNamespace()})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, OwnerFile), append(data, '\n'), 0o600)
}

// hibernationOwned reports whether a live process may still wake the
// checkpoint of id: its owner lives, or who its owner is cannot be told.
// A hibernate dir gone meanwhile is owned by nobody.
func hibernationOwned(stateRoot, id string) bool {
	dir := HibernateDir(stateRoot, id)
	data, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Lstat(dir); errors.Is(serr, os.ErrNotExist) {
			return false
		}
		return true // taken before owners were recorded: keep
	}
	var o owner
	if err != nil || json.Unmarshal(data, &o) != nil || o.PID <= 0 || o.Start == 0 || o.PidNS == "" || o.PidNS != pidNamespace() {
		return true
	}
	return processStart(o.PID) == o.Start
}
