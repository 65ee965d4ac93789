#!/usr/bin/env bash
# The latency/bandwidth curve of tessera's collectives next to OpenMPI's,
# measured in the same minutes (docs/bench.md, "The sweep").
#
#   scripts/bench_sweep.sh [-o DIR] [-r "2 4 8"] [-p "all_reduce ..."] [-n REPS] [--crossovers] [--bin TESSERA] [--base TESSERA] [--report]
#
# For every op x ranks x size (8 B, 32 B, ... 32 MiB and 64 MiB) it runs
# `tessera bench OP -r N --compare mpi` REPS times (default 3); every run
# measures OpenMPI first (tessera_mpi_peer at its best settings), then
# tessera. --base runs another build of tessera (e.g. main's) right after
# each, so a change is compared with what it replaces in the same minutes.
# --report only summarises DIR/raw.csv of an earlier (or interrupted) sweep.
# DIR (default sweep-out/) gets:
#   raw.csv    every run: rep,op,ranks,size_bytes,tessera_us,mpi_us,algorithm,mpi_setting,load1,base_us
#   sweep.csv  medians:   op,ranks,size_bytes,tessera_us,mpi_us,mpi_over_tessera,algorithm,runs,load1_median,base_us
#   sweep.png  time vs size per op (gnuplot), or sweep.txt when gnuplot is missing
# --crossovers instead times every algorithm that can serve each op (forced
# with --algo) from 256 B to 256 KiB and writes crossovers.csv (medians) and
# prints, per op, ranks and size, the fastest algorithm and the default's.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT=sweep-out
RANKS="2 4 8"
OPS="all_reduce all_gather reduce_scatter broadcast"
REPS=3
CROSS=0
BIN="$ROOT/build/bin/tessera"
BASE=""
REPORT=0
usage() {
  sed -n '5p' "$0" | sed 's/^#  //' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    -o) OUT="$2"; shift 2 ;;
    -r) RANKS="$2"; shift 2 ;;
    -p) OPS="$2"; shift 2 ;;
    -n) REPS="$2"; shift 2 ;;
    --crossovers) CROSS=1; shift ;;
    --bin) BIN="$2"; shift 2 ;;
    --base) BASE="$2"; shift 2 ;;
    --report) REPORT=1; shift ;;
    *) usage ;;
  esac
done
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || usage
[ -x "$BIN" ] || { echo "bench_sweep: $BIN is not built (cmake --build build --target tessera)" >&2; exit 2; }
[ -z "$BASE" ] || [ -x "$BASE" ] || { echo "bench_sweep: --base $BASE is not an executable" >&2; exit 2; }
command -v jq >/dev/null || { echo "bench_sweep: needs jq (scripts/install-deps.sh)" >&2; exit 2; }
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export OPENBLAS_NUM_THREADS=1
mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Size bands, each with enough calls to time it: "minbytes maxbytes factor iters warmup"
# (8 B, 32 B, ... 32 MiB, and 64 MiB).
BANDS=("8 32K 4 5000 500" "128K 2M 4 40 5" "8M 32M 4 5 2" "64M 64M 2 5 2")
# SWEEP_BANDS="8 8 4 100 10;64M 64M 2 3 1" replaces them (a quick check).
if [ -n "${SWEEP_BANDS:-}" ]; then IFS=';' read -ra BANDS <<<"$SWEEP_BANDS"; fi

median_csv() {  # stdin: key,value lines -> key,median,count (numeric keys sorted)
  sort -t, -k1,1 -k2,2g | awk -F, '
    function flush() { if (n) { m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2; print k "," m "," n } }
    $1 != k { flush(); k = $1; n = 0 } { v[++n] = $2 } END { flush() }'
}

if [ "$CROSS" -eq 1 ]; then
  raw="$OUT/crossovers_raw.csv"
  echo "rep,op,ranks,algo,size_bytes,time_us,served" >"$raw"
  for rep in $(seq "$REPS"); do
    for op in $OPS; do
      case "$op" in
        all_reduce) algos="oneshot direct rhd ring" ;;
        all_gather | reduce_scatter) algos="oneshot ring" ;;
        broadcast) algos="flat oneshot direct tree" ;;
        *) algos="" ;;
      esac
      for n in $RANKS; do
        for algo in "" $algos; do
          "$BIN" bench "$op" -r "$n" -b 256 -e 256K -f 2 -n 200 -w 20 -c 0 ${algo:+--algo $algo} \
            --json "$tmp/c.json" >/dev/null
          jq -r --arg rep "$rep" --arg op "$op" --arg n "$n" --arg a "${algo:-default}" \
            '.results[] | [$rep, $op, $n, $a, .size_bytes, .oop.time_us, .algorithm] | @csv' "$tmp/c.json" |
            tr -d '"' >>"$raw"
        done
      done
    done
  done
  # A forced algorithm that declined was served by another: keep only rows it served.
  awk -F, 'NR > 1 && ($4 == "default" || $4 == $7) { print $2 "|" $3 "|" $5 "|" $4 "," $6 }' "$raw" | median_csv |
    awk -F'[|,]' 'BEGIN { print "op,ranks,size_bytes,algo,time_us,runs" } { print $1 "," $2 "," $3 "," $4 "," $5 "," $6 }' \
      >"$OUT/crossovers.csv"
  echo "# fastest forced algorithm per size (median of $REPS) and the default's time; $OUT/crossovers.csv"
  awk -F, 'NR > 1 { k = $1 " " $2 " " $3; if ($4 == "default") d[k] = $5; else if (!(k in b) || $5 < b[k]) { b[k] = $5; a[k] = $4 } }
    END { for (k in a) printf "%s fastest=%s %.2f us default=%.2f us\n", k, a[k], b[k], d[k] }' "$OUT/crossovers.csv" |
    sort -k1,1 -k2,2n -k3,3n
  exit 0
