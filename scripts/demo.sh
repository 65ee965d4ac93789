#!/usr/bin/env bash
# The main job: installs what is missing, builds, then trains a small GPT-2
# over 8 emulated Trainium cores (tensor parallel 2 x data parallel 4) under
# `tessera run`, then the same model as a pipeline (tensor parallel 2 x
# pipeline parallel 2 x data parallel 2, 1F1B) with its timeline, and
# trains a small Llama (grouped-query attention, tp 4 > 2 K/V heads) and cuts
# its Hugging Face export into tp x pp shards and back, and measures
# all-reduce bandwidth over 4 emulated cores.
# --precision-study (or TESSERA_DEMO_PRECISION_STUDY=1) then also runs
# scripts/precision_study.sh (fp32 against bf16 with master weights, pure
# bf16 and pure bf16 with stochastic rounding; about two more minutes).
source "$(dirname "$0")/common.sh"
PRECISION_STUDY="${TESSERA_DEMO_PRECISION_STUDY:-0}"
for arg in "$@"; do
  case "$arg" in
    --precision-study) PRECISION_STUDY=1 ;;
    *) echo "usage: scripts/demo.sh [--precision-study]" >&2; exit 2 ;;
  esac
done
tessera_build
OUT="$ROOT/out/demo"
mkdir -p "$OUT"
BIN="$BUILD_DIR/bin"
STEPS="${TESSERA_DEMO_STEPS:-150}"
PP_STEPS="${TESSERA_DEMO_PP_STEPS:-20}"
LLAMA_STEPS="${TESSERA_DEMO_LLAMA_STEPS:-100}"

echo "== GPT-2 (4 layers, width 128, byte tokens) on 8 emulated trn1 cores: TP=2 x DP=4 =="
"$BIN/tessera" run --nproc-per-node 8 --log-dir "$OUT/logs" -- \
  "$BIN/train_gpt" --tp 2 --dp 4 --zero1 --layers 4 --hidden 128 --heads 4 --seq 128 \
  --micro-batch 4 --steps "$STEPS" --lr 1e-3 --val-every 50 --device trn1-core \
  --log-json "$OUT/train_log.jsonl" --export "$OUT/gpt2_tp2_dp4.safetensors" \
  | tee "$OUT/train.txt"

echo
echo "== the same model on 8 emulated trn1 cores as a pipeline: TP=2 x PP=2 x DP=2, 1F1B, 4 micro-batches =="
echo "-- the plan: tessera plan pinned to this layout (examples/gpt/demo_model.json is the model's sizes)"
"$BIN/tessera" plan --model "$ROOT/examples/gpt/demo_model.json" --topology emulated:8 --cores 8 \
  --device trn1-core --precision fp32 --global-batch 16 --seq 128 --tp 2 --pp 2 --dp 2 --mbs 2 \
  --schedule 1f1b --zero1 on --sequence-parallel off --recompute none --top 1 --json "$OUT/plan.json" \
  > "$OUT/plan.txt"
sed -n '/^Best plan/,/^  layers per stage/p' "$OUT/plan.txt"
echo "-- train_gpt --plan $OUT/plan.json"
"$BIN/tessera" run --nproc-per-node 8 --log-dir "$OUT/logs_pp" -- \
  "$BIN/train_gpt" --plan "$OUT/plan.json" --steps "$PP_STEPS" --lr 1e-3 \
  --log-json "$OUT/train_pp_log.jsonl" --trace "$OUT/pipeline_trace.json" \
  | tee "$OUT/train_pp.txt"

echo
echo "== a small Llama (4 layers, width 128, 4 query heads sharing 2 K/V heads, SwiGLU, RoPE) on 8 emulated trn1 cores: TP=4 x DP=2, ZeRO-1 =="
echo "-- tp 4 > 2 K/V heads: each K/V head is replicated onto the 2 ranks whose query heads read it"
rm -rf "$OUT/llama" "$OUT/llama_tp4_pp2" "$OUT/llama_back"
"$BIN/tessera" run --nproc-per-node 8 --log-dir "$OUT/logs_llama" -- \
  "$BIN/train_gpt" --family llama --layers 4 --hidden 128 --heads 4 --kv-heads 2 --tp 4 --dp 2 --zero1 --seq 128 \
  --micro-batch 4 --global-batch 16 --steps "$LLAMA_STEPS" --lr 1e-3 --val-every 50 --device trn1-core \
  --log-json "$OUT/train_llama_log.jsonl" --export "$OUT/llama" \
  | tee "$OUT/train_llama.txt"
echo "-- its Hugging Face directory (config.json + model.safetensors) cut for tp 4 x pp 2, verified, put back together"
"$BIN/tessera" ckpt shard --tp 4 --pp 2 --out "$OUT/llama_tp4_pp2" "$OUT/llama"
"$BIN/tessera" ckpt verify "$OUT/llama_tp4_pp2"
"$BIN/tessera" ckpt consolidate --max-shard-size 1GB --out "$OUT/llama_back" "$OUT/llama_tp4_pp2"

echo
echo "== all-reduce bandwidth over 4 emulated cores (shared memory), modeled on trn1.32xlarge =="
"$BIN/tessera" bench all_reduce -r 4 -b 8 -e 16M -f 4 --check --baseline \
  --topology trn1.32xlarge --json "$OUT/bench_all_reduce.json" --plot "$OUT/bench_all_reduce.png" \
  | tee "$OUT/bench_all_reduce.txt"

if [ "$PRECISION_STUDY" = 1 ]; then
  echo
  echo "== precision study: the GPT-2 above on one emulated trn1 core in fp32, bf16 with fp32 master weights, pure bf16, pure bf16 with stochastic rounding =="
  "$ROOT/scripts/precision_study.sh" --no-build -o "$OUT/precision_study"
fi

echo
echo "demo: results in $OUT/"
echo "  train.txt, train_log.jsonl     per-step loss, grad norm, tokens/s, modeled step time, MFU, peak memory"
echo "  logs/                          one log file per rank"
echo "  gpt2_tp2_dp4.safetensors       the trained weights, Hugging Face GPT-2 layout"
echo "  plan.json, plan.txt           the plan tessera plan wrote for the pipeline run (predicted step time)"
echo "  train_pp.txt, train_pp_log.jsonl, logs_pp/  the TP=2 x PP=2 x DP=2 pipeline run, with each stage's bubble"
echo "  pipeline_trace.json            its last step per rank on the emulated clock (open in ui.perfetto.dev)"
echo "  train_llama.txt, train_llama_log.jsonl, logs_llama/  the Llama run (TP=4 x DP=2, GQA with replicated K/V heads)"
echo "  llama/, llama_tp4_pp2/, llama_back/  its Hugging Face directory, the tp 4 x pp 2 shards, consolidated again"
echo "  bench_all_reduce.{txt,json,png} all-reduce bandwidth table, JSON and plot"
if [ "$PRECISION_STUDY" = 1 ]; then
  echo "  precision_study/                losses.csv, losses.png, summary.txt: the four precisions' loss curves and final losses"
fi
