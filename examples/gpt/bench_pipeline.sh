#!/usr/bin/env bash
# Pipeline throughput (docs/training.md): tp1 pp2 dp1 with 1F1B and m = 8
# micro-batches against tp1 pp1 dp2 on the same model and global batch, two
# processes each under mpirun --bind-to none (the ranks take turns on the
# CPUs, runtime/cpu_rotation.h), in interleaved rounds of alternating order
# (this machine's speed drifts over minutes, so runs far apart would measure
# the drift). Prints each round's tokens/s (median over steps 2..N) and the
# median over rounds of pp2 / dp2.
# Usage: examples/gpt/bench_pipeline.sh [build dir] [steps] [rounds]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-5}
ROUNDS=${3:-3}
BIN="$BUILD/bin/train_gpt"
export OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
MODEL=(--vocab 256 --seq 128 --hidden 256 --layers 4 --heads 4 --global-batch 16 --steps "$STEPS")
echo "nproc=$(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
med() { sort -n | awk '{v[NR]=$1} END{print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }
median_tps() { awk '/^step /{for(i=1;i<=NF;i++) if($i=="tokens/s") print $(i+1)}' | tail -n +2 | med; }
run() { mpirun --oversubscribe --bind-to none -np 2 "$BIN" "${MODEL[@]}" "$@" | median_tps; }
pp2() { run --pp 2 --schedule 1f1b --micro-batch 2; }  # 16 / 2 = 8 micro-batches
dp2() { run --dp 2 --micro-batch 8; }                  # 8 sequences per DP rank
ratios=()
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then a=$(pp2); b=$(dp2); else b=$(dp2); a=$(pp2); fi
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN{printf "%.3f", a / b}')
  echo "round $r: pp2 1f1b ${a} tokens/s, dp2 ${b} tokens/s, pp2/dp2 ${ratio}"
  ratios+=("$ratio")
done
echo "median pp2/dp2 over $ROUNDS rounds: $(printf '%s\n' "${ratios[@]}" | med)"
