#!/usr/bin/env bash
# Decode on one core: generate's greedy tokens/s (batch 1, an 8-token prompt,
# NEW new tokens, fp32, KV cache) for the perf-sized GPT-2 and Llama of
# scripts/bench_bf16_train.sh (vocab 256, seq 256, width 384, 6 layers, 6
# heads; the Llama with 2 K/V heads), exported by train_gpt --steps 0,
# against two references measured in the same run (issue 29):
#   - the memory roofline: decode is memory-bound, so a token cannot take
#     less than the bytes it reads (the weights, plus the KV cache at the
#     mean context) at this core's read bandwidth, measured between rounds
#     by a STREAM-like loop (a sum over a 256 MiB array, one thread, best of
#     5 passes; memcpy's read + write bandwidth is printed beside it). The
#     fraction of that bound that generate reaches is reported;
#   - when python3-torch is installed, a plain PyTorch loop with a KV cache
#     on one thread (scripts/torch_decode.py, the same shapes); the target
#     is tessera/torch >= 1. Without torch this comparison is skipped.
# Rounds alternate the order of the measurements so all see the same load;
# medians are reported. Prints the load average, the cores and
# OPENBLAS_CORETYPE, before and after.
# Usage: scripts/bench_decode.sh [build dir] [new tokens] [rounds]
set -euo pipefail
BUILD=${1:-build}
NEW=${2:-128}
ROUNDS=${3:-5}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_PY=${TORCH_PY:-/usr/bin/python3}
CXX=${CXX:-c++}
# (before OMP_NUM_THREADS is set: nproc honours it)
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}  cores: $(nproc --all) ($(nproc) usable)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
HAVE_TORCH=0
if "$TORCH_PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null; then
  HAVE_TORCH=1
else
  echo "PyTorch not importable by $TORCH_PY (Debian: apt-get install python3-torch): the torch comparison is skipped"
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/bench_decode.XXXXXX")
trap 'rm -rf "$DIR"' EXIT

# One thread's memory bandwidth: read (a sum, as decode streams its weights) and memcpy (read + write bytes).
cat >"$DIR/membw.cc" <<'EOF'
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>
int main() {
  const size_t n = (size_t{256} << 20) / sizeof(uint64_t);
  std::vector<uint64_t> a(n, 1), b(n, 0);
  double read = 0, copy = 0;
  uint64_t sink = 0;
  using clk = std::chrono::steady_clock;
  for (int pass = 0; pass < 5; ++pass) {
    auto t0 = clk::now();
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i < n; i += 4) {
      s0 += a[i];
      s1 += a[i + 1];
      s2 += a[i + 2];
      s3 += a[i + 3];
    }
    auto t1 = clk::now();
    sink += s0 + s1 + s2 + s3;
    std::memcpy(b.data(), a.data(), n * sizeof(uint64_t));
    auto t2 = clk::now();
    sink += b[pass];
    const double bytes = static_cast<double>(n * sizeof(uint64_t));
    read = std::max(read, bytes / std::chrono::duration<double>(t1 - t0).count());
    copy = std::max(copy, 2 * bytes / std::chrono::duration<double>(t2 - t1).count());
  }
  std::printf("read %.3f copy %.3f sink %llu\n", read / 1e9, copy / 1e9, static_cast<unsigned long long>(sink % 10));
}
EOF
"$CXX" -O2 -march=native -o "$DIR/membw" "$DIR/membw.cc"

SIZES=(--steps 0 --vocab 256 --seq 256 --hidden 384 --layers 6 --heads 6)
"$BUILD/bin/train_gpt" "${SIZES[@]}" --export "$DIR/gpt" >/dev/null
"$BUILD/bin/train_gpt" "${SIZES[@]}" --family llama --kv-heads 2 --export "$DIR/llama" >/dev/null

med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# "tokens/s bytes-per-token": the wall decode rate, and the bytes a decode step reads (the weights,
# and the KV cache at the mean context 8 + (NEW - 1) / 2 of its 8 + NEW tokens), from the JSON.
tessera() {
  "$BUILD/bin/generate" --init "$DIR/$1" --prompt-tokens 1,2,3,4,5,6,7,8 --max-new-tokens "$NEW" --quiet \
    --json "$DIR/$1.json" >"$DIR/$1.out"
  local tps w kv
  tps=$(sed -n 's/.*decode \([0-9.]*\) tokens\/s (wall).*/\1/p' "$DIR/$1.out")
  w=$(sed -n 's/^  "weight_bytes": \([0-9]*\),*$/\1/p' "$DIR/$1.json")
  kv=$(sed -n 's/^  "kv_cache_bytes": \([0-9]*\),*$/\1/p' "$DIR/$1.json")
  awk -v t="$tps" -v w="$w" -v kv="$kv" -v n="$NEW" 'BEGIN { printf "%s %.0f\n", t, w + kv * (8 + (n - 1) / 2) / (8 + n) }'
}
membw() { "$DIR/membw" | awk '{ print $2, $4 }'; }
torch() { "$TORCH_PY" "$ROOT/scripts/torch_decode.py" "$DIR/$1/config.json" 8 "$NEW" | sed -n 's/^torch decode tokens\/s: //p'; }
for m in gpt llama; do
  ts=() ps=() ratios=() fracs=() reads=() copies=()
  for ((r = 1; r <= ROUNDS; r++)); do
    p=""
    if ((r % 2)); then
      read -r t bytes < <(tessera $m)
      read -r rd cp < <(membw)
      ((HAVE_TORCH)) && p=$(torch $m)
    else
      ((HAVE_TORCH)) && p=$(torch $m)
      read -r rd cp < <(membw)
      read -r t bytes < <(tessera $m)
    fi
    frac=$(awk -v t="$t" -v b="$bytes" -v rd="$rd" 'BEGIN { printf "%.3f", t * b / (rd * 1e9) }')
    ts+=("$t") fracs+=("$frac") reads+=("$rd") copies+=("$cp")
    line="$m round $r: tessera $t tokens/s x $(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e6 }') MB per token"
    line+=" = $(awk -v t="$t" -v b="$bytes" 'BEGIN { printf "%.2f", t * b / 1e9 }') GB/s of ${rd} GB/s read"
    line+=" (memcpy ${cp} GB/s): ${frac} of the memory bound"
    if ((HAVE_TORCH)); then
      ratio=$(awk -v t="$t" -v p="$p" 'BEGIN { printf "%.3f", t / p }')
      ps+=("$p") ratios+=("$ratio")
      line+="; torch $p tokens/s, ratio ${ratio}x"
    fi
    echo "$line (load $(cut -d' ' -f1 /proc/loadavg))"
  done
  summary="$m median: tessera $(printf '%s\n' "${ts[@]}" | med) tokens/s, $(printf '%s\n' "${fracs[@]}" | med) of"
  summary+=" the memory bound at $(printf '%s\n' "${reads[@]}" | med) GB/s read ($bytes bytes per token)"
  if ((HAVE_TORCH)); then
    summary+="; torch $(printf '%s\n' "${ps[@]}" | med) tokens/s, tessera/torch $(printf '%s\n' "${ratios[@]}" | med)x (target >= 1)"
  fi
  echo "$summary"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
