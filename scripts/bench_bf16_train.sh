#!/usr/bin/env bash
# bf16 training (--precision bf16: bf16 GEMMs with fp32 accumulation, fp32
# master weights; docs/training.md, "bf16") against fp32 on one core, the
# serial model of examples/gpt/bench_train.sh (vocab 256, seq 256, width
# 384, 6 layers, 6 heads, micro-batch 8), in rounds of alternating order
# (fp32 then bf16, bf16 then fp32, ...) so both see the same load. Each run's
# figure is its median tokens/s over steps 2..STEPS (step 1 first-touches
# every buffer and builds oneDNN's primitives); the ratio is taken per round
# and its median over rounds reported. The target: bf16 at least 1.3x fp32.
# Usage: scripts/bench_bf16_train.sh [build dir] [steps] [rounds] [extra train_gpt flags...]
# (e.g. `--family llama` for the Llama of the same sizes).
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-8}
ROUNDS=${3:-5}
shift $(($# > 3 ? 3 : $#))
BIN="$BUILD/bin/train_gpt"
CPUS=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
MODEL=(--vocab 256 --seq 256 --hidden 384 --layers 6 --heads 6 --micro-batch 8 --steps "$STEPS" --device trn1-core "$@")
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}  nproc=$CPUS  load: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -o -m1 'avx512_bf16' /proc/cpuinfo >/dev/null && echo "cpu: avx512_bf16" || echo "cpu: no avx512_bf16 (fallback GEMM)"

# Median of numbers, one per line.
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# A run's median tokens/s over steps 2..STEPS.
run() {
  "$BIN" "${MODEL[@]}" --precision "$1" |
    awk '/^step /{ for (i = 1; i <= NF; i++) if ($i == "tokens/s") print $(i + 1) }' | tail -n +2 | med
}
ratios=()
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then
    f=$(run fp32); b=$(run bf16)
  else
    b=$(run bf16); f=$(run fp32)
  fi
  ratio=$(awk -v b="$b" -v f="$f" 'BEGIN { printf "%.3f", b / f }')
  ratios+=("$ratio")
  echo "round $r: tokens/s fp32 $f, bf16 $b, bf16/fp32 ${ratio}x (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "median bf16/fp32 over $ROUNDS rounds: $(printf '%s\n' "${ratios[@]}" | med)x (target >= 1.3)"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
