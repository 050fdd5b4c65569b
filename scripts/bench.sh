#!/usr/bin/env bash
# make bench: how fast the compiler is, in process and as a CLI.
#
#   1. go test -bench over ./policy/compiler/ (policy/compiler/bench_test.go), -count 5,
#      reduced to medians: the in-process compile of the reference
#      pi-session facts (target <= 3 ms), the same compile with a registry
#      the process has not checked before (as a one-shot CLI compile has),
#      the ns per fact set over batches
#      of 1, 10, 100 and 1000 distinct fact sets (linear growth means a flat
#      ns/factset), and the bare CUE unify-validate-decode baseline.
#   2. Wall time of RUNS runs each of
#        bin/paseo-policy compile --facts testdata/base/facts.json ...
#        bin/cue export -d '#Facts' policy/schema/*.cue testdata/base/facts.json
#      reduced to medians and printed as a ratio (target: CLI <= 50 ms).
#   3. go test -bench over ./runtime/gitimport/ (bench_test.go), -benchtime 3x,
#      -count GITCOUNT (default 3): git import of an agent's 1,000 commits
#      (11,000 objects, one pack) against git fetch of the same commits
#      between two local repositories, as medians and their ratio.
#
# The cue command is the pinned one from tools/cue (same cuelang.org/go
# version the compiler links); it is built into bin/cue when missing or
# when bin/cue reports another version. `-d '#Facts'` makes cue unify the
# JSON facts with the #Facts definition of the same embedded schema files,
# check it closed and concrete (export refuses incomplete values) and
# encode it: the CUE share of a compile, with nothing of the registry,
# profile, path resolution or rendering.
#
# Knobs (environment): BENCHTIME (go -benchtime, default 1s), COUNT (go
# -count, default 5), RUNS (CLI runs each, default 20), PASEO_POLICY and
# CUE (the two binaries, default bin/paseo-policy and bin/cue; point both
# elsewhere to measure without writing into a shared bin/). Timings come from
# bash's $EPOCHREALTIME, so no process is forked to read the clock.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${PASEO_POLICY:-bin/paseo-policy}
cue=${CUE:-bin/cue}
benchtime=${BENCHTIME:-1s}
count=${COUNT:-5}
runs=${RUNS:-20}

[[ -x $bin ]] || { echo "bench: $bin missing; run make build" >&2; exit 1; }

# --- pinned cue -----------------------------------------------------------
cue_version=$(awk '$1 == "require" && $2 == "cuelang.org/go" { print $3 } $1 == "cuelang.org/go" { print $2 }' tools/cue/go.mod)
if ! { [[ -x $cue ]] && "$cue" version 2>/dev/null | awk -v v="$cue_version" 'NR == 1 && $3 == v { ok = 1 } END { exit !ok }'; }; then
  echo "== building $cue ($cue_version, pinned in tools/cue)"
  cue_out=$(realpath -m "$cue")
  (cd tools/cue && GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" \
    go build -o "$cue_out" cuelang.org/go/cmd/cue)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# median: one number per line on stdin -> the median (mean of the middle
# two for an even count).
median() {
  sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "NaN"; exit }
    if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# --- machine --------------------------------------------------------------
echo "== machine: $(nproc) cores; kernel $(uname -r); $(go version | cut -d' ' -f3-); $("$cue" version | awk 'NR == 1')"
echo "   load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- go benchmarks ----------------------------------------------------------
echo
echo "== go test -run '^\$' -bench . -benchtime $benchtime -count $count ./policy/compiler/"
go test -run '^$' -bench . -benchtime "$benchtime" -count "$count" ./policy/compiler/ | tee "$tmp/go-bench.txt"

# "name unit value" for every metric of every run, GOMAXPROCS suffix dropped.
awk '/^Benchmark/ {
  name = $1; sub(/-[0-9]+$/, "", name)
  for (i = 3; i < NF; i += 2) print name, $(i + 1), $i
}' "$tmp/go-bench.txt" > "$tmp/metrics.txt"

# metric NAME UNIT -> median over the -count runs.
metric() {
  awk -v n="$1" -v u="$2" '$1 == n && $2 == u { print $3 }' "$tmp/metrics.txt" | median
}
ms() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1e6 }'; }

ref_ns=$(metric BenchmarkCompileReference ns/op)
ref_b=$(metric BenchmarkCompileReference B/op)
ref_allocs=$(metric BenchmarkCompileReference allocs/op)
newreg_ns=$(metric BenchmarkCompileNewRegistry ns/op)
bare_ns=$(metric BenchmarkCUEBaseline/bare ns/op)
load_ns=$(metric BenchmarkCUEBaseline/LoadFacts ns/op)
batch=()
for n in 1 10 100 1000; do
  batch+=("$(awk -v v="$(metric "BenchmarkCompileBatch/n=$n" ns/factset)" 'BEGIN { printf "%.0f", v }')")
done

