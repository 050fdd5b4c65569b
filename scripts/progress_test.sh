#!/usr/bin/env bash
# scripts/progress_test.sh: the progress lines of scripts/progress.sh, which
# the runsc and image builds print, checked without running either build.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=progress.sh
. scripts/progress.sh
fails=0
err=$(mktemp)
log=$(mktemp)
trap 'rm -f "$err" "$log"' EXIT
want() { # want REGEX: a line of the captured stderr matches
	if grep -qE -- "$1" "$err"; then echo "ok: $1" >&2; else
		echo "FAIL: no line matches $1" >&2
		sed 's/^/  | /' "$err" >&2
		fails=$((fails + 1))
	fi
}

export PASEO_PROGRESS_TICK=1
{
	progress_init demo 3
	progress_step "first"
	progress_run "slow step" --log "$log" -- sh -c "echo 'I: Retrieving libc6' >$log; sleep 2.5"
	rc=0
	progress_run "failing step" -- sh -c 'exit 7' || rc=$?
	echo "rc=$rc"
	printf '%s\n' gvisor.dev/gvisor/pkg/a gvisor.dev/gvisor/pkg/b '# gvisor.dev/gvisor/pkg/c' 'c.go:1: oops' gvisor.dev/gvisor/runsc |
		progress_count 4 "packages compiled"
	progress_done "built"
} 2>"$err" >"$err.out"
cat "$err.out" >>"$err"
rm -f "$err.out"
want '^\[demo 1/3 \+[0-9]+s\] first$'
want '^\[demo 2/3 \+[0-9]+s\] slow step$'
want '^\[demo 2/3 \+[0-9]+s\] still slow step \([0-9]+s\): I: Retrieving libc6$'
want '^\[demo 3/3 \+[0-9]+s\] failing step$'
want '^rc=7$'
want '^\[demo 3/3 \+[0-9]+s\] 2/4 packages compiled$'
want '^# gvisor.dev/gvisor/pkg/c$'
want '^c.go:1: oops$'
want '^\[demo 3/3 \+[0-9]+s\] 3/4 packages compiled \(done; the rest were cached\)$'
want '^\[demo done \+[0-9]+s\] built$'
# The ticker stopped with its step: nothing more arrives.
lines=$(wc -l <"$err")
sleep 2
((lines == $(wc -l <"$err"))) || { echo "FAIL: a ticker outlived its step" >&2; fails=$((fails + 1)); }
# The error lines are not counted as packages, and no ticker line came
# from the failing step, which ended at once.
! grep -q 'still failing step' "$err" || { echo "FAIL: a ticker line for a step that took no time" >&2; fails=$((fails + 1)); }

((fails == 0)) || { echo "progress_test: $fails failure(s)" >&2; exit 1; }
echo "progress_test: pass" >&2
