#!/usr/bin/env bash
# make bench-launch: how much the launcher adds to starting a sandbox, and
# how long the sandbox network takes to build. Needs root, bin/runsc (make
# runsc) and /bin/busybox, like the launcher tests.
#
#   1. First byte: runtime/launcher/bench_test.go. BenchmarkLaunchFirstByte times
#      Launch(...) -> first stdout byte of a bundle whose agent is
#      `echo ready`; BenchmarkBareRunscFirstByte times exec of
#      `bin/runsc --root R --network=none --directfs=false run --bundle D ID`
#      -> first byte, on the same bundle materialized the way the launcher
#      does it (untimed). ROUNDS rounds, one launch of each per round, the
#      order alternating between rounds so drift in machine load hits both
#      alike; one untimed round first warms the page cache. Reduced to
#      medians and their ratio (target <= 1.05).
#   2. Where the launcher's share goes: BenchmarkLaunchSteps (launch plan: bundle read and validated,
#      preflight, runsc id check, launch record, run dir, bind staging; means of 5 per
#      sample) and runtime/launcher/preflight BenchmarkPreflight
#      (every host check, and the runsc digest, nftables probe, cgroup and
#      kernel checks alone).
#   3. Repository size: BenchmarkLaunchRepoSize, the pi-session profile's
#      start script (its Git seeding; `echo ready` for Pi) launched on a
#      linked worktree of a generated repository of ~100,000 objects and of
#      one of one commit with the same tree, the agent's store empty each
#      time (a first launch), REPO_ROUNDS alternating rounds in one run:
#      medians and their ratio (expected ~1.0: the store is seeded O(refs)).
#   4. Sandbox network: runtime/launcher/sandboxnet BenchmarkSetup, Setup (netns,
#      veth, addresses, route, nftables table; 1 tcp rule, 1 route) and
#      Teardown timed separately (target: setup <= 30 ms).
#
# Exits 0 whether or not a target is met (it is a benchmark, not a test);
# each target is printed as MET or MISSED. Knobs (environment): ROUNDS
# (first-byte samples each, default 12), REPO_ROUNDS (repository-size
# rounds, default 8), COUNT (samples of the other
# benchmarks, default 10), GO (default go).
set -euo pipefail
cd "$(dirname "$0")/.."

go=${GO:-go}
rounds=${ROUNDS:-12}
count=${COUNT:-10}

[[ $(id -u) == 0 ]] || { echo "bench-launch: needs root (runsc, namespaces, nftables)" >&2; exit 1; }
[[ -x bin/runsc ]] || { echo "bench-launch: bin/runsc missing; run make runsc" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh
# samples FILE NAME UNIT -> every sample in ms, in order, on one line.
samples() {
  awk -v n="$2" -v u="$3" '$1 == n && $2 == u { printf "%.1f ", $3 / 1e6 }' "$1"
}
ms() { awk -v ns="$1" 'BEGIN { printf "%.1f", ns / 1e6 }'; }
verdict() { # verdict VALUE LIMIT -> MET / MISSED
  awk -v v="$1" -v l="$2" 'BEGIN { print (v <= l ? "MET" : "MISSED") }'
}

# --- machine ----------------------------------------------------------------
case $(stat -fc %T /sys/fs/cgroup) in
  cgroup2fs) cgroup="cgroup v2" ;;
  *) cgroup="cgroup v1"
     [[ $(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null) == cgroup2fs ]] && cgroup="cgroup v1 (hybrid: v2 at /sys/fs/cgroup/unified)" ;;
esac
echo "== machine: $(nproc) cores; kernel $(uname -r); $cgroup; $("$go" version | cut -d' ' -f3-); $(bin/runsc --version | head -1)"
echo "   load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if rev=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- ./runtime/launcher ./internal 2>/dev/null || rev="$rev + uncommitted changes under ./runtime/launcher or ./internal"
  echo "   code: $rev"
fi

# --- test binaries ----------------------------------------------------------
# Built once, run from their package directories (the benchmarks find
# bin/runsc and testdata relative to it).
# Package directories are written ./dir here, as go test takes them.
for pkg in ./runtime/launcher ./runtime/launcher/preflight ./runtime/launcher/sandboxnet; do
  "$go" test -c -o "$tmp/$(basename "$pkg").test" "$pkg"
