#!/usr/bin/env bash
# Plants known bugs, one at a time, in a COPY of the tree, rebuilds only the
# targets that plant needs, runs the suites that should catch it, and
# restores the file: does the suite catch the bug it is named for?
# (issue 32, "Tests that catch what they are named for".)
#
#   scripts/plant_bugs.sh --list          the plants
#   scripts/plant_bugs.sh --check         each plant's text is in the tree once (no build)
#   scripts/plant_bugs.sh NAME...         plant these (default: all)
#
# The copy lives in build/plant/src (a tar copy of the tree without .git and
# build dirs; rerunning reuses it and its build, so only the planted file
# and what links it rebuild; ccache's base_dir=/work makes the first build
# mostly cache hits). Each plant is a literal edit: the script stops with an
# error when the text to replace is not found exactly once (the code moved:
# update the plant; --check tests every text without building). Results:
# one line per plant, CAUGHT, MISSED, NO TESTS or BROKEN PLANT, also
# appended to build/plant/results.txt (a dated header per run). On a 2-core machine shared with other builds a
# plant costs minutes (the rebuild and link of its targets).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$ROOT/build/plant"
SRC="$WORK/src"
BUILD="$SRC/build"
JOBS="${PLANT_JOBS:-2}"

# name | file | literal text | replacement | build targets | ctest -R regex
# (\n in the texts is a newline.)
PLANTS=(
  "lr_warmup_off_by_one|parallel/optim/lr_schedule.cc|return max_lr * static_cast<double>(step) / static_cast<double>(warmup);|return max_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);|train_test|LrSchedule|Optimizer"
  "planner_activation_term_dropped|parallel/cost_model.cc|const double split = 2 * sbh + 4 * s * b * kv + 2 * sbh +|const double split = 2 * sbh + 4 * s * b * kv +|parallel_test|CostModel|Planner|Memory"
  "reduce_max_min_swapped_floats|collectives/reduce.cc|    case ReduceOp::Max:\n      apply(d, x, y, n, [](T u, T v) { return u < v ? v : u; });|    case ReduceOp::Max:\n      apply(d, x, y, n, [](T u, T v) { return v < u ? v : u; });|reduce_test|^Reduce2\\."
  "reduce_max_min_swapped_int32|collectives/reduce.cc|      reduce_int<int32_t, uint32_t>(dst, a, b, n, op);|      reduce_int<int32_t, uint32_t>(dst, a, b, n, op == ReduceOp::Max ? ReduceOp::Min : op == ReduceOp::Min ? ReduceOp::Max : op);|reduce_test|^Reduce2\\."
  "worker_nonzero_exit_reported_as_0|launcher/root_cause.cc|  rep.set_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : 0);|  rep.set_exit_code(0);|tessera launcher_run_test tessera_hello|Run|Launcher"
  "heartbeat_timeout_never_fires|launcher/job_state.cc|  auto late = [&](const Beat& b) { return now - b.last > timeout; };|  auto late = [&](const Beat& b) { return now - b.last > timeout \&\& false; };|launcher_job_state_test|^JobState"
  "1f1b_warmup_off_by_one|parallel/pipeline/schedule.cc|  const int warmup = std::min(p - stage - 1, m);|  const int warmup = std::min(p - stage, m);|parallel_test|^Schedule|^Pipeline"
  "output_device_replaced|runtime/files.cc|  t.path = path;\n  struct stat lst {};|  t.path = path;\n  return t;\n  struct stat lst {};|runtime_test hardening_cli_test|Outputs|HardeningCli"
  "sha256_skipped_for_trainer_state|parallel/checkpoint/checkpoint.cc|  if (h != state_file_.sha256)|  if (false \&\& h != state_file_.sha256)|train_ckpt_cli_test tessera train_gpt|TrainCkptCli\.Flipped"
  "manifest_range_check_removed|parallel/checkpoint/checkpoint.cc|pc.end > d.numel())|false)|ckpt_tool_test tessera train_gpt|CkptIntegrity\.ManifestThatLies"
  "tied_embedding_grad_not_summed|parallel/models/gpt/trainer.cc|  if (ps_.embed) {\n    ps_.embed->all_reduce(wte->grad|  if (ps_.embed \&\& false) {\n    ps_.embed->all_reduce(wte->grad|train_test|Pipelines\.MatchesSerial"
  "zero1_last_bucket_not_gathered|parallel/optim/optimizer.cc|    for (size_t b = 0; b < buckets_.size(); ++b) {\n      const Bucket\& bk = buckets_[b];\n      const int64_t ss = shard_size(bk);\n      // In place|    for (size_t b = 0; b + 1 < buckets_.size(); ++b) {\n      const Bucket\& bk = buckets_[b];\n      const int64_t ss = shard_size(bk);\n      // In place|train_test|ZeroOne|AllTpDp/Layouts\.MatchesSerial"
  "ring_last_uneven_chunk_off_by_one|collectives/algorithms.cc|        auto blk = [\&](int i) { return part(k.count, p, i); };\n        ring_reduce_scatter(c, all, p, r, blk,|        auto blk = [\&](int i) {\n          Range b = part(k.count, p, i);\n          if (i == p - 1 \&\& k.count % static_cast<size_t>(p) != 0) --b.len;\n          return b;\n        };\n        ring_reduce_scatter(c, all, p, r, blk,|collectives_test|ForcedAlgo\.AllReduceMatchesReference/ring"
  "bf16_masters_not_saved|parallel/models/gpt/trainer_state.cc|    h.master = master;|    (void)master;|train_ckpt_test|SameLayout\.ResumeIsBitForBit/.*_bf16"
  "fp32_resume_ignores_masters|parallel/models/gpt/trainer_state.cc|fp32_run \&\& masters ? ckpt::StateKind::Master : ckpt::StateKind::Param, 0,|(fp32_run \&\& false) ? ckpt::StateKind::Master : ckpt::StateKind::Param, 0,|train_ckpt_test|PrecisionChange"
)

