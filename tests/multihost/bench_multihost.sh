#!/usr/bin/env bash
# Performance figures across the namespace rig (tests/multihost/rig.sh):
# 2 test hosts, measured interleaved so that every pair of figures compared
# comes from the same minutes. Needs root (network namespaces).
#
#   tests/multihost/bench_multihost.sh [BIN_DIR] [RUNS]
#
# BIN_DIR defaults to build/bin, RUNS (repetitions of each pair) to 3.
# Prints each run and the medians of:
#  1. hier vs flat ring: 64 MiB all-reduce over 2 hosts x 2 ranks with
#     `--algo hier` and `--algo ring` (both with the default transport: shm
#     inside a host, TCP between hosts), and the flat ring with every link
#     over TCP (TESSERA_TRANSPORT=tcp); ratios of their times.
#  2. TCP across the bridge (veth): 64 MiB all-reduce over 2 hosts x 1 rank
#     with --baseline (raw TCP between the same two ranks, both directions at
#     once); the ratio of the all-reduce's busbw to that baseline.
#  3. Small messages across hosts: the links measured first by exchange
#     (`bench sendrecv`, both directions at once: one-way alpha = its time at 8 B,
#     bandwidth from 64 KiB; between hosts over TCP, inside a host over shm),
#     then the 8 B - 64 KiB all-reduce over 2 x 2 with those figures given to
#     the model (TESSERA_NET_INTER_HOST / _INTRA_HOST): measured and modeled
#     time and the algorithm chosen, per size.
# SECTIONS (default "1 2 3") picks which to run; RIG_DELAY_US=N (with
# RIG_WIRE, the built tessera_rig_wire) runs them with N us added per link.
# The load average is printed with every run: on a shared machine the
# figures move a lot; trust only ratios measured in the same minutes.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN="$(cd "${1:-$HERE/../../build/bin}" && pwd)"
RUNS="${2:-3}"
SECTIONS="${SECTIONS:-1 2 3}"
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
source "$HERE/rig.sh"
if ! why="$(rig_can_run)"; then
  echo "cannot run: $why"
  exit 2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 TESSERA_CPU_ROTATION=off
OUT="$(mktemp -d /tmp/tessera-mhbench.XXXXXX)"
TOKEN="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
rig_up 2 || exit 1
PORT=29600

# run_job NPROC NAME [VAR=VALUE...] -- BENCH ARGS: one job over both hosts;
# host 0's rank 0 writes $OUT/NAME.json.
run_job() {
  local nproc="$1" name="$2"
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do
    envs+=("$1")
    shift
  done
  shift
  PORT=$((PORT + 1))
  local pids=()
  for i in 0 1; do
    rig_exec "$i" env TESSERA_JOB_TOKEN="$TOKEN" "${envs[@]}" "$BIN/tessera" run --nnodes 2 --node-rank "$i" \
      --nproc-per-node "$nproc" --coordinator "$RIG_SUBNET_PREFIX.1:$PORT" --rdzv-timeout 60 -- \
      "$BIN/tessera" bench "$@" --json "$OUT/$name.json" >"$OUT/$name.$i.log" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [ $rc != 0 ]; then
    echo "job $name failed:" >&2
    tail -n 5 "$OUT/$name.0.log" "$OUT/$name.1.log" >&2
  fi
  return $rc
}

# json FILE EXPR: a Python expression over j (the bench JSON) and r (its last row).
json() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); r=j['results'][-1]; print($2)" "$1"; }
load() { cut -d' ' -f1 /proc/loadavg; }
median() { python3 -c 'import sys, statistics; v=[float(x) for x in sys.argv[1:]]; print("%.3g" % statistics.median(v))' "$@"; }

