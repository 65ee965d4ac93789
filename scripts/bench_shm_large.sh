#!/usr/bin/env bash
# Large shared-memory all-reduce against memcpy measured in the same run
# (docs/algorithms.md, "shm direct, large messages").
#
#   scripts/bench_shm_large.sh [-n REPS] [--bin TESSERA] [--base TESSERA] [--cases "2:64M 8:2M"] [--iters N]
#
# Each rep runs, for each case RANKS:SIZE, `tessera bench all_reduce -r RANKS
# --transport shm -b SIZE -e SIZE --baseline` with --bin and (given) --base,
# in turn, the order reversed every other rep. --baseline times a one-core
# memcpy of the same size in the same process right after the collective
# (pre-faulted buffers), so each run's busbw / memcpy ratio is taken in the
# same minute, and a memcpy made by every rank at once (per rank: what the
# memory system and the cores give each rank when all copy together; an
# all-reduce whose ranks each move a memcpy's worth of bytes at that rate
# has the busbw printed as "at the all-ranks rate").
# Prints every run (with the load average) and per case and binary the
# medians of busbw (out of place, in place), both memcpys and the ratios
# (targets: 2 ranks at 64 MiB >= 0.85, 8 ranks at 2 MiB >= 0.65 of the
# one-core memcpy).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/build/bin/tessera"
BASE=""
REPS=5
CASES="2:64M 8:2M"
ITERS=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) REPS="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --base) BASE="$2"; shift 2 ;;
    --cases) CASES="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    *) sed -n '5p' "$0" | sed 's/^#  //' >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "no tessera binary at $BIN" >&2; exit 2; }
[ -z "$BASE" ] || [ -x "$BASE" ] || { echo "--base $BASE is not an executable" >&2; exit 2; }
export OPENBLAS_NUM_THREADS=1
RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(nproc --all) CPUs"
# One run: prints "busbw_oop busbw_ip memcpy memcpy_all" (GB/s).
one() {
  local bin=$1 ranks=$2 size=$3 n
  # About a second of calls: 64 MiB at ~10 ms a call, 2 MiB at ~1 ms.
  n=${ITERS:-$(python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; b=int(s[:-1])*m[s[-1]] if s[-1] in m else int(s); print(max(10, min(2000, (256<<20)//b)))" "$size")}
  "$bin" bench all_reduce -r "$ranks" --transport shm -b "$size" -e "$size" -n "$n" -w 3 -c 0 --baseline 2>&1 |
    awk '$2 ~ /^[0-9]+$/ && $1 ~ /^[0-9]+$/ { oop = $7; ip = $11 } /memcpy baseline \(1 core/ { mc = $(NF-1) } /memcpy baseline \(all/ { ma = $(NF-3) } END { print oop, ip, mc, ma }'
}
for rep in $(seq 1 "$REPS"); do
  for cs in $CASES; do
    ranks=${cs%%:*}; size=${cs##*:}
    bins=(new); [ -z "$BASE" ] || bins+=(base)
    [ $((rep % 2)) -eq 1 ] || [ ${#bins[@]} -eq 1 ] || bins=(base new)
    for b in "${bins[@]}"; do
      l=$(cut -d' ' -f1 /proc/loadavg)
      exe=$BIN; [ "$b" = new ] || exe=$BASE
      echo "$rep $cs $b $(one "$exe" "$ranks" "$size") $l" | tee -a "$RAW" | sed 's/^/run: /'
    done
  done
done
echo "# medians over $REPS reps (busbw GB/s; memcpy: one core, the same run)"
python3 - "$RAW" <<'PY'
import collections, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = statistics.median
by = collections.defaultdict(list); loads = []
bad = [r for r in rows if len(r) != 8]
for r in bad: print("a run gave no figures (its exit or output was wrong): rep %s %s %s" % tuple(r[:3]))
rows = [r for r in rows if len(r) == 8]
for rep, cs, b, oop, ip, mc, ma, l in rows:
    by[(cs, b)].append((float(oop), float(ip), float(mc), float(ma))); loads.append(float(l))
print("load average during the runs: %.1f-%.1f (median %.1f)" % (min(loads), max(loads), med(loads)))
for (cs, b), xs in sorted(by.items()):
    o = [x[0] for x in xs]; i = [x[1] for x in xs]; m = [x[2] for x in xs]
    print("%-8s %-5s busbw oop %5.2f ip %5.2f memcpy %5.2f  oop/memcpy %.2f (runs %s)  ip/memcpy %.2f (runs %s)" % (
        cs, b, med(o), med(i), med(m), med([x[0] / x[2] for x in xs]),
        " ".join("%.2f" % (x[0] / x[2]) for x in xs), med([x[1] / x[2] for x in xs]),
        " ".join("%.2f" % (x[1] / x[2]) for x in xs)))
    # Each rank of the direct all-reduce reads and writes n bytes, a memcpy's
    # worth, while busbw counts 2(p-1)/p n: moved at the rate of the memcpy
    # every rank makes at once, that factor times its per-rank figure.
    # Streaming stores and writes to lines already in cache can beat it.
    p = int(cs.split(":")[0]); f = 2.0 * (p - 1) / p
    print("%-8s %-5s memcpy by all ranks at once %5.2f GB/s a rank, busbw at that rate %5.2f: oop/that %.2f  ip/that %.2f" % (
        cs, b, med([x[3] for x in xs]), f * med([x[3] for x in xs]), med([x[0] / (f * x[3]) for x in xs]),
        med([x[1] / (f * x[3]) for x in xs])))
PY
