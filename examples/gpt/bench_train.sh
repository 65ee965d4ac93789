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

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
TIMEFORMAT="%U %S"  # user and system CPU seconds of the command and its children

echo "== 1. serial model vs sgemm (sgemm re-measured after every step)"
"$BIN" "${MODEL[@]}" --steps "$STEPS" --bench-sgemm | tee "$OUT/serial_bench.txt" | grep -E "^bench|^train_gpt"

echo "== 2. DP=2 (two processes) vs one process, same per-rank micro-batch"
{ time "$BIN" "${MODEL[@]}" --steps "$STEPS" > "$OUT/serial.txt"; } 2> "$OUT/serial.cpu"
{ time mpirun --oversubscribe -np 2 "$BIN" "${MODEL[@]}" --dp 2 --steps "$STEPS" > "$OUT/dp2.txt"; } 2> "$OUT/dp2.cpu"
S1=$(median_tps < "$OUT/serial.txt")
S2=$(median_tps < "$OUT/dp2.txt")
awk -v a="$S1" -v b="$S2" 'BEGIN{printf "wall tokens/s: 1 process %.1f, dp=2 %.1f, speed-up %.2fx\n", a, b, b/a}'
# On a machine shared with other work the wall figures measure the neighbours
# too; tokens per CPU-second (whole runs, start-up included) show what DP=2
# costs per core: 2 x this ratio is the speed-up on two otherwise idle cores.
read -r U1 Y1 < <(tail -1 "$OUT/serial.cpu")
read -r U2 Y2 < <(tail -1 "$OUT/dp2.cpu")
awk -v s="$STEPS" -v c1="$U1" -v k1="$Y1" -v c2="$U2" -v k2="$Y2" 'BEGIN{
  t1 = s * 8 * 256 / (c1 + k1); t2 = s * 16 * 256 / (c2 + k2);
  printf "tokens per CPU-second: 1 process %.1f, dp=2 %.1f (per-core efficiency %.2f, i.e. %.2fx on two idle cores)\n",
         t1, t2, t2 / t1, 2 * t2 / t1 }'
