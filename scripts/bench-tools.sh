#!/usr/bin/env bash
# make bench-tools: an agent's tools on a real repository inside one sandbox
# launched by the product (the pi-session profile, its start script, the
# Git layout, gofer-backed binds, --directfs=false) against the same
# commands run by the deployment user on the host with the image's own
# binaries (a chroot of the same image tree), in one run. Needs root,
# bin/runsc (make runsc) and the image (make image). The benchmark is
# test/e2e/bench_tools_test.go (its header says exactly what is timed);
# this script builds the test binary, runs it, and prints its table.
#
# Every command's sandbox/host ratio of the medians (and the median of the
# per-round ratios), wall and CPU, and the median over the commands, are
# printed; the target (issue 33) is a median <= 1.5 with no command above 3,
# printed MET or MISSED. Exits 0 once the benchmark ran (it is a benchmark),
# 1 when it failed (a command that failed, not a slow one).
#
# Knobs (environment): FILES (tracked files in the generated tree, default
# 20000; 2000 for a quick run), ROUNDS (default 5), GITCONFIG ("key=value
# ..." Git settings for the git of one side only, SIDE, default sandbox:
# instead of the profile's, or after them with a leading "+"; an A/B
# against a run without, or the issue's start with Git's defaults), SIDE_ENV
# ("NAME=value ..." exported for that side's commands), PACKED (0 leaves
# the generated repository's objects loose; by default one pack, as a
# clone has them), ONLY (a regular expression of the commands to run), FSMONITOR
# (0 leaves out the third side, a sandbox in network mode sandbox, whose
# git the workspace monitor answers: the plan's default grant), SEARCH (1
# adds a side: a sandbox compiled with the registry's native search switch,
# deployments.<id>.search "native", whose rg, fd and find are answered from
# the host; default 0), VOUCH ("ab" adds a side fsmseed: the monitored
# sandbox again, each round started from the seed's index instead of the
# launcher's vouched one, the first status as it was before the vouch),
# OUT (a file to keep the benchmark's raw output in: every command's time
# per side and round), GO (default go).
# With more sides, each sandbox's table and summary are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
verdict() { awk -v v="$1" -v l="$2" 'BEGIN { print (v <= l ? "MET" : "MISSED") }'; }

go=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== bench-tools: $(nproc) cores, load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
if rev=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- ./runtime/launcher ./internal ./test/e2e ./policy 2>/dev/null || rev="$rev + uncommitted changes"
  echo "   code: $rev"
fi
echo "   files ${FILES:-20000}, rounds ${ROUNDS:-5}, objects: $([ "${PACKED:-1}" = 0 ] && echo loose || echo one pack), ${SIDE:-sandbox} side's git settings: ${GITCONFIG:-as the profile sets them}${SIDE_ENV:+, env: $SIDE_ENV}"

"$go" test -c -o "$tmp/e2e.test" ./test/e2e
if ! (cd ./test/e2e && TOOLS_BENCH_FILES=${FILES:-20000} TOOLS_BENCH_ROUNDS=${ROUNDS:-5} TOOLS_BENCH_GITCONFIG=${GITCONFIG:-} TOOLS_BENCH_ENV=${SIDE_ENV:-} TOOLS_BENCH_SIDE=${SIDE:-} TOOLS_BENCH_PACKED=${PACKED:-1} TOOLS_BENCH_ONLY=${ONLY:-} TOOLS_BENCH_FSMONITOR=${FSMONITOR:-1} TOOLS_BENCH_SEARCH=${SEARCH:-0} TOOLS_BENCH_VOUCH=${VOUCH:-} \
  "$tmp/e2e.test" -test.run '^$' -test.bench '^BenchmarkTools$' -test.benchtime 1x -test.timeout 60m) >"$tmp/out.txt" 2>&1; then
  echo "   the benchmark failed; its output:" >&2
  tail -n 30 "$tmp/out.txt" >&2
  exit 1
fi
[ -z "${OUT:-}" ] || cp "$tmp/out.txt" "$OUT"
grep -E '^tools: tree' "$tmp/out.txt" | sed 's/^/   /'
grep -E '^tools: monitor' "$tmp/out.txt" | sed 's/^/   /' || true
echo
sed -n '/^tools: medians/,/^tools: median over/p' "$tmp/out.txt"
echo
echo "== summary (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
grep -E '^tools: median over' "$tmp/out.txt" | while IFS= read -r line; do
  side=$(sed -E 's/.*the commands \(([a-z]+)\).*/\1/' <<<"$line")
  med=$(sed -E 's/.*: wall ([0-9.]+) x.*/\1/' <<<"$line")
  top=$(sed -E 's/.*highest wall ([0-9.]+) x.*/\1/' <<<"$line")
  echo "$side: median $side/host over the commands: $med; target <= 1.5: $(verdict "$med" 1.5)"
  echo "$side: highest command: $top; target <= 3: $(verdict "$top" 3)"
done
