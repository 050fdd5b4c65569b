#!/usr/bin/env bash
# make bench-bridge: how fast output gets through the bridge, and how long
# a reattaching client waits for a 1 MiB backlog. runtime/bridge/bench_test.go:
#
#   1. Throughput. BenchmarkRawPipe: a producer goroutine writes 64 MiB in
#      32 KiB writes into an os.Pipe, a consumer reads it all.
#      BenchmarkBridgeThroughput: the same producer and pipe, the read end
#      is a bridge output (bridge.Start, MemBytes 4 MiB, SpillBytes 64 MiB)
#      and the consumer is a client on Session.Stream from cursor 0 that
#      acks every 64 records. Both time first write -> last byte received
#      and report MB/s. COUNT rounds, one run of each per round, the order
#      alternating between rounds so drift in machine load hits both alike.
#      Target: bridge >= 0.8 x raw (ratio of the medians).
#   2. Replay. BenchmarkReplay1MiB: Stream(ctx, 0, ...) of a finished
#      session holding 1 MiB of stdout, in memory (MemBytes 4 MiB) or
#      mostly in the spill file (MemBytes 64 KiB), in 32 KiB records (bulk
#      output) or 512 B records (line-sized output); -count COUNT.
#
# Exits 0 whether or not the target is met (it is a benchmark, not a
# test); the target is printed as MET or MISSED. It fails only when the
# benchmarks cannot be built or one of them fails (a lost, duplicated or
# reordered record). Knobs (environment): COUNT (rounds / -count, default
# 5, at least 5), BENCHTIME (go -benchtime per run, default 1s), GO
# (default go). Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."

go=${GO:-go}
count=${COUNT:-5}
benchtime=${BENCHTIME:-1s}
((count >= 5)) || { echo "bench-bridge: COUNT must be at least 5" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh
# samples FILE NAME UNIT -> every sample, in order, on one line.
samples() {
  awk -v n="$2" -v u="$3" '$1 == n && $2 == u { printf "%.0f ", $3 }' "$1"
}

# --- machine ----------------------------------------------------------------
echo "== machine: $(nproc) cores ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)); kernel $(uname -r); $("$go" version | cut -d' ' -f3-)"
echo "   load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if rev=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- ./runtime/bridge 2>/dev/null || rev="$rev + uncommitted changes under ./runtime/bridge"
  echo "   code: $rev"
fi

# --- test binary ----------------------------------------------------------------
"$go" test -c -o "$tmp/bridge.test" ./runtime/bridge
bench() { # bench BENCH-REGEXP COUNT
  (cd ./runtime/bridge && "$tmp/bridge.test" -test.run '^$' -test.bench "$1" -test.benchtime "$benchtime" \
    -test.count "$2" -test.benchmem) || { echo "bench-bridge: benchmark $1 failed" >&2; exit 1; }
}

# --- throughput -----------------------------------------------------------------
raw='^BenchmarkRawPipe$'
bridge='^BenchmarkBridgeThroughput$'
echo
echo "== throughput: $count rounds of one raw-pipe and one bridge run (order alternating), -benchtime $benchtime"
for ((r = 0; r < count; r++)); do
  if ((r % 2 == 0)); then order=("$raw" "$bridge"); else order=("$bridge" "$raw"); fi
  for b in "${order[@]}"; do
    bench "$b" 1 >> "$tmp/throughput.txt"
  done
done
grep '^Benchmark' "$tmp/throughput.txt"
metrics "$tmp/throughput.txt" > "$tmp/throughput.m"

# --- replay -------------------------------------------------------------------
echo
echo "== replay of a 1 MiB backlog (-count $count)"
bench '^BenchmarkReplay1MiB$' "$count" > "$tmp/replay.txt"
grep '^Benchmark' "$tmp/replay.txt" | awk '!seen[$1]++'
echo "   ..."
metrics "$tmp/replay.txt" > "$tmp/replay.m"

# --- summary ------------------------------------------------------------------
raw_mbs=$(metric "$tmp/throughput.m" BenchmarkRawPipe MB/s)
bridge_mbs=$(metric "$tmp/throughput.m" BenchmarkBridgeThroughput MB/s)
ratio=$(awk -v a="$bridge_mbs" -v b="$raw_mbs" 'BEGIN { printf "%.2f", a / b }')
# Per-round ratio: each bridge sample over the raw sample of its round.
paired=$(paste <(awk '$1 == "BenchmarkBridgeThroughput" && $2 == "MB/s" { print $3 }' "$tmp/throughput.m") \
               <(awk '$1 == "BenchmarkRawPipe" && $2 == "MB/s" { print $3 }' "$tmp/throughput.m") |
         awk '{ printf "%.4f\n", $1 / $2 }' | median)
verdict=$(awk -v v="$ratio" 'BEGIN { print (v >= 0.8 ? "MET" : "MISSED") }')

echo
echo "== summary (medians; load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "raw pipe:  $(awk -v v="$raw_mbs" 'BEGIN { printf "%.0f", v }') MB/s  (samples: $(samples "$tmp/throughput.m" BenchmarkRawPipe MB/s))"
echo "bridge:    $(awk -v v="$bridge_mbs" 'BEGIN { printf "%.0f", v }') MB/s  (samples: $(samples "$tmp/throughput.m" BenchmarkBridgeThroughput MB/s))"
echo "           $(awk -v v="$(metric "$tmp/throughput.m" BenchmarkBridgeThroughput records/op)" 'BEGIN { printf "%.0f", v }') records and $(awk -v v="$(metric "$tmp/throughput.m" BenchmarkBridgeThroughput B/op)" 'BEGIN { printf "%.1f", v / 1048576 }') MiB allocated per 64 MiB;"
echo "           largest spill file at an ack: $(awk -v v="$(metric "$tmp/throughput.m" BenchmarkBridgeThroughput spill-max-bytes)" 'BEGIN { printf "%.1f", v / 1048576 }') MiB (median over the runs)"
echo "ratio bridge/raw: $ratio (median of per-round ratios: $(awk -v v="$paired" 'BEGIN { printf "%.2f", v }')); target >= 0.8: $verdict"
echo "replay of a 1 MiB backlog, Stream from cursor 0 until the last record:"
for sub in mem/rec=32KiB mem/rec=512B spill/rec=32KiB spill/rec=512B; do
  name=BenchmarkReplay1MiB/$sub
  ns=$(metric "$tmp/replay.m" "$name" ns/op)
  printf '  %-16s %8.3f ms  (%6.0f MB/s; %4.0f records, %4.0f KiB of them in the spill file)\n' "$sub" \
    "$(awk -v v="$ns" 'BEGIN { print v / 1e6 }')" "$(metric "$tmp/replay.m" "$name" MB/s)" \
    "$(metric "$tmp/replay.m" "$name" records)" \
    "$(awk -v v="$(metric "$tmp/replay.m" "$name" spill-bytes)" 'BEGIN { print v / 1024 }')"
done
exit 0