done
bench() { # bench PKGDIR BINARY BENCH-REGEXP BENCHTIME COUNT
  (cd "$1" && "$tmp/$2" -test.run '^$' -test.bench "$3" -test.benchtime "$4" -test.count "$5")
}

# --- first byte ---------------------------------------------------------------
launch='^BenchmarkLaunchFirstByte$'
bare='^BenchmarkBareRunscFirstByte$'
echo
echo "== first byte: $rounds rounds of one Launch and one bare runsc run (order alternating), after one warm-up round"
bench ./runtime/launcher launcher.test "$launch" 1x 1 > /dev/null
bench ./runtime/launcher launcher.test "$bare" 1x 1 > /dev/null
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then order=("$launch" "$bare"); else order=("$bare" "$launch"); fi
  for b in "${order[@]}"; do
    bench ./runtime/launcher launcher.test "$b" 1x 1 >> "$tmp/first-byte.txt"
  done
done
metrics "$tmp/first-byte.txt" > "$tmp/first-byte.m"
echo "   launcher ms: $(samples "$tmp/first-byte.m" BenchmarkLaunchFirstByte first-byte-ns)"
echo "   bare ms:     $(samples "$tmp/first-byte.m" BenchmarkBareRunscFirstByte first-byte-ns)"

# --- repository size ------------------------------------------------------------
repo_rounds=${REPO_ROUNDS:-8}
echo
echo "== launch on a linked worktree of ~100,000 objects against one commit: $repo_rounds alternating rounds (repositories generated first, untimed)"
bench ./runtime/launcher launcher.test '^BenchmarkLaunchRepoSize$' "${repo_rounds}x" 1 | tee "$tmp/repo.txt" | grep '^Benchmark'
metrics "$tmp/repo.txt" > "$tmp/repo.m"

# --- where the launcher's time goes -------------------------------------------
echo
echo "== launcher steps before runsc starts (-benchtime 5x -count $count)"
bench ./runtime/launcher launcher.test '^BenchmarkLaunchSteps$' 5x "$count" | tee "$tmp/steps.txt" | grep '^Benchmark' | head -3
echo "   ..."
metrics "$tmp/steps.txt" > "$tmp/steps.m"
echo
echo "== preflight host checks (-benchtime 5x -count $count)"
bench ./runtime/launcher/preflight preflight.test '^BenchmarkPreflight$' 5x "$count" > "$tmp/preflight.txt"
metrics "$tmp/preflight.txt" > "$tmp/preflight.m"
grep '^Benchmark' "$tmp/preflight.txt" | awk '!seen[$1]++'
echo "   ..."

# --- sandbox network ----------------------------------------------------------
echo
echo "== sandbox network Setup/Teardown (-benchtime 20x -count $count)"
bench ./runtime/launcher/sandboxnet sandboxnet.test '^BenchmarkSetup$' 20x "$count" > "$tmp/net.txt"
metrics "$tmp/net.txt" > "$tmp/net.m"
grep '^Benchmark' "$tmp/net.txt" | head -3
echo "   ..."

# --- summary ------------------------------------------------------------------
launch_ns=$(metric "$tmp/first-byte.m" BenchmarkLaunchFirstByte first-byte-ns)
bare_ns=$(metric "$tmp/first-byte.m" BenchmarkBareRunscFirstByte first-byte-ns)
ratio=$(awk -v a="$launch_ns" -v b="$bare_ns" 'BEGIN { printf "%.2f", a / b }')
# Per-round ratio: each launcher sample over the bare sample of its round.
paired=$(paste <(awk '$1 == "BenchmarkLaunchFirstByte" { print $3 }' "$tmp/first-byte.m") \
               <(awk '$1 == "BenchmarkBareRunscFirstByte" { print $3 }' "$tmp/first-byte.m") |
         awk '{ printf "%.4f\n", $1 / $2 }' | median)
setup_ns=$(metric "$tmp/net.m" BenchmarkSetup setup-ns)
teardown_ns=$(metric "$tmp/net.m" BenchmarkSetup teardown-ns)
setup_ms=$(ms "$setup_ns")

