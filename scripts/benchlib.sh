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
metrics() {
  awk '/^Benchmark/ {
    name = $1; sub(/-[0-9]+$/, "", name); sub(/#[0-9]+$/, "", name)
    for (i = 3; i < NF; i += 2) print name, $(i + 1), $i
  }' "$@"
}
# metric FILE NAME UNIT -> median over every sample.
metric() {
  awk -v n="$2" -v u="$3" '$1 == n && $2 == u { print $3 }' "$1" | median
}
