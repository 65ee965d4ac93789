#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs it.
source "$(dirname "$0")/common.sh"
tessera_build
OUT="$ROOT/out/demo"
mkdir -p "$OUT"
echo "== all-reduce bandwidth over 4 emulated cores (shared memory) =="
"$BUILD_DIR/bin/tessera" bench all_reduce -r 4 -b 8 -e 64M -f 4 --check --baseline \
  --topology trn1.32xlarge --json "$OUT/bench_all_reduce.json" --plot "$OUT/bench_all_reduce.png" \
  | tee "$OUT/bench_all_reduce.txt"
echo
echo "demo: results in $OUT/ (bench_all_reduce.txt, .json, .png)"
