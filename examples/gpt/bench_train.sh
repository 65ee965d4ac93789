#!/usr/bin/env bash
# Training throughput benchmarks of train_gpt (docs/training.md):
#  1. the serial model (vocab 256, seq 256, width 384, 6 layers, 6 heads,
#     micro-batch 8) against single-core sgemm at the model's GEMM shapes,
#     measured in the same run (--bench-sgemm);
#  2. DP=2 on two processes against one process, same per-rank micro-batch,
#     in interleaved rounds, with and without CPU rotation, and two
#     independent processes as the ceiling.
# Usage: examples/gpt/bench_train.sh [build dir] [steps] [rounds]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-6}
ROUNDS=${3:-3}
BIN="$BUILD/bin/train_gpt"
export OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
MODEL=(--vocab 256 --seq 256 --hidden 384 --layers 6 --heads 6 --micro-batch 8)
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}  nproc=$(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"

# Median of numbers, one per line.
med() { sort -n | awk '{v[NR]=$1} END{print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
# Median tokens/s over steps 2..N of a run's progress lines.
median_tps() { awk '/^(\[0\] )?step /{for(i=1;i<=NF;i++) if($i=="tokens/s") print $(i+1)}' | tail -n +2 | med; }

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

echo "== 1. serial model vs sgemm (sgemm re-measured after every step)"
"$BIN" "${MODEL[@]}" --steps "$STEPS" --bench-sgemm | tee "$OUT/serial_bench.txt" | grep -E "^bench|^train_gpt"

echo "== 2. DP=2 (two processes) vs one process, same per-rank micro-batch; $ROUNDS interleaved rounds"
# This machine's speed drifts by up to 1.5x over minutes, and its two vCPUs
# differ from each other by up to 40% for seconds at a time (other tenants of the
# host), so runs measured one after the other compare the drift, not DP. Each
# round runs, back to back and in alternating order:
#  - one process;
#  - DP=2 under mpirun --bind-to none, so the two ranks take turns on the two
#    CPUs (runtime/cpu_rotation.h; mpirun -np 2 otherwise binds each to one);
#  - DP=2 under plain mpirun with TESSERA_CPU_ROTATION=off: each rank keeps its
#    vCPU and every step waits for the slower one;
#  - as the hardware's ceiling for two busy cores, two independent processes.
# A round's ratios compare runs seconds apart; the medians over rounds are reported.
one() { "$BIN" "${MODEL[@]}" --steps "$STEPS" > "$OUT/one.txt"; median_tps < "$OUT/one.txt"; }
# grad_wait_s / wall_s of each JSON line (nlohmann's compact dump).
wait_fraction() { awk '{ match($0, /"grad_wait_s":[^,}]*/); w = substr($0, RSTART + 14, RLENGTH - 14)
                         match($0, /"wall_s":[^,}]*/); t = substr($0, RSTART + 9, RLENGTH - 9); print w / t }'; }
# Prints the median tokens/s and the median fraction of a step spent waiting
# for the gradient reductions after backward (grad_wait_s / wall_s).
dp2() { mpirun --oversubscribe "$@" -np 2 "$BIN" "${MODEL[@]}" --dp 2 --steps "$STEPS" --log-json "$OUT/dp2.json" > "$OUT/dp2.txt"
        echo "$(median_tps < "$OUT/dp2.txt") $(tail -n +2 "$OUT/dp2.json" | wait_fraction | med)"; }
pair() { "$BIN" "${MODEL[@]}" --steps "$STEPS" > "$OUT/pa.txt" & "$BIN" "${MODEL[@]}" --steps "$STEPS" --seed 2 > "$OUT/pb.txt"
         wait $!; echo "$(median_tps < "$OUT/pa.txt") $(median_tps < "$OUT/pb.txt")" | awk '{print $1 + $2}'; }
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then
    a=$(one); b=$(dp2 --bind-to none); c=$(dp2 -x TESSERA_CPU_ROTATION=off); d=$(pair)
  else
    d=$(pair); c=$(dp2 -x TESSERA_CPU_ROTATION=off); b=$(dp2 --bind-to none); a=$(one)
  fi
  # one | dp2 tokens/s, wait | dp2 without rotation tokens/s, wait | pair
  echo "$a $b $c $d" >> "$OUT/rounds.txt"
  echo "$a $b $c $d" | awk -v r="$r" '{
    printf "round %d: tokens/s 1 process %s | dp=2 %s (%.2fx, waits %.1f%% of a step) | without rotation %s (%.2fx, waits %.1f%%) | 2 independent processes %s (%.2fx)\n",
           r, $1, $2, $2/$1, 100*$3, $4, $4/$1, 100*$5, $6, $6/$1}'
done
SP=$(awk '{print $2 / $1}' "$OUT/rounds.txt" | med)
SW=$(awk '{print $3}' "$OUT/rounds.txt" | med)
NR=$(awk '{print $4 / $1}' "$OUT/rounds.txt" | med)
NW=$(awk '{print $5}' "$OUT/rounds.txt" | med)
CE=$(awk '{print $6 / $1}' "$OUT/rounds.txt" | med)
awk -v s="$SP" -v sw="$SW" -v n="$NR" -v nw="$NW" -v c="$CE" 'BEGIN{
  printf "medians over rounds: dp=2 speed-up %.2fx (%.0f%% of the ceiling, waits %.1f%% of a step); without rotation %.2fx (%.0f%%, waits %.1f%%); two independent processes (the ceiling) %.2fx\n",
         s, 100*s/c, 100*sw, n, 100*n/c, 100*nw, c}'
