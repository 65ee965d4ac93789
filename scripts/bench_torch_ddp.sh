#!/usr/bin/env bash
# A DDP step of a small model over the torch.distributed backend "tessera"
# against the same over gloo, one host, interleaved in the same minutes
# (README.md, "Use tessera's collectives from PyTorch").
#
#   scripts/bench_torch_ddp.sh [-n REPS] [-r RANKS] [--width W] [--steps S] [--bind 1|0]
#
# Each rep runs integrations/torch/example_ddp.py --bench with gloo, then
# with tessera (the order alternates between reps), RANKS local ranks
# (default 2), and prints rank 0's mean step time with the load average,
# then the medians. Needs the module: cmake --build build --target tessera_torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPS=5
RANKS=2
WIDTH=256
STEPS=30
BIND=1
while [ $# -gt 0 ]; do
  case "$1" in
    -n) REPS="$2"; shift 2 ;;
    -r) RANKS="$2"; shift 2 ;;
    --width) WIDTH="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    --bind) BIND="$2"; shift 2 ;;
    *) sed -n '5p' "$0" | sed 's/^#  //' >&2; exit 2 ;;
  esac
done
PY="${TESSERA_TORCH_PYTHON:-/usr/bin/python3}"
export PYTHONPATH="$ROOT/build/python${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import tessera_torch' 2>/dev/null || {
  echo "tessera_torch is not importable with $PY (build it: cmake --build build --target tessera_torch)" >&2
  exit 2
}
RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT
for rep in $(seq 1 "$REPS"); do
  order="gloo tessera"
  [ $((rep % 2)) -eq 0 ] && order="tessera gloo"
  for b in $order; do
    l=$(cut -d' ' -f1 /proc/loadavg)
    line=$("$PY" "$ROOT/integrations/torch/example_ddp.py" --nproc "$RANKS" --backend "$b" --bench \
      --width "$WIDTH" --steps "$STEPS" --warmup 5 --bind "$BIND" | grep "step ")
    ms=$(echo "$line" | sed -n 's/.*step \([0-9.]*\) ms.*/\1/p')
    echo "$b $ms $l" >>"$RAW"
    echo "run $rep (load $l): $line"
  done
done
"$PY" - "$RAW" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
loads = [float(r[2]) for r in rows]
med = {b: statistics.median(float(r[1]) for r in rows if r[0] == b) for b in ("gloo", "tessera")}
print("load average %.1f-%.1f; median DDP step: gloo %.3f ms, tessera %.3f ms (tessera/gloo %.2f)" % (
    min(loads), max(loads), med["gloo"], med["tessera"], med["tessera"] / med["gloo"]))
PY
