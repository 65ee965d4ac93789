#!/usr/bin/env bash
# `tessera ckpt shard` against `cp` of the same file, in the same run
# (docs/checkpoint.md). The source is a ~512 MB GPT-2-shaped f32 file
# (vocab 50257, context 1024, width 1024, 6 layers, 16 heads) written by
# `train_gpt --steps 0 --export`; it is generated once and kept in $DIR.
# cp and every tessera command read the file from a warm page cache and end
# with their output on disk (cp is followed by sync; tessera fsyncs).
# Usage: scripts/bench_ckpt.sh [build dir] [work dir]
set -euo pipefail
BUILD=${1:-build}
DIR=${2:-/tmp/tessera_bench_ckpt}
export OPENBLAS_NUM_THREADS=1
mkdir -p "$DIR"
SRC="$DIR/gpt2-1024x6.safetensors"
if [ ! -f "$SRC" ]; then
  "$BUILD/bin/train_gpt" --steps 0 --vocab 50257 --seq 1024 --hidden 1024 --layers 6 --heads 16 --micro-batch 1 \
    --export "$SRC" >/dev/null
fi
echo "source: $SRC ($(stat -c %s "$SRC") bytes)  nproc=$(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "$SRC" >/dev/null  # warm the page cache

t() {  # t LABEL CMD...: wall seconds of CMD
  local label=$1; shift
  local s e
  s=$(date +%s.%N); "$@" >/dev/null; e=$(date +%s.%N)
  printf '  %-44s %7.3f s\n' "$label" "$(echo "$e - $s" | bc)"
}
clean() { rm -rf "$DIR/copy.safetensors" "$DIR"/out_* "$DIR/back.safetensors"; sync; }

clean
t "cp FILE COPY && sync" sh -c "cp '$SRC' '$DIR/copy.safetensors' && sync"
t "tessera ckpt shard --tp 1" "$BUILD/bin/tessera" ckpt shard --tp 1 --out "$DIR/out_tp1" "$SRC"
t "tessera ckpt shard --tp 4" "$BUILD/bin/tessera" ckpt shard --tp 4 --out "$DIR/out_tp4" "$SRC"
t "tessera ckpt shard --tp 2 --pp 2" "$BUILD/bin/tessera" ckpt shard --tp 2 --pp 2 --out "$DIR/out_tp2pp2" "$SRC"
t "tessera ckpt consolidate (tp 4)" "$BUILD/bin/tessera" ckpt consolidate --out "$DIR/back.safetensors" "$DIR/out_tp4"
t "tessera ckpt reshard tp 4 -> tp 2 pp 2" "$BUILD/bin/tessera" ckpt reshard --tp 2 --pp 2 --out "$DIR/out_re" "$DIR/out_tp4"
clean
