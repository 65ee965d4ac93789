#!/usr/bin/env bash
# Training throughput benchmarks of train_gpt (docs/training.md):
#  1. the serial model (vocab 256, seq 256, width 384, 6 layers, 6 heads,
#     micro-batch 8) against single-core sgemm at the model's GEMM shapes,
#     measured in the same run (--bench-sgemm);
#  2. DP=2 on two processes against one process, same per-rank micro-batch.
# Usage: examples/gpt/bench_train.sh [build dir] [steps]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-6}
BIN="$BUILD/bin/train_gpt"
export OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
MODEL=(--vocab 256 --seq 256 --hidden 384 --layers 6 --heads 6 --micro-batch 8)
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}  nproc=$(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"

# Median tokens/s over steps 2..N of a run's progress lines.
median_tps() { awk '/^(\[0\] )?step /{for(i=1;i<=NF;i++) if($i=="tokens/s") print $(i+1)}' | tail -n +2 | sort -n |
  awk '{v[NR]=$1} END{print (NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2)}'; }

echo "== 1. serial model vs sgemm"
"$BIN" "${MODEL[@]}" --steps "$STEPS" --bench-sgemm | tee /tmp/bench_train_serial.txt | grep -E "^bench|^train_gpt"
S1=$(median_tps < /tmp/bench_train_serial.txt)

echo "== 2. DP=2 (two processes) vs one process"
mpirun --oversubscribe -np 2 "$BIN" "${MODEL[@]}" --dp 2 --steps "$STEPS" > /tmp/bench_train_dp2.txt
S2=$(median_tps < /tmp/bench_train_dp2.txt)
awk -v a="$S1" -v b="$S2" 'BEGIN{printf "tokens/s: 1 process %.1f, dp=2 %.1f, speed-up %.2fx\n", a, b, b/a}'
