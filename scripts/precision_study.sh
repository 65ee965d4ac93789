#!/usr/bin/env bash
# The precision study (docs/training.md, "bf16"): the demo model (GPT-2, 4
# layers, width 128, 4 heads, byte tokens, seq 128) trained on one emulated
# trn1 core from the same initialisation and batches in fp32, bf16 with fp32
# master weights, pure bf16 (--no-master-weights) and pure bf16 with
# stochastic rounding; prints a table of the final loss and the mean loss of
# the last N steps, and plots the loss curves with gnuplot.
#
#   scripts/precision_study.sh [--no-build] [-o DIR] [--steps S] [--lr LR] [--global-batch B] [--last N]
#
# The defaults (300 steps, lr 1e-4, global batch 4, last 20) take about two
# minutes of one core. At lr 1e-4 most of AdamW's updates (about lr per
# element) fall below half of bf16's spacing at the weights' magnitude
# (|w| 2^-9 or more), so pure bf16 rounds them away; at the demo's lr (1e-3)
# the four curves lie closer together. DIR (default out/precision_study) gets
#   <variant>.jsonl   train_gpt --log-json of each run (fp32, bf16, pure, pure_sr)
#   losses.csv        step, then each variant's loss (losses_mean10.csv: 10-step running means)
#   summary.txt       the table printed
#   losses.png        the loss curves, running means over 10 steps (gnuplot;
#                     losses.gp is its script)
source "$(dirname "$0")/common.sh"
OUT="$ROOT/out/precision_study"
STEPS=300
LR=1e-4
GB=4
LAST=20
BUILD=1
usage() {
  sed -n '9p' "$0" | sed 's/^#   /usage: /' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) BUILD=0 ;;
    -o) OUT="${2:?}"; shift ;;
    --steps) STEPS="${2:?}"; shift ;;
    --lr) LR="${2:?}"; shift ;;
    --global-batch) GB="${2:?}"; shift ;;
    --last) LAST="${2:?}"; shift ;;
    *) usage ;;
  esac
  shift
done
[[ "$STEPS" =~ ^[0-9]+$ && "$LAST" =~ ^[0-9]+$ && "$STEPS" -ge "$LAST" && "$LAST" -gt 0 ]] ||
  { echo "precision_study: need 0 < --last ($LAST) <= --steps ($STEPS)" >&2; exit 2; }
[ "$BUILD" = 1 ] && tessera_build
mkdir -p "$OUT"

VARIANTS=(fp32 bf16 pure pure_sr)
declare -A FLAGS=(
  [fp32]="--precision fp32"
  [bf16]="--precision bf16"
  [pure]="--precision bf16 --no-master-weights"
  [pure_sr]="--precision bf16 --no-master-weights --stochastic-rounding"
)
# fp32 thick and black under the others: three of the curves nearly coincide.
declare -A STYLE=(
  [fp32]="lw 5 lc rgb 'black'"
  [bf16]="lw 2 lc rgb 'dark-green'"
  [pure]="lw 2 lc rgb 'red'"
  [pure_sr]="lw 2 dt 2 lc rgb 'blue'"
)
declare -A TITLE=(
  [fp32]="fp32"
  [bf16]="bf16, fp32 master weights"
  [pure]="pure bf16"
  [pure_sr]="pure bf16, stochastic rounding"
)
echo "precision study: demo model, $STEPS steps, lr $LR (cosine to lr/10), global batch $GB, one emulated trn1 core;" \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-(unset)}, load $(cut -d' ' -f1-3 /proc/loadavg)"
for v in "${VARIANTS[@]}"; do
  echo "-- ${TITLE[$v]}: train_gpt ${FLAGS[$v]}"
  # shellcheck disable=SC2086  # FLAGS are word lists
  "$BUILD_DIR/bin/train_gpt" --layers 4 --hidden 128 --heads 4 --seq 128 --micro-batch 4 --global-batch "$GB" \
    --steps "$STEPS" --lr "$LR" --device trn1-core ${FLAGS[$v]} --log-json "$OUT/$v.jsonl" >"$OUT/$v.txt"
  tail -1 "$OUT/$v.txt"
done

# losses.csv: step, then each variant's loss (every run logs steps 1..STEPS).
cols=("$OUT/steps.col")
jq -r '.step' "$OUT/fp32.jsonl" >"$OUT/steps.col"
for v in "${VARIANTS[@]}"; do
  jq -r '.loss' "$OUT/$v.jsonl" >"$OUT/$v.col"
  cols+=("$OUT/$v.col")
done
{
  echo "step,${VARIANTS[*]}" | tr ' ' ','
  paste -d, "${cols[@]}"
} >"$OUT/losses.csv"
rm -f "${cols[@]}"

# The table: final loss, mean of the last LAST steps, and the gap to fp32
# (for stochastic rounding also the share of pure bf16's gap it recovers).
awk -F, -v last="$LAST" -v steps="$STEPS" '
  NR == 1 { for (i = 2; i <= NF; ++i) { name[i] = $i; col[$i] = i }; n = NF; next }
  { for (i = 2; i <= n; ++i) { final[i] = $i; if ($1 > steps - last) sum[i] += $i } }
  END {
    printf "%-8s %10s %14s %12s\n", "variant", "final", "mean last " last, "vs fp32"
    for (i = 2; i <= n; ++i) m[i] = sum[i] / last
    f = m[col["fp32"]]; p = m[col["pure"]]
    for (i = 2; i <= n; ++i) {
      printf "%-8s %10.4f %14.4f %+12.4f", name[i], final[i], m[i], m[i] - f
      if (name[i] == "pure_sr" && p != f) printf "   (recovers %.0f%% of pure bf16 gap)", 100 * (p - m[i]) / (p - f)
      printf "\n"
    }
  }' "$OUT/losses.csv" | tee "$OUT/summary.txt"

if command -v gnuplot >/dev/null; then
  # Running means over 10 steps: single steps differ by their batch's noise.
  awk -F, 'NR == 1 { print; next }
    { k = (NR - 2) % 10; line = $1
      for (i = 2; i <= NF; ++i) { s[i] += $i - w[i, k]; w[i, k] = $i; line = line "," s[i] / (NR - 1 < 10 ? NR - 1 : 10) }
      print line }' "$OUT/losses.csv" >"$OUT/losses_mean10.csv"
  {
    echo "set terminal pngcairo size 1000,700 noenhanced"
    echo "set output '$OUT/losses.png'"
    echo "set datafile separator ','"
    echo "set xlabel 'step'; set ylabel 'training loss (nats per byte), running mean over 10 steps'; set key right top; set grid"
    echo "set title 'demo model on one emulated core: lr $LR, global batch $GB ($OUT/losses.csv)'"
    plot="plot"
    col=2
    for v in "${VARIANTS[@]}"; do
      plot+=" '$OUT/losses_mean10.csv' skip 1 using 1:$col with lines ${STYLE[$v]} title '${TITLE[$v]}',"
      col=$((col + 1))
    done
    echo "${plot%,}"
  } >"$OUT/losses.gp"
  gnuplot "$OUT/losses.gp" 2>/dev/null || { sed -i 's/pngcairo/png/' "$OUT/losses.gp" && gnuplot "$OUT/losses.gp"; }
  echo "precision study: $OUT/summary.txt, $OUT/losses.csv, $OUT/losses.png"
else
  echo "precision study: $OUT/summary.txt, $OUT/losses.csv (no gnuplot: no plot)"
fi
