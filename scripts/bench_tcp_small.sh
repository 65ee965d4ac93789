#!/usr/bin/env bash
# Small TCP messages: tessera's 8-byte all-reduce and sendrecv at 2 ranks
# over loopback TCP next to OpenMPI's `--mca btl self,tcp`, measured in
# turn (docs/bench.md, "TCP transport").
#
#   scripts/bench_tcp_small.sh [-n REPS] [-i ITERS] [--bin TESSERA] [--base TESSERA] [--spin "0 20"] [--ops "all_reduce sendrecv"]
#
# Each rep runs, back to back for each op: OpenMPI (`mpirun -np 2
# tessera_mpi_peer`, OMPI_MCA_btl=self,tcp: its best settings for 2 ranks on
# 2 CPUs, no --oversubscribe, default binding), then `tessera bench OP -r 2
# --transport tcp` (callers read), then with every receive forced through
# the reading thread (TESSERA_TCP_READER_THREAD=1, the path before), then
# --base's binary (another build, e.g. main's), then each polling window of
# --spin (TESSERA_TCP_SPIN_US). The order of the runs within a rep is
# reversed every other rep (A B, B A), so a drift of the machine's speed
# hits both alike. Prints one line per run (with the load average), then per
# mode the median time, the ratio of medians to MPI and the median of the
# per-rep ratios (each run against the MPI run of its own rep: the figure
# that holds on a noisy machine; target <= 1.5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/build/bin/tessera"
BASE=""
REPS=5
ITERS=3000
SPINS=""
OPS="all_reduce sendrecv"
while [ $# -gt 0 ]; do
  case "$1" in
    -n) REPS="$2"; shift 2 ;;
    -i) ITERS="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --base) BASE="$2"; shift 2 ;;
    --spin) SPINS="$2"; shift 2 ;;
    --ops) OPS="$2"; shift 2 ;;
    *) sed -n '6p' "$0" | sed 's/^#  //' >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "no tessera binary at $BIN (cmake --build build --target tessera tessera_mpi_peer)" >&2; exit 2; }
PEER="$(dirname "$BIN")/tessera_mpi_peer"
[ -x "$PEER" ] || { echo "no tessera_mpi_peer next to $BIN" >&2; exit 2; }
[ -z "$BASE" ] || [ -x "$BASE" ] || { echo "--base $BASE is not an executable" >&2; exit 2; }
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
RAW=$(mktemp)
OUT=$(mktemp)
trap 'rm -f "$RAW" "$OUT"' EXIT
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(nproc --all) CPUs"
# tessera's 8-byte row: the time (us) out of place is column 5.
tess() { "$@" 2>&1 | awk '$1 == 8 && $2 ~ /^[0-9]+$/ { print $5; exit }'; }
# tessera_mpi_peer writes `COUNT TIME_US ...` (2 f32 elements = 8 bytes).
mpi() {
  OMPI_MCA_btl=self,tcp mpirun -np 2 "$PEER" --out "$OUT" "$1" f32 sum 0 "$ITERS" 200 2 >/dev/null 2>&1 || true
  awk '$1 == 2 { print $2 }' "$OUT"
}
load() { cut -d' ' -f1 /proc/loadavg; }
for rep in $(seq 1 "$REPS"); do
  for op in $OPS; do
    args=(bench "$op" -r 2 --transport tcp -b 8 -e 8 -n "$ITERS" -w 200)
    modes=(mpi caller thread)
    [ -z "$BASE" ] || modes+=(base)
    for s in $SPINS; do modes+=("spin$s"); done
    if [ $((rep % 2)) -eq 0 ]; then
      rev=(); for ((k = ${#modes[@]} - 1; k >= 0; k--)); do rev+=("${modes[k]}"); done; modes=("${rev[@]}")
    fi
    for mode in "${modes[@]}"; do
      l=$(load)
      case "$mode" in
        mpi) t=$(mpi "$op") ;;
        caller) t=$(tess "$BIN" "${args[@]}") ;;
        thread) t=$(TESSERA_TCP_READER_THREAD=1 tess "$BIN" "${args[@]}") ;;
        base) t=$(tess "$BASE" "${args[@]}") ;;
        spin*) t=$(TESSERA_TCP_SPIN_US=${mode#spin} tess "$BIN" "${args[@]}") ;;
      esac
      echo "$rep $op $mode ${t:-nan} $l" | tee -a "$RAW" | sed 's/^/run: /'
    done
  done
done
echo "# medians over $REPS reps (us per call; MPI = mpirun --mca btl self,tcp, in turn with the others)"
python3 - "$RAW" <<'PY'
import collections, math, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
t = collections.defaultdict(dict); loads = []
for rep, op, mode, us, l in rows:
    t[(op, mode)][rep] = float(us); loads.append(float(l))
print("load average during the runs: %.1f-%.1f (median %.1f)" % (min(loads), max(loads), med(loads)))
for (op, mode), by_rep in sorted(t.items()):
    xs = [x for x in by_rep.values() if not math.isnan(x)]
    m = t.get((op, "mpi"), {})
    pair = [by_rep[r] / m[r] for r in by_rep if r in m and m[r] > 0 and not math.isnan(by_rep[r])]
    print("%-10s %-8s %8.2f us  ratio of medians %.2f  median ratio per rep %.2f  (runs: %s)" % (
        op, mode, med(xs), med(xs) / med([v for v in m.values() if not math.isnan(v)] or [float("nan")]),
        med(pair), " ".join("%.1f" % x for x in xs)))
PY