fi

raw="$OUT/raw.csv"
[ "$REPORT" -eq 1 ] || echo "rep,op,ranks,size_bytes,tessera_us,mpi_us,algorithm,mpi_setting,load1,base_us" >"$raw"
# Repeats innermost, so every finished band already has its REPS runs (an
# interrupted sweep can still be summarised: --report).
[ "$REPORT" -eq 1 ] || for op in $OPS; do
  for n in $RANKS; do
    for band in "${BANDS[@]}"; do
      read -r lo hi factor iters warm <<<"$band"
      for rep in $(seq "$REPS"); do
        load="$(cut -d' ' -f1 /proc/loadavg)"
        if ! "$BIN" bench "$op" -r "$n" -b "$lo" -e "$hi" -f "$factor" -n "$iters" -w "$warm" -c 0 --compare mpi \
          --json "$tmp/s.json" >/dev/null; then
          echo "bench_sweep: $op -r $n -b $lo -e $hi (run $rep) failed; left out" >&2
          continue
        fi
        echo '{"results": []}' >"$tmp/b.json"
        if [ -n "$BASE" ]; then
          "$BASE" bench "$op" -r "$n" -b "$lo" -e "$hi" -f "$factor" -n "$iters" -w "$warm" -c 0 \
            --json "$tmp/b.json" >/dev/null || echo '{"results": []}' >"$tmp/b.json"
        fi
        jq -r --arg rep "$rep" --arg op "$op" --arg n "$n" --arg load "$load" --slurpfile base "$tmp/b.json" \
          '($base[0].results | map({key: (.size_bytes | tostring), value: .oop.time_us}) | from_entries) as $b |
           .results[] | select(.count > 0) | [$rep, $op, $n, .size_bytes, .oop.time_us, .compare_time_us,
            .algorithm, (.compare_setting // ""), $load, ($b[.size_bytes | tostring] // "")] | @csv' "$tmp/s.json" |
          tr -d '"' >>"$raw"
      done
    done
    echo "bench_sweep: $op at $n ranks done" >&2
  done
done

# Medians per (op, ranks, size); the algorithm of the last run.
{
  echo "op,ranks,size_bytes,tessera_us,mpi_us,mpi_over_tessera,algorithm,runs,load1_median,base_us"
  key() { awk -F, -v c="$1" 'NR > 1 { print $2 "|" $3 "|" $4 "," ($c == "" ? "nan" : $c) }' "$raw" | median_csv; }
  join -t, <(key 5 | sort) <(key 6 | sort) | join -t, - <(key 9 | sort) |
    join -t, - <(awk -F, 'NR > 1 { a[$2 "|" $3 "|" $4] = $7 } END { for (k in a) print k "," a[k] }' "$raw" | sort) |
    join -t, - <(key 10 | sort) |
    awk -F'[|,]' '{ printf "%s,%s,%s,%.3f,%.3f,%.2f,%s,%s,%s,%s\n", $1, $2, $3, $4, $6, ($4 > 0 ? $6 / $4 : 0), $10, $5, $8, ($11 == "nan" ? "" : $11) }' |
    sort -t, -k1,1 -k2,2n -k3,3n
} >"$OUT/sweep.csv"

if command -v gnuplot >/dev/null; then
  {
    echo "set terminal pngcairo size 1400,1000 noenhanced"
    echo "set output '$OUT/sweep.png'"
    echo "set datafile separator ','"
    echo "set logscale xy; set format x '%.0s%cB'; set xlabel 'size'; set ylabel 'time per call (us)'; set key left top"
    echo "set multiplot layout 2,2 title 'tessera (lines) vs OpenMPI (dashed), medians of $REPS runs; $OUT/sweep.csv'"
    # What the table holds (an interrupted sweep, or --report of another -r/-p, has fewer).
    for op in $(awk -F, 'NR > 1 && !seen[$1]++ { print $1 }' "$OUT/sweep.csv"); do
      plot="plot"
      for n in $(awk -F, -v op="$op" 'NR > 1 && $1 == op && !seen[$2]++ { print $2 }' "$OUT/sweep.csv"); do
        f="'< grep ^$op,$n, $OUT/sweep.csv'"
        plot+=" $f using 3:4 with linespoints title 'tessera $n ranks', $f using 3:5 with linespoints dt 2 title 'MPI $n ranks',"
      done
      echo "set title '$op'"
      echo "${plot%,}"
    done
    echo "unset multiplot"
  } >"$OUT/sweep.gp"
  if gnuplot "$OUT/sweep.gp" 2>/dev/null || { sed -i 's/pngcairo/png/' "$OUT/sweep.gp" && gnuplot "$OUT/sweep.gp"; }; then
    echo "bench_sweep: $OUT/sweep.csv, $OUT/sweep.png"
  else
    echo "bench_sweep: gnuplot could not draw $OUT/sweep.gp; the table is $OUT/sweep.csv" >&2
  fi
else
  column -s, -t "$OUT/sweep.csv" >"$OUT/sweep.txt"
  echo "bench_sweep: $OUT/sweep.csv, $OUT/sweep.txt (no gnuplot: a text table)"
fi
column -s, -t "$OUT/sweep.csv"
