#!/usr/bin/env bash
# train_gpt's models against an independent PyTorch forward pass
# (tests/models/hf_reference.py, which shares no code with tessera):
#  1. the reference writes a Hugging Face model directory with random weights
#     far from any initialisation (config.json from the KEY=VALUE pairs);
#  2. train_gpt --init DIR --eval-text gives the reference's eval loss within
#     1e-5 relative (the import and the forward pass);
#  3. train_gpt --init DIR --steps 0 --export OUT under tp NPROC (tessera run)
#     writes a directory the reference reads to the same loss (the export,
#     gathered over TP, sharded above --max-shard-size).
# Skips (exit 77) when /usr/bin/python3 has no torch.
#   reference_test.sh TRAIN_GPT TESSERA NPROC DTYPE KEY=VALUE...
set -euo pipefail
train_gpt="$1" tessera="$2" nproc="$3" dtype="$4"
shift 4
here="$(cd "$(dirname "$0")" && pwd)"
ref=(/usr/bin/python3 "$here/hf_reference.py")
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1
text="$here/hf_reference.py" seq=24 windows=6
"${ref[@]}" make "$work/model" 7 "$dtype" "$@"
eval_of() { "$train_gpt" --init "$1" --steps 0 --seq "$seq" --eval-text "$text" --eval-windows "$windows" |
  sed -n 's/^eval_loss \([0-9.]*\).*/\1/p'; }
ref_of() { "${ref[@]}" eval "$1" "$text" "$seq" "$windows" | sed -n 's/^eval_loss //p'; }
close() { /usr/bin/python3 -c "import sys; a, b = float('$1'), float('$2'); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) + 1e-6 else 1)"; }
ours="$(eval_of "$work/model")" theirs="$(ref_of "$work/model")"
echo "import: train_gpt eval_loss $ours, PyTorch reference $theirs ($dtype $*)"
close "$ours" "$theirs" || { echo "FAILED: train_gpt's loss differs from the reference"; exit 1; }
"$tessera" run --nproc-per-node "$nproc" -- "$train_gpt" --init "$work/model" --tp "$nproc" --steps 0 \
  --seq "$seq" --export "$work/out" --max-shard-size 30KB >"$work/export.txt"
back="$(ref_of "$work/out")"
echo "export under tp $nproc: PyTorch reference $back"
close "$back" "$theirs" || { echo "FAILED: the export under tp $nproc is another model"; exit 1; }
