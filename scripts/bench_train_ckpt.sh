#!/usr/bin/env bash
# A training-checkpoint save during training against `cp -r && sync` of the
# same bytes, in the same run (docs/checkpoint.md, "Training checkpoints").
# Each round trains 2 steps of a GPT (vocab 8192, width 512, 4 layers: 16.9M
# parameters, ~194 MiB of parameters + AdamW m and v) with --save after step
# 2; the save time is train_gpt's own "saved ... in X s" line (files written,
# hashed, fsynced, renamed, marker). Then the saved directory is copied with
# cp -r && sync of the copies (page cache warm, as the trainer's tensors are
# in memory).
# The median of the per-round ratios is printed (the two measurements of a round are seconds apart).
# Usage: scripts/bench_train_ckpt.sh [build dir] [rounds] [work dir] [extra train_gpt flags, e.g. "--dp 2" under LAUNCH]
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${2:-3}
DIR=${3:-/tmp/tessera_bench_train_ckpt}
EXTRA=${4:-}
LAUNCH=${LAUNCH:-}
export OPENBLAS_NUM_THREADS=1
mkdir -p "$DIR"
echo "nproc=$(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)  launch: ${LAUNCH:-(one process)} $EXTRA"
ratios=(); dd_ratios=()
for r in $(seq 1 "$ROUNDS"); do
  rm -rf "$DIR/ck" "$DIR/copy" "$DIR/copy2"; sync
  out=$($LAUNCH "$BUILD/bin/train_gpt" --vocab 8192 --seq 64 --hidden 512 --layers 4 --heads 8 --micro-batch 1 \
    --steps 2 --save "$DIR/ck" $EXTRA)
  save=$(echo "$out" | sed -n 's/^saved .* in \([0-9.]*\) \(m\?s\), cpu \([0-9.]*\) s)$/\1 \2 \3/p' | tail -1)
  secs=$(echo "$save" | awk '{ print ($2 == "ms") ? $1 / 1000 : $1 }')
  cpu=$(echo "$save" | awk '{ print $3 }')
  bytes=$(du -sb "$DIR/ck/step_00000002" | cut -f1)
  # The saved files were written with O_DIRECT (not in the page cache): read
  # them once, so cp reads from memory as the trainer did; sync of the copies
  # only (a global sync would also wait for other processes' writes).
  cat "$DIR/ck/step_00000002"/* >/dev/null
  cp_t=$( { /usr/bin/time -f "%e %U %S" sh -c "cp -r '$DIR/ck/step_00000002' '$DIR/copy' && sync '$DIR/copy'/* '$DIR/copy'"; } 2>&1 | tail -1)
  cp_s=$(echo "$cp_t" | awk '{ print $1 }')
  cp_cpu=$(echo "$cp_t" | awk '{ print $2 + $3 }')
  # The same bytes through user-space buffers (write(2) from memory, as the
  # trainer must): cp and cat use copy_file_range, page cache to page cache.
  rm -rf "$DIR/copy2"; mkdir "$DIR/copy2"
  s=$(date +%s.%N)
  for f in "$DIR/ck/step_00000002"/*; do dd if="$f" of="$DIR/copy2/$(basename "$f")" bs=16M status=none; done
  sync "$DIR/copy2"/* "$DIR/copy2"; e=$(date +%s.%N)
  dd_s=$(echo "$e - $s" | bc)
  ratio=$(echo "scale=3; $secs / $cp_s" | bc)
  ratios+=("$ratio")
  dd_ratios+=("$(echo "scale=3; $secs / $dd_s" | bc)")
  printf '  round %d: save %.3f s (cpu %.3f s); cp -r && sync %.3f s (cpu %.3f s); dd bs=16M && sync %.3f s; %d bytes; save/cp %.2f, save/dd %.2f\n' \
    "$r" "$secs" "$cpu" "$cp_s" "$cp_cpu" "$dd_s" "$bytes" "$ratio" "$(echo "scale=3; $secs / $dd_s" | bc)"
done
med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '  median save / (cp -r && sync): %s   median save / (dd && sync): %s\n' "$(med "${ratios[@]}")" "$(med "${dd_ratios[@]}")"
rm -rf "$DIR/ck" "$DIR/copy" "$DIR/copy2"