# --- CLI wall time ----------------------------------------------------------
# The reference facts name host paths under /srv/paseo; as in make demo,
# build that tree beneath a temporary directory and resolve there.
host=$tmp/host
mkdir -p "$host"
# tree.txt lines: "dir PATH", "file PATH" (empty) or "text PATH CONTENT"
# (as scripts/demo.sh reads them).
while read -r kind path rest; do
  case "$kind" in
    dir) mkdir -p "$host$path" ;;
    file) mkdir -p "$(dirname "$host$path")" && : > "$host$path" ;;
    text) mkdir -p "$(dirname "$host$path")" && printf '%s\n' "$rest" > "$host$path" ;;
  esac
done < testdata/base/tree.txt

paseo_cmd=("$bin" compile --facts testdata/base/facts.json --registry testdata/base/registry.json
  --resolve-root "$host" --out "$tmp/bundle")
cue_cmd=("$cue" export -d '#Facts' policy/schema/*.cue testdata/base/facts.json)

# wall CMD... -> one line per run, in ms. One untimed run first: it proves
# the command succeeds and warms the page cache.
wall() {
  "$@" > /dev/null
  local i t0 t1
  for ((i = 0; i < runs; i++)); do
    t0=$EPOCHREALTIME
    "$@" > /dev/null
    t1=$EPOCHREALTIME
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", (b - a) * 1000 }'
  done
}

echo
echo "== CLI wall time, $runs runs each"
echo "   paseo: ${paseo_cmd[*]}"
echo "   cue:   ${cue_cmd[*]}"
wall "${paseo_cmd[@]}" > "$tmp/paseo.ms"
wall "${cue_cmd[@]}" > "$tmp/cue.ms"
# Process start-up with nothing to compile: the floor under the CLI figure.
wall "$bin" version > "$tmp/version.ms"
cli_ms=$(awk -v v="$(median < "$tmp/paseo.ms")" 'BEGIN { printf "%.1f", v }')
cue_ms=$(awk -v v="$(median < "$tmp/cue.ms")" 'BEGIN { printf "%.1f", v }')
ratio=$(awk -v a="$cli_ms" -v b="$cue_ms" 'BEGIN { printf "%.2f", a / b }')
echo "   paseo ms: $(tr '\n' ' ' < "$tmp/paseo.ms")"
echo "   cue ms:   $(tr '\n' ' ' < "$tmp/cue.ms")"
echo "   paseo-policy version (start-up floor) ms: $(tr '\n' ' ' < "$tmp/version.ms")"
version_ms=$(awk -v v="$(median < "$tmp/version.ms")" 'BEGIN { printf "%.1f", v }')

# --- git import against git fetch ---------------------------------------------
echo
echo "== go test -run '^\$' -bench 'Import|Fetch' -benchtime 3x -count ${GITCOUNT:-3} ./runtime/gitimport/"
go test -run '^$' -bench 'Import|Fetch' -benchtime 3x -count "${GITCOUNT:-3}" ./runtime/gitimport/ | tee "$tmp/git-bench.txt"
gitmetric() {
  awk -v n="$1" '$1 ~ "^"n"(-[0-9]+)?$" { print $3 }' "$tmp/git-bench.txt" | median
}
import_ns=$(gitmetric BenchmarkImport)
fetch_ns=$(gitmetric BenchmarkFetch)

# --- summary ------------------------------------------------------------------
verdict() { # verdict VALUE LIMIT -> met / MISSED
  awk -v v="$1" -v l="$2" 'BEGIN { print (v <= l ? "met" : "MISSED") }'
}
ref_ms=$(ms "$ref_ns")
growth=$(awk -v a="${batch[0]}" -v b="${batch[3]}" 'BEGIN { printf "%.2f", b / a }')

echo
echo "== summary (medians; load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "in-process compile median: $ref_ms ms (target <= 3 ms: $(verdict "$ref_ms" 3)); $(awk -v b="$ref_b" 'BEGIN { printf "%.0f", b / 1024 }') KiB, $ref_allocs allocs per compile"
echo "in-process compile with a registry new to the process: $(ms "$newreg_ns") ms"
echo "cue baseline median: bare unify-validate-decode $(ms "$bare_ns") ms; schema.LoadFacts $(ms "$load_ns") ms"
echo "batch ns/factset at n=1,10,100,1000: ${batch[0]}, ${batch[1]}, ${batch[2]}, ${batch[3]} (n=1000 / n=1: $growth; linear if ~1, target <= 1.25: $(verdict "$growth" 1.25))"
echo "cli compile median: $cli_ms ms; cue median: $cue_ms ms; ratio paseo/cue: $ratio (target <= 50 ms: $(verdict "$cli_ms" 50)); start-up floor (paseo-policy version): $version_ms ms"
echo "git import of 1,000 commits / 11,000 objects: $(ms "$import_ns") ms; git fetch of the same between two local repositories: $(ms "$fetch_ns") ms; ratio import/fetch: $(awk -v a="$import_ns" -v b="$fetch_ns" 'BEGIN { printf "%.2f", a / b }')"
