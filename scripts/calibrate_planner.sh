#!/usr/bin/env bash
# Runs `tessera plan` pinned to each published Megatron-LM layout of
# docs/data/megatron_runs.csv (DGX A100, --topology dgx-a100:N) and prints the
# predicted against the published iteration time per row, with the mean and
# worst absolute error per source table. No figure of the model is fitted to
# these rows (docs/planner.md, "Calibration").
#
#   scripts/calibrate_planner.sh [--bin build/bin/tessera] [--data docs/data/megatron_runs.csv] [-- extra plan flags]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin="$here/build/bin/tessera"
data="$here/docs/data/megatron_runs.csv"
extra=()
usage() { echo "usage: $0 [--bin TESSERA] [--data CSV] [-- extra tessera plan flags]" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) [[ $# -ge 2 ]] || usage; bin=$2; shift 2 ;;
    --data) [[ $# -ge 2 ]] || usage; data=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) usage ;;
  esac
done
[[ -x "$bin" ]] || { echo "calibrate_planner: no tessera binary at $bin (build the 'tessera' target)" >&2; exit 2; }
[[ -r "$data" ]] || { echo "calibrate_planner: cannot read $data" >&2; exit 2; }
for tool in jq awk; do command -v $tool >/dev/null || { echo "calibrate_planner: needs $tool" >&2; exit 2; }; done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
seq_len=2048 vocab=51200
printf '%-17s %-13s %-22s %10s %10s %8s   %s\n' table row "layout (t,p,d,b,v)" published predicted error "compute / tp / pp / bubble / dp (s)"
line=0
while IFS=, read -r src name layers hidden heads tp pp dp gpus gbs mbs vst rec sp runtime overlap tp_overlap tflops iter; do
  line=$((line + 1))
  [[ -z "$src" || "$src" == \#* ]] && continue
  [[ -n "$iter" || -n "$tflops" ]] || { echo "calibrate_planner: $data line $line: neither TFLOP/s nor iteration time" >&2; exit 2; }
  nodes=$(( (gpus + 7) / 8 ))
  (( tp * pp * dp == gpus )) || { echo "calibrate_planner: $data line $line: tp*pp*dp != gpus" >&2; exit 2; }
  model="$tmp/$name.json"
  printf '{"name": "%s", "layers": %d, "hidden": %d, "heads": %d, "vocab": %d, "max_seq": %d}\n' \
    "$name" "$layers" "$hidden" "$heads" "$vocab" "$seq_len" >"$model"
  if [[ -z "$iter" ]]; then
    # Narayanan et al. 2021, eq. (3): F = 96 B s l h^2 (1 + s/6h + V/16lh); time = F / (TFLOP/s x GPUs).
    iter=$(awk -v B="$gbs" -v s="$seq_len" -v l="$layers" -v h="$hidden" -v V="$vocab" -v T="$tflops" -v n="$gpus" \
      'BEGIN { F = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h)); printf "%.4f", F / (T * 1e12 * n) }')
  fi
  sched=(--schedule 1f1b)
  (( pp == 1 )) && sched=()
  (( vst > 1 )) && sched=(--schedule interleaved --virtual-stages "$vst")
  out="$tmp/$name.plan.json"
  if ! "$bin" plan --model "$model" --topology "dgx-a100:$nodes" --global-batch "$gbs" --seq "$seq_len" \
      --tp "$tp" --pp "$pp" --dp "$dp" --mbs "$mbs" --recompute "$rec" --sequence-parallel "$sp" --zero1 off \
      --runtime "$runtime" --overlap-grad-reduce "$overlap" --overlap-tp-backward "$tp_overlap" \
      "${sched[@]}" --memory-fraction 1 --top 1 --json "$out" "${extra[@]}" >"$tmp/log" 2>&1; then
    printf '%-17s %-13s plan failed: %s\n' "$src" "$name" "$(grep -v '^Temporary files' "$tmp/log" | tail -1)" >&2
    continue
  fi
  jq -r --arg src "$src" --arg name "$name" --arg lay "$tp,$pp,$dp,$mbs,$vst" --argjson pub "$iter" '
    .step_time_s as $t | ($t.total) as $p |
    "\($src)|\($name)|\($lay)|\($pub)|\($p)|\((($p - $pub) / $pub) * 100)|\($t.compute)|\($t.tp_comm)|\($t.pp_comm)|\($t.bubble)|\($t.dp_comm)"' "$out"
done <"$data" | awk -F'|' '
  { printf "%-17s %-13s %-22s %9.3fs %9.3fs %+7.1f%%   %.2f / %.2f / %.2f / %.2f / %.2f\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
    e = $6 < 0 ? -$6 : $6; n[$1]++; sum[$1] += e; if (e > worst[$1]) worst[$1] = e; bias[$1] += $6 }
  END { for (t in n) printf "%-17s mean |error| %5.1f%%  worst %5.1f%%  mean signed %+5.1f%%  (%d rows)\n", t, sum[t] / n[t], worst[t], bias[t] / n[t], n[t] }'