field() { IFS='|' read -r -a f <<<"$1"; echo "${f[$2]}"; }
regex_of() { IFS='|' read -r -a f <<<"$1"; local IFS='|'; echo "${f[*]:5}"; }

if [[ "${1:-}" == "--list" ]]; then
  for p in "${PLANTS[@]}"; do printf '%-36s %s\n' "$(field "$p" 0)" "$(field "$p" 1)"; done
  exit 0
fi

# Edits FILE: the plant's text (exactly once) replaced; with CHECK=1 only counts.
plant_edit() {
  PLANT_OLD="$2" PLANT_NEW="$3" CHECK="${4:-0}" python3 - "$1" <<'EOF'
import os, sys
p = sys.argv[1]
old = os.environ["PLANT_OLD"].replace("\\n", "\n").replace("\\&", "&")
new = os.environ["PLANT_NEW"].replace("\\n", "\n").replace("\\&", "&")
s = open(p).read()
n = s.count(old)
if n != 1:
    sys.exit(f"plant_bugs: {p}: the text to replace occurs {n} times (want 1): update the plant")
if os.environ["CHECK"] != "1":
    open(p, "w").write(s.replace(old, new))
EOF
}

# --check: every plant's text is still in the tree exactly once (no build; a ctest lint entry runs it).
if [[ "${1:-}" == "--check" ]]; then
  bad=0
  for p in "${PLANTS[@]}"; do
    plant_edit "$ROOT/$(field "$p" 1)" "$(field "$p" 2)" "$(field "$p" 3)" 1 || bad=1
  done
  [[ $bad == 0 ]] && echo "plant_bugs: ${#PLANTS[@]} plants, every text found once"
  exit $bad
fi

mkdir -p "$WORK"
mkdir -p "$SRC"
# The tree as it is now (mtimes kept, so a rerun rebuilds only what changed).
tar -C "$ROOT" --exclude=./.git --exclude='./build*' -cf - . | tar -C "$SRC" -xf -
# The worktree's generator and flags, and ccache without the working
# directory in its hash (it is hashed with -g unless hash_dir is off), so
# the copy's compiles hit what the worktree's build (with CCACHE_NOHASHDIR=1)
# already cached: the same relative paths under ccache's base_dir.
export CCACHE_NOHASHDIR=1
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# Without ccache (not every machine has it) the copy's first build compiles
# what its plants need from scratch; an empty launcher clears a cached one.
launcher=""
command -v ccache >/dev/null && launcher=ccache
cmake -S "$SRC" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_WERROR=ON \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher" >/dev/null

want=("$@")
results="$WORK/results.txt"
echo "# $(date -u '+%F %T') $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" >>"$results"
for p in "${PLANTS[@]}"; do
  name="$(field "$p" 0)"
  if [[ ${#want[@]} -gt 0 && ! " ${want[*]} " == *" $name "* ]]; then continue; fi
  file="$(field "$p" 1)"
  old="$(field "$p" 2)"
  new="$(field "$p" 3)"
  targets="$(field "$p" 4)"
  regex="$(regex_of "$p")"
  cp "$SRC/$file" "$WORK/saved"
  restore() { cp "$WORK/saved" "$SRC/$file"; }
  trap restore EXIT
  plant_edit "$SRC/$file" "$old" "$new"
  echo "== $name: $file; building $targets"
  # shellcheck disable=SC2086
  if ! nice cmake --build "$BUILD" -j"$JOBS" --target $targets >"$WORK/$name.build.log" 2>&1; then
    # A plant is a bug that builds; one that does not is the plant's own mistake.
    verdict="BROKEN PLANT (does not build: $WORK/$name.build.log)"
  elif (cd "$BUILD" && ctest -R "$regex" -LE 'long|tidy' --no-tests=error --timeout 600 >"$WORK/$name.test.log" 2>&1); then
    verdict="MISSED (ctest -R '$regex' passes: $WORK/$name.test.log)"
  elif grep -q "No tests were found" "$WORK/$name.test.log"; then
    verdict="NO TESTS (ctest -R '$regex' matches nothing)"
  else
    failed=$(grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|Subprocess)' "$WORK/$name.test.log" | head -3 | sed 's/^[[:space:]]*//' | paste -sd';' -)
    verdict="CAUGHT by ${failed:-ctest -R '$regex'}"
  fi
  restore
  trap - EXIT
  echo "$name: $verdict" | tee -a "$results"
done
echo "results in $results"