echo
echo "== summary (medians; load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "launcher start -> first byte: $(ms "$launch_ns") ms ($rounds samples)"
echo "bare runsc run -> first byte: $(ms "$bare_ns") ms ($rounds samples)"
echo "ratio launcher/bare: $ratio (median of per-round ratios: $(awk -v v="$paired" 'BEGIN { printf "%.2f", v }')); target <= 1.05: $(verdict "$ratio" 1.05)"
echo "launcher overhead: $(awk -v a="$launch_ns" -v b="$bare_ns" 'BEGIN { printf "%.1f", (a - b) / 1e6 }') ms, of which before runsc starts:"
echo "  preflight as a launch runs it (cached runsc digest, no nftables probe): $(ms "$(metric "$tmp/steps.m" BenchmarkLaunchSteps preflight-ns)") ms"
echo "  for comparison, uncached (doctor): runsc sha256 + ELF check $(ms "$(metric "$tmp/preflight.m" BenchmarkPreflight/runsc ns/op)") ms ($(du -m bin/runsc | cut -f1) MiB binary),"
echo "    nftables probe $(ms "$(metric "$tmp/preflight.m" BenchmarkPreflight/nftables ns/op)") ms, cgroup + kernel $(awk -v a="$(metric "$tmp/preflight.m" BenchmarkPreflight/cgroup ns/op)" -v b="$(metric "$tmp/preflight.m" BenchmarkPreflight/kernel ns/op)" 'BEGIN { printf "%.2f", (a + b) / 1e6 }') ms,"
echo "    all host checks $(ms "$(metric "$tmp/preflight.m" BenchmarkPreflight/run ns/op)") ms"
steps=(preflight bundle-read id-check record rundir binds)
echo "  bundle read once and validated (the launch plan): $(ms "$(metric "$tmp/steps.m" BenchmarkLaunchSteps bundle-read-ns)") ms"
echo "  id check (runsc state files): $(ms "$(metric "$tmp/steps.m" BenchmarkLaunchSteps id-check-ns)") ms"
echo "  launch record: $(ms "$(metric "$tmp/steps.m" BenchmarkLaunchSteps record-ns)") ms"
echo "  run dir (mkdir, secret injection, spec patch): $(ms "$(metric "$tmp/steps.m" BenchmarkLaunchSteps rundir-ns)") ms"
echo "  bind staging (openat2 + pin check + open_tree/move_mount per bind): $(ms "$(metric "$tmp/steps.m" BenchmarkLaunchSteps binds-ns)") ms"
stepsum=0
for st in "${steps[@]}"; do
  stepsum=$(awk -v a="$stepsum" -v b="$(metric "$tmp/steps.m" BenchmarkLaunchSteps "$st-ns")" 'BEGIN { printf "%.1f", a + b }')
done
echo "  rest (no step times it: exec and stdio plumbing, noise between the two medians): $(awk \
  -v a="$launch_ns" -v b="$bare_ns" -v s="$stepsum" 'BEGIN { printf "%.1f", (a - b - s) / 1e6 }') ms"
echo "launch on ~$(metric "$tmp/repo.m" BenchmarkLaunchRepoSize objects) objects: $(ms "$(metric "$tmp/repo.m" BenchmarkLaunchRepoSize large-first-byte-ns)") ms; on one commit: $(ms "$(metric "$tmp/repo.m" BenchmarkLaunchRepoSize small-first-byte-ns)") ms; ratio $(awk -v v="$(metric "$tmp/repo.m" BenchmarkLaunchRepoSize ratio)" 'BEGIN { printf "%.2f", v }') (median of per-round ratios $(awk -v v="$(metric "$tmp/repo.m" BenchmarkLaunchRepoSize round-ratio)" 'BEGIN { printf "%.2f", v }')); expected ~1.0 (store seeded O(refs)): $(verdict "$(metric "$tmp/repo.m" BenchmarkLaunchRepoSize ratio)" 1.10)"
echo "netns+rules setup: $setup_ms ms ($count samples, each the mean of 20); target <= 30 ms: $(verdict "$setup_ms" 30)"
echo "netns+rules teardown: $(ms "$teardown_ns") ms"
