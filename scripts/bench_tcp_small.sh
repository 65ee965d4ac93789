#!/usr/bin/env bash
# Small TCP messages: tessera's 8-byte all-reduce and sendrecv at 2 ranks
# over loopback TCP next to OpenMPI's `--mca btl self,tcp`, measured in the
# same minutes (docs/bench.md, "TCP transport").
#
#   scripts/bench_tcp_small.sh [-n REPS] [-i ITERS] [--bin TESSERA] [--spin "0 20"]
#
# Each rep runs, back to back for each op: `tessera bench OP -r 2
# --transport tcp --compare mpi` with OMPI_MCA_btl=self,tcp for MPI's
# figure (its best settings for 2 ranks on 2 CPUs: no --oversubscribe,
# default binding), then `tessera bench OP -r 2 --transport tcp` (callers
# read), then with every receive forced through the reading thread
# (TESSERA_TCP_READER_THREAD=1, the path before), then each polling window
# of --spin (TESSERA_TCP_SPIN_US). Prints one line per run (with the load
# average) and the medians; the ratio is tessera / MPI time (target <= 1.5).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/build/bin/tessera"
REPS=5
ITERS=3000
SPINS=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) REPS="$2"; shift 2 ;;
    -i) ITERS="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --spin) SPINS="$2"; shift 2 ;;
    *) sed -n '5p' "$0" | sed 's/^#  //' >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "no tessera binary at $BIN (cmake --build build --target tessera tessera_mpi_peer)" >&2; exit 2; }
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT
# The 8-byte row: time (us) out of place is column 5; with --compare mpi the
# MPI time is the third column from the end.
row() { "$@" 2>&1 | awk '$1 == 8 && $2 ~ /^[0-9]+$/ { print; exit }'; }
load() { cut -d' ' -f1 /proc/loadavg; }
for rep in $(seq 1 "$REPS"); do
  for op in all_reduce sendrecv; do
    args=(bench "$op" -r 2 --transport tcp -b 8 -e 8 -n "$ITERS" -w 200)
    # MPI's figure from a --compare run; every tessera figure from a plain
    # run (a --compare run's own tessera ranks measured 2-3x slower here).
    l=$(load)
    m=$(OMPI_MCA_btl=self,tcp row "$BIN" "${args[@]}" --compare mpi | awk '{print $(NF-2)}')
    l=$(load)
    t=$(row "$BIN" "${args[@]}" | awk '{print $5}')
    echo "$rep $op caller $t $m $l" >>"$RAW"
    l=$(load)
    t=$(TESSERA_TCP_READER_THREAD=1 row "$BIN" "${args[@]}" | awk '{print $5}')
    echo "$rep $op thread $t - $l" >>"$RAW"
    for s in $SPINS; do
      l=$(load)
      t=$(TESSERA_TCP_SPIN_US=$s row "$BIN" "${args[@]}" | awk '{print $5}')
      echo "$rep $op spin$s $t - $l" >>"$RAW"
    done
    tail -n $((2 + $(echo $SPINS | wc -w))) "$RAW" | sed 's/^/run: /'
  done
done
echo "# medians over $REPS runs (us per call; MPI = mpirun --mca btl self,tcp, the same minutes)"
python3 - "$RAW" <<'PY'
import statistics, sys, collections
rows = [l.split() for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
mpi = collections.defaultdict(list); t = collections.defaultdict(list); loads = []
for rep, op, mode, us, m, l in rows:
    t[(op, mode)].append(float(us)); loads.append(float(l))
    if m != "-": mpi[op].append(float(m))
print("load average during the runs: %.1f-%.1f (median %.1f)" % (min(loads), max(loads), med(loads)))
for (op, mode), xs in sorted(t.items()):
    print("%-10s %-8s tessera %7.2f us  MPI %7.2f us  ratio %.2f  (runs: %s)" % (
        op, mode, med(xs), med(mpi[op]), med(xs) / med(mpi[op]), " ".join("%.1f" % x for x in xs)))
PY
