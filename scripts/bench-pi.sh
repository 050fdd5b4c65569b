#!/usr/bin/env bash
# make bench-pi: how much later the sandboxed Pi answers its first RPC than
# the same Pi on the host, and what the sandbox's share is spent on. Needs
# root, bin/runsc (make runsc) and the image (make image), like make e2e-pi.
# The benchmarks are in test/e2e/bench_test.go (its header says exactly what is
# timed); this script runs them and reduces them to medians.
#
#   1. Target: BenchmarkPiSandboxedFirstResponse (Launch -> get_state
#      response, the e2e scene: the image's /usr and /opt from its EROFS
#      files, the agent's jiti cache at /tmp/jiti, Pi from the image's
#      bundle) against BenchmarkPiStockHostFirstResponse (the same compiled
#      process, chrooted into the same image tree on the host, the same
#      jiti cache bind, running Pi's unbundled dist/cli.js as npm installs
#      it on a user's host: the stock Pi). Also BenchmarkPiHostFirstResponse,
#      the host running the image's bundle: sandboxed/host is gVisor's own
#      share. ROUNDS rounds, one sample of each per round, the order
#      rotating; each sample is its own process with one untimed start
#      first, which fills the jiti cache on every side (all warm, as a host
#      Pi keeps /tmp/jiti between starts). Ratio of the medians against the
#      stock host, target <= 1.5.
#   2. File access: the host start under strace up to the get_state
#      response (opens, failed lookups, stats, reads).
#   (3, an agent's first start with an emptied jiti cache, is gone: the
#      cache lives in the sandbox's /tmp, seeded from the image at every
#      start, so every start is an agent's first start.)
#   4. Wake (test/e2e/bench_wake_test.go): launcher.Wake of a hibernated warm Pi
#      (image digests, secrets, binds, network, runsc restore) -> response
#      to get_state, ROUNDS samples, against the stock host start and the
#      sandboxed cold start of section 1 (goal: <= 1.0 x the stock host start);
#      and the same wake as the daemon sees it (bench_wake_supervisor_test.go):
#      attach (which wakes it) -> write get_state -> its response, through
#      the supervisor and the holder.
#   5. A/B of the image: the sandboxed start on the image as built (A)
#      against a variant of it made here (B), ROUNDS rounds, the order
#      alternating: "stock", /usr/local/bin/pi a link to Pi's own
#      dist/cli.js (the stock Pi under gVisor); "v8-threads", the bundle's
#      #! line without the image's --single-threaded; "v8=FLAGS", node FLAGS
#      on it instead; "image=DIR", the image built in DIR (another commit's
#      make image, laid out as .image/), as it is. A
#      variant is a copy of .image/ under the temp dir with its own digest
#      and the EROFS files of the directories it changed rebuilt
#      (PI_BENCH_IMAGE, test/e2e/bench_test.go). VARIANTS (default "stock")
#      picks them.
#   7. The model route's cost on a turn (BenchmarkPiModelRoute, issue 24):
#      the warm sandboxed Pi's first token and streamed reply through the
#      route (key added, request rebuilt, TLS to the fake model) against
#      the direct connection (credential none, plain HTTP through the
#      egress filter), 10 turns each in one run.
#
# Exits 0 whether or not the target is met (it is a benchmark); the target
# is printed as MET or MISSED. Knobs (environment): ROUNDS (samples of every
# figure, default 5, at least 5 for the target), GO (default go), SKIP
# (space-separated section numbers to skip, e.g. "2 3"; skipping 1 leaves
# the ratios against it n/a), VARIANTS (section 5).
set -euo pipefail
cd "$(dirname "$0")/.."

go=${GO:-go}
rounds=${ROUNDS:-5}
skip=" ${SKIP:-} "

