#!/usr/bin/env bash
# Plants known bugs, one at a time, in a COPY of the tree, rebuilds only the
# targets that plant needs, runs the suites that should catch it, and
# restores the file: does the suite catch the bug it is named for?
# (issue 32, "Tests that catch what they are named for".)
#
#   scripts/plant_bugs.sh --list          the plants
#   scripts/plant_bugs.sh NAME...         plant these (default: all)
#
# The copy lives in build/plant/src (a tar copy of the tree without .git and
# build dirs; rerunning reuses it and its build, so only the planted file
# and what links it rebuild; ccache's base_dir=/work makes the first build
# mostly cache hits). Each plant is a literal edit: the script stops with an
# error when the text to replace is not found exactly once (the code moved:
# update the plant). Results: one line per plant, CAUGHT or MISSED, also
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
  "worker_nonzero_exit_reported_as_0|launcher/root_cause.cc|  rep.set_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : 0);|  rep.set_exit_code(0);|tessera launcher_run_test tessera_hello|Run|Launcher"
  "heartbeat_timeout_never_fires|launcher/job_state.cc|  auto late = [&](const Beat& b) { return now - b.last > timeout; };|  auto late = [&](const Beat& b) { return now - b.last > timeout \&\& false; };|launcher_job_state_test|^JobState"
  "1f1b_warmup_off_by_one|parallel/pipeline/schedule.cc|  const int warmup = std::min(p - stage - 1, m);|  const int warmup = std::min(p - stage, m);|parallel_test|^Schedule|^Pipeline"
  "output_device_replaced|runtime/files.cc|  t.path = path;\n  struct stat lst {};|  t.path = path;\n  return t;\n  struct stat lst {};|runtime_test hardening_cli_test|Outputs|HardeningCli"
)

# Still to write (the issue's list; their code is being reworked on other
# branches): SHA-256 verification skipped for one file kind, a manifest
# offset check removed, the tied-embedding gradient not summed between first
# and last stage, ZeRO-1's all-gather of the last bucket skipped, a ring's
# last, uneven chunk off by one.

field() { IFS='|' read -r -a f <<<"$1"; echo "${f[$2]}"; }
regex_of() { IFS='|' read -r -a f <<<"$1"; local IFS='|'; echo "${f[*]:5}"; }

if [[ "${1:-}" == "--list" ]]; then
  for p in "${PLANTS[@]}"; do printf '%-36s %s\n' "$(field "$p" 0)" "$(field "$p" 1)"; done
  exit 0
fi

mkdir -p "$WORK"
mkdir -p "$SRC"
# The tree as it is now (mtimes kept, so a rerun rebuilds only what changed).
tar -C "$ROOT" --exclude=./.git --exclude='./build*' -cf - . | tar -C "$SRC" -xf -
cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_WERROR=ON \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null

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
  PLANT_OLD="$old" PLANT_NEW="$new" python3 - "$SRC/$file" <<'EOF'
import os, sys
p = sys.argv[1]
old = os.environ["PLANT_OLD"].replace("\\n", "\n").replace("\\&", "&")
new = os.environ["PLANT_NEW"].replace("\\n", "\n").replace("\\&", "&")
s = open(p).read()
n = s.count(old)
if n != 1:
    sys.exit(f"plant_bugs: {p}: the text to replace occurs {n} times (want 1): update the plant")
open(p, "w").write(s.replace(old, new))
EOF
  echo "== $name: $file; building $targets"
  # shellcheck disable=SC2086
  if ! nice cmake --build "$BUILD" -j"$JOBS" --target $targets >"$WORK/$name.build.log" 2>&1; then
    verdict="CAUGHT (does not build: $WORK/$name.build.log)"
  elif (cd "$BUILD" && ctest -R "$regex" -LE 'long|tidy' --timeout 600 >"$WORK/$name.test.log" 2>&1); then
    verdict="MISSED (ctest -R '$regex' passes: $WORK/$name.test.log)"
  else
    failed=$(grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|Subprocess)' "$WORK/$name.test.log" | head -3 | sed 's/^[[:space:]]*//' | paste -sd';' -)
    verdict="CAUGHT by ${failed:-ctest -R '$regex'}"
  fi
  restore
  trap - EXIT
  echo "$name: $verdict" | tee -a "$results"
done
echo "results in $results"
