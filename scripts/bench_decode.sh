#!/usr/bin/env bash
# Decode on one core: generate's greedy tokens/s (batch 1, an 8-token prompt,
# NEW new tokens, fp32, KV cache) against a plain PyTorch loop with a KV
# cache on one thread (scripts/torch_decode.py, the same shapes), for the
# perf-sized GPT-2 and Llama of scripts/bench_bf16_train.sh (vocab 256, seq
# 256, width 384, 6 layers, 6 heads; the Llama with 2 K/V heads), exported
# by train_gpt --steps 0. Rounds alternate the order (tessera then torch,
# torch then tessera) so both see the same load; the per-round ratio's median
# is reported. The target (issue 29): tessera/torch >= 1.
# Usage: scripts/bench_decode.sh [build dir] [new tokens] [rounds]
set -euo pipefail
BUILD=${1:-build}
NEW=${2:-128}
ROUNDS=${3:-5}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_PY=${TORCH_PY:-/usr/bin/python3}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}  cores: $(nproc --all)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$TORCH_PY" -c 'import torch; print("torch", torch.__version__)'
DIR=$(mktemp -d "${TMPDIR:-/tmp}/bench_decode.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
SIZES=(--steps 0 --vocab 256 --seq 256 --hidden 384 --layers 6 --heads 6)
"$BUILD/bin/train_gpt" "${SIZES[@]}" --export "$DIR/gpt" >/dev/null
"$BUILD/bin/train_gpt" "${SIZES[@]}" --family llama --kv-heads 2 --export "$DIR/llama" >/dev/null

med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
tessera() {
  "$BUILD/bin/generate" --init "$DIR/$1" --prompt-tokens 1,2,3,4,5,6,7,8 --max-new-tokens "$NEW" --quiet |
    sed -n 's/.*decode \([0-9.]*\) tokens\/s (wall).*/\1/p'
}
torch() { "$TORCH_PY" "$ROOT/scripts/torch_decode.py" "$DIR/$1/config.json" 8 "$NEW" | sed -n 's/^torch decode tokens\/s: //p'; }
for m in gpt llama; do
  ts=() ps=() ratios=()
  for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2)); then t=$(tessera $m); p=$(torch $m); else p=$(torch $m); t=$(tessera $m); fi
    ratio=$(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.3f", t / p }')
    ts+=("$t") ps+=("$p") ratios+=("$ratio")
    echo "$m round $r: tessera $t tokens/s, torch $p tokens/s, ratio ${ratio}x (load $(cut -d' ' -f1 /proc/loadavg))"
  done
  echo "$m median: tessera $(printf '%s\n' "${ts[@]}" | med) tokens/s, torch $(printf '%s\n' "${ps[@]}" | med) tokens/s," \
    "tessera/torch $(printf '%s\n' "${ratios[@]}" | med)x (target >= 1)"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