[[ $(id -u) == 0 ]] || { echo "bench-pi: needs root (runsc, mounts, namespaces)" >&2; exit 1; }
[[ -x bin/runsc ]] || { echo "bench-pi: bin/runsc missing; run make runsc" >&2; exit 1; }
[[ -f .image/image.json ]] || { echo "bench-pi: the Pi image is missing; run make image" >&2; exit 1; }
((rounds >= 5)) || echo "bench-pi: note: ROUNDS=$rounds; the target asks for a median of at least 5"

tmp=$(mktemp -d)
trap 'rm -rf --one-file-system "$tmp"' EXIT
ab_lines=()

# shellcheck source=scripts/benchlib.sh
. scripts/benchlib.sh
samples() { awk -v n="$2" -v u="$3" '$1 == n && $2 == u { printf "%.2f ", $3 / 1e9 }' "$1"; }
count() { awk -v n="$2" -v u="$3" '$1 == n && $2 == u' "$1" | wc -l; }
s() { awk -v ns="$1" 'BEGIN { if (ns == "NaN") print "n/a"; else printf "%.2f", ns / 1e9 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "NaN" || b == "NaN" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }
verdict() { awk -v v="$1" -v l="$2" 'BEGIN { if (v == "n/a") print "n/a"; else print (v <= l ? "MET" : "MISSED") }'; }
gain() { # gain NEW OLD -> "-0.52 s (-18%)"
  awk -v a="$1" -v b="$2" 'BEGIN { if (a == "NaN" || b == "NaN") print "n/a"; else printf "%+.2f s (%+.0f%%)", (a - b) / 1e9, (a - b) / b * 100 }'
}

echo "== machine: $(nproc) cores; kernel $(uname -r); $("$go" version | cut -d' ' -f3-); $(bin/runsc --version | head -1)"
echo "   image: $(sed -n 's/^  "version": "\(.*\)",$/\1/p' .image/image.json), $(sed -n 's/^  "entries": \(.*\),$/\1/p' .image/image.json) entries"
echo "   load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
if rev=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- ./runtime/launcher ./internal ./test/e2e ./policy/compiler ./policy/profiles 2>/dev/null || rev="$rev + uncommitted changes"
  echo "   code: $rev"
fi

"$go" test -c -o "$tmp/e2e.test" ./test/e2e
# bench OUT BENCH-REGEXP BENCHTIME [NAME=VALUE…]: one run of the test binary
# from e2e/, its output appended to OUT.
bench() {
  local out=$1 re=$2 bt=$3
  shift 3
  if ! (cd ./test/e2e && env "$@" "$tmp/e2e.test" -test.run '^$' -test.bench "$re" -test.benchtime "$bt" -test.timeout 30m) >>"$out" 2>&1; then
    echo "   a run failed ($re $*); its output:" >&2
    tail -n 20 "$out" >&2
  fi
}
sandboxed='^BenchmarkPiSandboxedFirstResponse$'
host='^BenchmarkPiHostFirstResponse$'
stock='^BenchmarkPiStockHostFirstResponse$'
# pair FILE [NAME=VALUE…]: ROUNDS rounds of one stock host, one host and
# one sandboxed sample, the order rotating.
pair() {
  local out=$1 r i
  shift
  local order=("$stock" "$host" "$sandboxed")
  for ((r = 0; r < rounds; r++)); do
    for ((i = 0; i < 3; i++)); do
      bench "$out" "${order[(r + i) % 3]}" 1x "$@"
    done
  done
  metrics "$out" >"$out.m"
}
H=BenchmarkPiHostFirstResponse
K=BenchmarkPiStockHostFirstResponse
S=BenchmarkPiSandboxedFirstResponse
# per_round FILE NUM DEN -> median of the per-round ratios NUM/DEN.
per_round() {
  paste <(awk -v n="$2" '$1 == n { print $3 }' "$1") <(awk -v n="$3" '$1 == n { print $3 }' "$1") |
    awk '{ printf "%.4f\n", $1 / $2 }' | median | awk '{ if ($1 == "NaN") print "n/a"; else printf "%.2f", $1 }'
}

# --- 1. the target -----------------------------------------------------------
stock_ns=NaN host_ns=NaN sbx_ns=NaN main_ratio=n/a
: >"$tmp/main.txt.m"
if [[ $skip != *" 1 "* ]]; then
echo
echo "== 1. first response: $rounds rounds of one stock host, one host (bundle) and one sandboxed start (order rotating)"
pair "$tmp/main.txt"
stock_ns=$(metric "$tmp/main.txt.m" $K first-response-ns)
host_ns=$(metric "$tmp/main.txt.m" $H first-response-ns)
sbx_ns=$(metric "$tmp/main.txt.m" $S first-response-ns)
main_ratio=$(ratio "$sbx_ns" "$stock_ns")
echo "   stock host s: $(samples "$tmp/main.txt.m" $K first-response-ns)"
echo "   host s:       $(samples "$tmp/main.txt.m" $H first-response-ns)"
echo "   sandboxed s:  $(samples "$tmp/main.txt.m" $S first-response-ns)"
echo "   CPU s (stock host / host / sandboxed): $(samples "$tmp/main.txt.m" $K cpu-ns)/ $(samples "$tmp/main.txt.m" $H cpu-ns)/ $(samples "$tmp/main.txt.m" $S cpu-ns)"
fi

# --- 2. file access ------------------------------------------------------------
if [[ $skip != *" 2 "* ]]; then
  echo
  echo "== 2. file access of one start, up to the get_state response"
  bench "$tmp/strace.txt" "$host" 1x PI_BENCH_WARMUP=0 PI_BENCH_STRACE="$tmp/trace"
  [[ -s $tmp/trace ]] || echo "   no trace (is strace installed?)"
  [[ -s $tmp/trace ]] && awk '
    /write\(1, "\{\\"id\\":\\"req_1\\",\\"type\\":\\"response\\"/ { stop = 1 }
    stop { next }
    { pid = $1; line = $0; sub(/^[0-9]+ +/, "", line) }
    line ~ /^<\.\.\. / {
      # The end of a call another thread interrupted: its result.
      sc = line; sub(/^<\.\.\. /, "", sc); sub(/ resumed.*/, "", sc)
      if (line ~ /= -1 ENOENT/) enoent[sc]++
      else if (sc == "openat" && (pid in pending)) opened[pending[pid]] = 1
      delete pending[pid]
      next
    }
    {
      sc = line; sub(/\(.*/, "", sc); calls[sc]++
      n = split(line, q, "\""); path = n >= 2 ? q[2] : ""
      if (line ~ /<unfinished/) { if (sc == "openat") pending[pid] = path; next }
      if (line ~ /= -1 ENOENT/) enoent[sc]++
      if ((sc == "openat" || sc == "open") && line !~ /= -1 /) opened[path] = 1
      if (sc == "statx" || sc == "newfstatat") statted[path] = 1
    }
    END {
      for (p in opened) { files++; if (p ~ /^\/opt\/pi\//) pi++; if (p ~ /^\/tmp\//) tmpf++ }
      for (p in statted) st++
      printf "   host (strace -f): openat %d (%d ENOENT), distinct files opened %d (%d under /opt/pi, %d under /tmp: jiti cache),\n", calls["openat"], enoent["openat"], files, pi, tmpf
      printf "     statx %d (%d ENOENT) on %d distinct paths, newfstatat %d, access %d, readlink %d, read %d, pread64 %d, mmap %d\n", calls["statx"], enoent["statx"], st, calls["newfstatat"], calls["access"], calls["readlink"], calls["read"], calls["pread64"], calls["mmap"]
    }' "$tmp/trace"
  true
fi

# --- 4. wake -------------------------------------------------------------------------
if [[ $skip != *" 4 "* ]]; then
  echo
  echo "== 4. wake of a hibernated warm Pi (launcher.Wake) -> get_state response: $rounds samples"
  for ((r = 0; r < rounds; r++)); do
    bench "$tmp/wake.txt" '^BenchmarkPiWakeFirstResponse$' 1x
    bench "$tmp/wake.txt" '^BenchmarkPiWakeThroughSupervisor$' 1x
  done
  metrics "$tmp/wake.txt" >"$tmp/wake.m"
  { grep -h 'checkpoint of a warm Pi' "$tmp/wake.txt" || true; } | head -1 | sed 's/^ */   /'
  echo "   wake s: $(samples "$tmp/wake.m" BenchmarkPiWakeFirstResponse first-response-ns)"
  echo "   through the supervisor (attach -> first reply) s: $(samples "$tmp/wake.m" BenchmarkPiWakeThroughSupervisor first-response-ns)"
fi

# --- 5. A/B of image variants ---------------------------------------------------------
# variant NAME DIRS FN: a copy of the image at $tmp/img-NAME, FN applied to
# its rootfs (FN ROOTFS), the EROFS files of DIRS (of /usr, /opt) rebuilt as
# image/build.sh writes them and the others linked, image.json rewritten.
variant() {
  local name=$1 dirs=$2 fn=$3 d=$tmp/img-$1 dir sum old digest
  mkdir -p "$d/erofs"
  cp -a .image/rootfs "$d/rootfs"
  "$fn" "$d/rootfs"
  digest=$(image/digest.sh "$d/rootfs")
  sed -e "s|^  \"digest\": \"sha256:[0-9a-f]*\",\$|  \"digest\": \"$digest\",|" -e "s|^  \"rootfs\": \"[^\"]*\",|  \"rootfs\": \"$d/rootfs\",|" .image/image.json >"$d/image.json"
  for dir in usr opt; do
    if [[ " $dirs " == *" $dir "* ]]; then
      mkfs.erofs --quiet -E noinline_data -T "$(sed -n 's/^  "epoch": \([0-9]*\),$/\1/p' .image/image.json)" -x -1 "$d/erofs/$dir.erofs" "$d/rootfs/$dir" >&2
      chmod 0444 "$d/erofs/$dir.erofs"
    else
      ln .image/erofs/$dir.erofs "$d/erofs/$dir.erofs"
    fi
    sum=sha256:$(sha256sum "$d/erofs/$dir.erofs" | cut -d' ' -f1)
    old=$(grep -o "\"dir\": \"/$dir\", \"file\": \"[^\"]*\", \"digest\": \"[^\"]*\"" "$d/image.json")
    sed -i "s|$old|\"dir\": \"/$dir\", \"file\": \"$d/erofs/$dir.erofs\", \"digest\": \"$sum\"|" "$d/image.json"
  done
}
# stock: pi links to Pi's own entry, unbundled, as npm links a package's
# bin (its #! line is /usr/bin/env node).
variant_stock() {
  ln -sfn /opt/pi/node_modules/@earendil-works/pi-coding-agent/dist/cli.js "$1/usr/local/bin/pi"
}
# v8-threads: the bundle's #! line without the image's --single-threaded
# (V8's worker threads back); v8=FLAGS: the #! line "node FLAGS" instead.
variant_hashbang() {
  local b=$1/opt/pi/node_modules/@earendil-works/pi-coding-agent/dist/pi.bundle.js
  [[ $(head -n 1 "$b") == "#!/usr/local/bin/node --single-threaded" ]] || { echo "bench-pi: the bundle's #! line is not the image's" >&2; return 1; }
  sed -i "1s|.*|#!/usr/local/bin/node${2:+ $2}|" "$b"
}
variant_threads() { variant_hashbang "$1" ""; }
variant_v8() { variant_hashbang "$1" "$v8flags"; }
variants=${VARIANTS-stock}
if [[ $skip != *" 5 "* && -n $variants ]]; then
  echo
  echo "== 5. A/B of the image: the sandboxed start on the image (A) and on a variant (B), $rounds rounds, order alternating"
  chmod 0755 "$tmp"
  for v in $variants; do
    case $v in
    stock) variant stock usr variant_stock ;;
    v8-threads) variant "$v" opt variant_threads ;;
    v8=*) v8flags=${v#v8=} variant "${v//[^A-Za-z0-9._-]/_}" opt variant_v8 ;;
    image=*) ;;
    *) echo "   unknown variant $v" >&2; continue ;;
    esac
    img=$tmp/img-${v//[^A-Za-z0-9._-]/_}
    [[ $v != image=* ]] || img=${v#image=}
    k=${v//[^A-Za-z0-9._-]/_} # the variant's name in file names
    for ((r = 0; r < rounds; r++)); do
      if ((r % 2 == 0)); then
        bench "$tmp/ab-$k-A.txt" "$sandboxed" 1x
        bench "$tmp/ab-$k-B.txt" "$sandboxed" 1x PI_BENCH_IMAGE="$img"
      else
        bench "$tmp/ab-$k-B.txt" "$sandboxed" 1x PI_BENCH_IMAGE="$img"
        bench "$tmp/ab-$k-A.txt" "$sandboxed" 1x
      fi
    done
    metrics "$tmp/ab-$k-A.txt" >"$tmp/ab-$k-A.m"
    metrics "$tmp/ab-$k-B.txt" >"$tmp/ab-$k-B.m"
    a=$(metric "$tmp/ab-$k-A.m" $S first-response-ns)
    b=$(metric "$tmp/ab-$k-B.m" $S first-response-ns)
    pr=$(paste <(awk -v n=$S '$1 == n { print $3 }' "$tmp/ab-$k-B.m") <(awk -v n=$S '$1 == n { print $3 }' "$tmp/ab-$k-A.m") |
      awk '{ printf "%.4f\n", $1 / $2 }' | median | awk '{ if ($1 == "NaN") print "n/a"; else printf "%.2f", $1 }')
    echo "   $v: A (image) s: $(samples "$tmp/ab-$k-A.m" $S first-response-ns)"
    echo "   $v: B (variant) s: $(samples "$tmp/ab-$k-B.m" $S first-response-ns)"
    ac=$(metric "$tmp/ab-$k-A.m" $S cpu-ns)
    bc=$(metric "$tmp/ab-$k-B.m" $S cpu-ns)
    ab_lines+=("A/B $v: sandboxed start: image $(s "$a") s, variant $(s "$b") s, variant/image $(ratio "$b" "$a") (per round $pr); CPU image $(s "$ac") s, variant $(s "$bc") s, variant/image $(ratio "$bc" "$ac")")
    # The same for a wake of a hibernated warm Pi (section 4's benchmark).
    for ((r = 0; r < rounds; r++)); do
      if ((r % 2 == 0)); then
        bench "$tmp/abw-$k-A.txt" '^BenchmarkPiWakeFirstResponse$' 1x
        bench "$tmp/abw-$k-B.txt" '^BenchmarkPiWakeFirstResponse$' 1x PI_BENCH_IMAGE="$img"
      else
        bench "$tmp/abw-$k-B.txt" '^BenchmarkPiWakeFirstResponse$' 1x PI_BENCH_IMAGE="$img"
        bench "$tmp/abw-$k-A.txt" '^BenchmarkPiWakeFirstResponse$' 1x
      fi
    done
    W=BenchmarkPiWakeFirstResponse
    metrics "$tmp/abw-$k-A.txt" >"$tmp/abw-$k-A.m"
    metrics "$tmp/abw-$k-B.txt" >"$tmp/abw-$k-B.m"
    a=$(metric "$tmp/abw-$k-A.m" $W first-response-ns)
    b=$(metric "$tmp/abw-$k-B.m" $W first-response-ns)
    echo "   $v: wake A (image) s: $(samples "$tmp/abw-$k-A.m" $W first-response-ns)"
    echo "   $v: wake B (variant) s: $(samples "$tmp/abw-$k-B.m" $W first-response-ns)"
    { grep -h 'checkpoint of a warm Pi' "$tmp/abw-$k-A.txt" | head -1 | sed 's/^ */   A: /'; grep -h 'checkpoint of a warm Pi' "$tmp/abw-$k-B.txt" | head -1 | sed 's/^ */   B: /'; } || true
    ab_lines+=("A/B $v: wake: image $(s "$a") s, variant $(s "$b") s, variant/image $(ratio "$b" "$a")")
  done
fi

# --- 7. the model route's cost on a turn (issue 24) ------------------------------------
if [[ $skip != *" 7 "* ]]; then
  echo
  echo "== 7. a turn through the model route against the direct connection (BenchmarkPiModelRoute): 10 turns each, one run"
  bench "$tmp/route.txt" '^BenchmarkPiModelRoute$' 10x
  metrics "$tmp/route.txt" >"$tmp/route.m"
  for v in route direct; do
    ft=$(awk -v n="BenchmarkPiModelRoute/$v" '$1 == n && $2 == "first-token-ms" { print $3 }' "$tmp/route.m")
    rp=$(awk -v n="BenchmarkPiModelRoute/$v" '$1 == n && $2 == "reply-ms" { print $3 }' "$tmp/route.m")
    echo "   $v: first token ${ft:-n/a} ms, streamed reply ${rp:-n/a} ms (medians)"
    ab_lines+=("model route ($v): first token ${ft:-n/a} ms, streamed reply ${rp:-n/a} ms")
  done
fi

# --- summary -----------------------------------------------------------------------
echo
echo "== summary (medians; load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
echo "stock host start -> first response: $(s "$stock_ns") s ($(count "$tmp/main.txt.m" $K first-response-ns) samples)"
echo "host (bundle) start -> first response: $(s "$host_ns") s ($(count "$tmp/main.txt.m" $H first-response-ns) samples)"
echo "sandboxed start -> first response: $(s "$sbx_ns") s ($(count "$tmp/main.txt.m" $S first-response-ns) samples)"
echo "ratio sandboxed/stock-host: $main_ratio (median of per-round ratios: $(per_round "$tmp/main.txt.m" $S $K)); target <= 1.5: $(verdict "$main_ratio" 1.5)"
echo "ratio sandboxed/host (the same bundle on both; gVisor's own share): $(ratio "$sbx_ns" "$host_ns") (per round: $(per_round "$tmp/main.txt.m" $S $H))"
echo "ratio host (bundle)/stock-host: $(ratio "$host_ns" "$stock_ns") (per round: $(per_round "$tmp/main.txt.m" $H $K))"
# CPU time by the response (the sandbox's cgroup; the host Pi's process):
# what other work on the machine moves least, so the figure to read when
# the load average is far from quiet.
kc=$(metric "$tmp/main.txt.m" $K cpu-ns) hc=$(metric "$tmp/main.txt.m" $H cpu-ns) sc=$(metric "$tmp/main.txt.m" $S cpu-ns)
echo "CPU by the response: stock host $(s "$kc") s, host (bundle) $(s "$hc") s, sandboxed $(s "$sc") s; sandboxed/stock-host $(ratio "$sc" "$kc"), sandboxed/host $(ratio "$sc" "$hc")"
if [[ $skip != *" 4 "* ]]; then
  wk=$(metric "$tmp/wake.m" BenchmarkPiWakeFirstResponse first-response-ns)
  wr=$(ratio "$wk" "$stock_ns")
  echo "wake -> first response: $(s "$wk") s; vs stock host start: $wr (goal <= 1.0: $(verdict "$wr" 1.0)); vs sandboxed cold start: $(ratio "$wk" "$sbx_ns")"
  ws=$(metric "$tmp/wake.m" BenchmarkPiWakeThroughSupervisor first-response-ns)
  echo "wake through the supervisor (attach -> first reply): $(s "$ws") s; vs stock host start: $(ratio "$ws" "$stock_ns"); vs launcher.Wake alone: $(ratio "$ws" "$wk")"
fi
for l in "${ab_lines[@]}"; do echo "$l"; done
exit 0
