#!/usr/bin/env bash
# bf16 GEMM (oneDNN, fp32 accumulation; runtime/bf16.h) against OpenBLAS
# sgemm at the trainer's GEMM shapes, single-threaded, in alternating rounds
# of the same run (docs/training.md, "bf16"). The target: bf16 at least 1.6x
# sgemm's FLOP/s over all shapes (avx512_bf16 doubles the multiply-adds per
# instruction).
# Usage: scripts/bench_bf16_gemm.sh [build dir] [rounds] [extra bench_gemm flags...]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-5}
shift $(($# > 2 ? 2 : $#))
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}  cores=$(nproc --all)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -o -m1 'avx512_bf16' /proc/cpuinfo >/dev/null && echo "cpu: avx512_bf16" || echo "cpu: no avx512_bf16 (fallback GEMM)"
for family in gpt llama; do
  "$BUILD/bin/bench_gemm" --family "$family" --rounds "$ROUNDS" "$@"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
