# Shared by the bench-*.sh scripts (sourced): reduce `go test -bench`
# output to medians. Plain awk and sort, no other tools.

# median: one number per line on stdin -> the median (mean of the middle
# two for an even count), NaN when there is none.
median() {
  sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "NaN"; exit }
    if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# metrics FILE... -> "name unit value" for every metric of every benchmark
# line; the GOMAXPROCS suffix and the #NN of repeated sub-benchmarks dropped.
# A benchmark whose run writes to stdout (a launch's log lines) has its
# name followed by that output, and its figures on a later line that
# starts with the iteration count: those are paired too.
metrics() {
  awk 'function norm(n) { sub(/-[0-9]+$/, "", n); sub(/#[0-9]+$/, "", n); return n }
  /^Benchmark/ && $2 !~ /^[0-9]+$/ { pending = norm($1); next }
  /^Benchmark/ {
    name = norm($1); pending = ""
    for (i = 3; i < NF; i += 2) print name, $(i + 1), $i
    next
  }
  pending != "" && /^[ \t]*[0-9]+[ \t]+[0-9.]+ ns\/op/ {
    for (i = 2; i < NF; i += 2) print pending, $(i + 1), $i
    pending = ""
  }' "$@"
}
# metric FILE NAME UNIT -> median over every sample.
metric() {
  awk -v n="$2" -v u="$3" '$1 == n && $2 == u { print $3 }' "$1" | median
}
