#!/usr/bin/env bash
# `tessera ckpt` against `cp` of the same bytes, in the same run
# (docs/checkpoint.md).
#
#   scripts/bench_ckpt.sh [build dir] [work dir] [size] [reps]
#
# size 512m (default): a ~512 MB GPT-2-shaped f32 file (vocab 50257, context
#   1024, width 1024, 6 layers, 16 heads) from `train_gpt --steps 0
#   --export`, kept in the work dir.
# size llama2g: a 1.97 GB Llama Hugging Face directory from `train_gpt --family
#   llama --steps 0 --export` (16 heads, 4 K/V heads), deleted at the end.
# size 2g: a 2.08 GiB one (width 2048, 9 layers) from build/bin/gpt2_random
#   (random weights, streamed), deleted at the end.
# Each rep times shard --tp 8, reshard tp 8 -> tp 4 pp 2 and consolidate,
# each right after `cp -r INPUT COPY && sync` of that command's own input
# (the copy on disk, as tessera's fsynced outputs are), with wall time, CPU
# time and peak RSS (/usr/bin/time) and its ratio to that cp; at the end the
# median ratio per command. The page cache is warm for every reader.
set -euo pipefail
BUILD=${1:-build}
DIR=${2:-/tmp/tessera_bench_ckpt}
SIZE=${3:-512m}
REPS=${4:-2}
export OPENBLAS_NUM_THREADS=1
mkdir -p "$DIR"
case $SIZE in
  512m)
    SRC="$DIR/gpt2-1024x6.safetensors"
    if [ ! -f "$SRC" ]; then
      "$BUILD/bin/train_gpt" --steps 0 --vocab 50257 --seq 1024 --hidden 1024 --layers 6 --heads 16 --micro-batch 1 \
        --export "$SRC" >/dev/null
    fi
    ;;
  2g)
    SRC="$DIR/gpt2-2048x9.safetensors"
    trap 'rm -f "$SRC"' EXIT
    [ -f "$SRC" ] || "$BUILD/bin/gpt2_random" --vocab 50257 --seq 1024 --hidden 2048 --layers 9 --heads 16 \
      --out "$SRC" >/dev/null
    ;;
  llama2g)
    # A 1.97 GB Llama as a Hugging Face directory (config.json + model.safetensors): width 2048, 8 layers,
    # 16 query heads sharing 4 K/V heads (so shard --tp 8 replicates each K/V head onto 2 ranks), untied head.
    SRC="$DIR/llama-2048x8"
    trap 'rm -rf "$SRC"' EXIT
    [ -f "$SRC/model.safetensors" ] || "$BUILD/bin/train_gpt" --steps 0 --family llama --vocab 32000 --seq 2048 \
      --hidden 2048 --layers 8 --heads 16 --kv-heads 4 --ffn-hidden 5632 --micro-batch 1 --export "$SRC" >/dev/null
    ;;
  *) echo "usage: $0 [build dir] [work dir] [512m|2g|llama2g] [reps]" >&2; exit 2 ;;
esac
T="$BUILD/bin/tessera"
SRC_FILE="$SRC"  # the tensors' file (a Hugging Face directory's model.safetensors)
[ -d "$SRC" ] && SRC_FILE="$SRC/model.safetensors"
echo "source: $SRC ($(du -sb "$SRC" | cut -f1) bytes)  nproc=$(nproc)"
cat "$SRC" "$SRC"/* >/dev/null 2>&1 || true  # warm the page cache (a file, or a directory's files)

CP=0
t() {  # t LABEL CMD...: wall, CPU, peak RSS of CMD, and the ratio to this rep's cp
  local label=$1; shift
  local out
  out=$( { /usr/bin/time -f '%e %U %S %M' "$@" >/dev/null; } 2>&1 | tail -1)
  read -r wall user sys rss <<<"$out"
  [ "$label" = cp ] && CP=$wall
  LAST=$wall
  printf '  %-34s %7.2f s  (user %5.2f sys %5.2f)  peak %6.1f MiB  %5.2fx cp   load %s\n' "$label" "$wall" "$user" \
    "$sys" "$(echo "$rss / 1024" | bc -l)" "$(echo "$wall / $CP" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
}
clean() { rm -rf "$DIR/copy" "$DIR"/out_* "$DIR/back.safetensors"; sync; }

# Each command is paired with a cp of the same input bytes (the source file,
# or the input directory's files) run just before it. Both start from the
# same page-cache state: the input is read once (cat > /dev/null) right
# before each timed command, so both read from a warm page cache, and the
# previous outputs neither reads are deleted first (on these VMs the
# kernel's cost of filling new page-cache pages swings 5x with it). cp
# copies with copy_file_range (page cache to page cache); tessera writes
# its outputs with O_DIRECT (runtime/files.h).
RATIOS=()
pair() {  # pair LABEL INPUT CMD...
  local label=$1 input=$2; shift 2
  rm -rf "$DIR/copy"
  cat "$input" "$input"/* >/dev/null 2>&1 || true
  t cp sh -c "cp -r '$input' '$DIR/copy' && if [ -d '$DIR/copy' ]; then sync '$DIR/copy'/* '$DIR/copy'; else sync '$DIR/copy'; fi"
  rm -rf "$DIR/copy"
  cat "$input" "$input"/* >/dev/null 2>&1 || true
  t "$label" "$@"
  RATIOS+=("$label|$(echo "$LAST / $CP" | bc -l)")
}
for rep in $(seq 1 "$REPS"); do
  echo "rep $rep:"
  clean
  pair "shard --tp 8" "$SRC" "$T" ckpt shard --tp 8 --out "$DIR/out_tp8" "$SRC"
  pair "reshard tp 8 -> tp 4 pp 2" "$DIR/out_tp8" "$T" ckpt reshard --tp 4 --pp 2 --out "$DIR/out_tp4pp2" "$DIR/out_tp8"
  rm -rf "$DIR/out_tp8"
  pair "consolidate (tp 4 pp 2)" "$DIR/out_tp4pp2" "$T" ckpt consolidate --out "$DIR/back.safetensors" "$DIR/out_tp4pp2"
  cmp -s <(tail -c 100000000 "$SRC_FILE") <(tail -c 100000000 "$DIR/back.safetensors") ||
    { echo "consolidated tensors differ from the source" >&2; exit 1; }
done
clean
echo "median of $REPS reps (command / its cp):"
for label in "shard --tp 8" "reshard tp 8 -> tp 4 pp 2" "consolidate (tp 4 pp 2)"; do
  printf '  %-34s %5.2fx\n' "$label" "$(printf '%s\n' "${RATIOS[@]}" | grep -F "$label|" | cut -d'|' -f2 | sort -n |
    awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
done
