package acceptance

import (
	"fmt"
	"sort"
	"sync"
	"testing"
)

// Attacks from outside the sandbox under test
//
// The contained run proves what an agent inside one sandbox cannot do. A real
// deployment has attackers outside it too: the daemon user racing a mount
// source, a neighbouring sandbox (often in the same repository), another
// deployment naming this one's secrets, an agent planting code in shared
// state, and floods of shared resources. Each attack runs twice: against the
// product (Contained: it must never win) and against a control that lacks
// the one protection under test (Control: it must win at least once), so
// every attack is shown able to fail. Counts go to out/acceptance.json.

// The families share the scene's uplink, and a sandbox link lingers until
// its test's cleanup, so each family's address pools are its own:
// scene 10.213.77.0/30, floods 10.213.78-80.0/30, mcp 10.213.81.0/30 and
// 10.213.81.4/30 (respelled calls), neighbour 10.213.82.0/29.

// OutsideAttack is one attack's tally.
type OutsideAttack struct {
	// Name is stable ("daemon-user-races-bind-source-timed", …).
	Name string `json:"name"`
	// Attacker is who attacks: daemon-user, neighbour-sandbox,
	// other-deployment, agent, flood.
	Attacker string `json:"attacker"`
	// What the attack tries and what the control lacks, in a sentence each.
	Goal    string `json:"goal"`
	Control string `json:"control"`
	// Contained is the product's tally, ControlRun the unprotected one's.
	Contained  Tally `json:"contained"`
	ControlRun Tally `json:"control_run"`
	// Evidence is a short note for the reviewer (no secret, no marker).
	Evidence string `json:"evidence,omitempty"`
	// Cases, for a family whose attempts differ in kind, is its own record
	// of each (the Git plants: one row per surface).
	Cases any `json:"cases,omitempty"`
}

// Tally counts one side of an attack. Refusals are attempts the product
// refused outright (a launch refused because a pin moved, a ref refused at
// compile); the rest of the attempts ran and neither won nor were refused.
type Tally struct {
	Attempts int `json:"attempts"`
	Wins     int `json:"wins"`
	Refusals int `json:"refusals"`
}

// outsideAttack runs against the acceptance scene and returns its tallies.
type outsideAttack func(t *testing.T, s *scene) []OutsideAttack

var (
	outsideMu      sync.Mutex
	outsideAttacks = map[string]outsideAttack{}
)

// registerOutside adds an attack family; each lives in its own
// outside_*_test.go file and registers itself from init.
func registerOutside(family string, f outsideAttack) {
	outsideMu.Lock()
	defer outsideMu.Unlock()
	if _, dup := outsideAttacks[family]; dup {
		panic("outside attack family registered twice: " + family)
	}
	outsideAttacks[family] = f
}

// runOutside runs every registered family in name order.
func (s *scene) runOutside(t *testing.T) []OutsideAttack {
	outsideMu.Lock()
	families := make([]string, 0, len(outsideAttacks))
	for f := range outsideAttacks {
		families = append(families, f)
	}
	outsideMu.Unlock()
	sort.Strings(families)
	out := []OutsideAttack{}
	for _, f := range families {
		t.Logf("outside attacks: %s", f)
		out = append(out, outsideAttacks[f](t, s)...)
	}
	return out
}

// judgeOutside: an attack fails the proof when it ever won against the
// product, and is unproven (inconclusive) when its control never won or
// either side made no attempt.
func judgeOutside(attacks []OutsideAttack, fail, unsure func(string, ...any)) {
	for _, a := range attacks {
		switch {
		case a.Contained.Wins > 0:
			fail("outside:%s won %d of %d attempts", a.Name, a.Contained.Wins, a.Contained.Attempts)
		case a.Contained.Attempts == 0:
			unsure("outside:%s made no attempt", a.Name)
		}
		if a.ControlRun.Wins == 0 {
			unsure("outside-control:%s never won in %d attempts, so the attack is unproven", a.Name, a.ControlRun.Attempts)
		}
	}
}

func (a OutsideAttack) String() string {
	return fmt.Sprintf("%s: contained %d/%d (refused %d), control %d/%d", a.Name, a.Contained.Wins, a.Contained.Attempts, a.Contained.Refusals, a.ControlRun.Wins, a.ControlRun.Attempts)
}