H=() R=() T=() A=() B=() Q=()
for ((k = 1; k <= RUNS; ++k)); do
  # 1. hier, flat ring (shm+tcp), flat ring (tcp everywhere), in turn.
  if has 1; then
    run_job 2 hier -- all_reduce -b 64M -e 64M -n 5 -w 2 --algo hier &&
      run_job 2 ring -- all_reduce -b 64M -e 64M -n 5 -w 2 --algo ring &&
      run_job 2 ringtcp TESSERA_TRANSPORT=tcp -- all_reduce -b 64M -e 64M -n 5 -w 2 --algo ring || continue
    h="$(json "$OUT/hier.json" 'r["oop"]["time_us"]/1e3')"
    r="$(json "$OUT/ring.json" 'r["oop"]["time_us"]/1e3')"
    t="$(json "$OUT/ringtcp.json" 'r["oop"]["time_us"]/1e3')"
    a="$(json "$OUT/hier.json" 'r["algorithm"]')/$(json "$OUT/ring.json" 'r["algorithm"]')"
    H+=("$h") R+=("$(python3 -c "print($r/$h)")") T+=("$(python3 -c "print($t/$h)")")
    printf 'run %d (load %s): 2x2 all-reduce 64 MiB: hier %.1f ms, ring %.1f ms, ring over tcp only %.1f ms (%s); ring/hier %.2f, tcp-ring/hier %.2f\n' \
      "$k" "$(load)" "$h" "$r" "$t" "$a" "${R[-1]}" "${T[-1]}"
  fi
  has 2 || continue
  # 2. TCP between two hosts vs raw TCP on the same pair.
  run_job 1 tcp2 -- all_reduce -b 64M -e 64M -n 5 -w 2 --transport tcp --baseline || continue
  bw="$(json "$OUT/tcp2.json" 'r["oop"]["busbw_gbps"]')"
  base="$(json "$OUT/tcp2.json" 'j["baselines"]["tcp_loopback_gbps"]')"
  A+=("$bw") B+=("$base") Q+=("$(python3 -c "print($bw/$base)")")
  printf 'run %d (load %s): 2x1 tcp all-reduce 64 MiB busbw %.2f GB/s, raw TCP both ways %.2f GB/s: %.0f%%\n' \
    "$k" "$(load)" "$bw" "$base" "$(python3 -c "print(100*$bw/$base)")"
done

# 3. Small messages across hosts, against the model given the links' figures
# measured just before (exchanges).
if has 3 && run_job 1 lat_tcp TESSERA_TRANSPORT=tcp -- sendrecv -b 8 -e 64K -f 8192 -n 200 -w 20 &&
  rig_exec 0 "$BIN/tessera" bench sendrecv -r 2 -b 8 -e 64K -f 8192 -n 200 -w 20 --json "$OUT/lat_shm.json" >/dev/null 2>&1; then
  figs() { python3 -c '
import json, sys
r = {x["size_bytes"]: x["oop"]["time_us"] for x in json.load(open(sys.argv[1]))["results"]}
print("%.2f,%.4f" % (r[8], 65536 / max(r[65536] - r[8], 1e-3) / 1e3))' "$1"; }
  inter="$(figs "$OUT/lat_tcp.json")" intra="$(figs "$OUT/lat_shm.json")"
  echo "links (load $(load)): between hosts (tcp) $inter, inside a host (shm) $intra (one-way us, GB/s)"
  if run_job 2 small TESSERA_NET_INTER_HOST="$inter" TESSERA_NET_INTRA_HOST="$intra" -- \
    all_reduce -b 8 -e 64K -f 2 -n 200 -w 30; then
    echo "small all-reduce across 2 hosts x 2 ranks (load $(load)): measured vs modeled"
    python3 -c '
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    m = r["size_bytes"] * 1.5 / (r["modeled_busbw_gbps"] * 1e3)
    print("  %6d B  %8.1f us  modeled %8.1f us  x%.2f  %s" % (r["size_bytes"], r["oop"]["time_us"], m, r["oop"]["time_us"] / m, r.get("algorithm")))' "$OUT/small.json"
  fi
fi

echo "medians over $RUNS run(s):"
[ ${#H[@]} -gt 0 ] && echo "  hier 64 MiB: $(median "${H[@]}") ms; ring/hier $(median "${R[@]}"); tcp-only ring/hier $(median "${T[@]}")"
[ ${#Q[@]} -gt 0 ] && echo "  tcp 2x1: busbw $(median "${A[@]}") GB/s, raw TCP $(median "${B[@]}") GB/s, ratio $(median "${Q[@]}")"
rm -rf "$OUT"
