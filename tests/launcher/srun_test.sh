#!/usr/bin/env bash
# Ranks started as srun starts them (SLURM_PROCID, SLURM_NTASKS,
# SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NODELIST, ... set; no launcher of
# tessera's): a 4-rank train_gpt job (tp2 x dp2) finds its peers through the
# worker bootstrap (rank 0 serves the coordinator, launcher/slurm.h) and its
# step log equals the same job's under `tessera run`. Then a rank that fails
# ends every rank, naming it.
#
#   srun_test.sh BIN_DIR
set -uo pipefail
BIN="$(cd "${1:?usage: srun_test.sh BIN_DIR}" && pwd)"
OUT="$(mktemp -d /tmp/tessera-srun.XXXXXX)"
trap '[ -n "${KEEP_OUT:-}" ] || rm -rf "$OUT"' EXIT
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
pass() { echo "ok: $*"; }
export OPENBLAS_NUM_THREADS=1 TESSERA_CPU_ROTATION=off
GPT=(--tp 2 --dp 2 --steps 3 --layers 2 --hidden 64 --heads 4 --seq 32 --vocab 256 --micro-batch 2
  --device test-core --seed 7)
"$BIN/tessera" run --nproc-per-node 4 -- "$BIN/train_gpt" "${GPT[@]}" --log-json "$OUT/ref.json" \
  >"$OUT/ref.out" 2>&1 || fail "reference run under tessera run: $(tail -n 5 "$OUT/ref.out")"

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
# srun's environment for task $1 of 4 on one node, and nothing of other launchers'.
srun_task() {
  local r="$1"
  shift
  env -u TESSERA_RANK -u TESSERA_COORDINATOR -u OMPI_COMM_WORLD_RANK -u RANK -u PMIX_RANK -u PMI_RANK \
    SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID="$r" SLURM_NTASKS=4 SLURM_LOCALID="$r" SLURM_NODEID=0 \
    SLURM_STEP_NODELIST=node-a SLURM_STEP_NUM_NODES=1 SLURM_STEP_TASKS_PER_NODE=4 SLURM_NNODES=1 \
    TESSERA_COORDINATOR_PORT="$port" "$@"
}
# Runs the 4 tasks of a step (output to $OUT/TAG.<rank>); sets rcs to their exit codes.
run_step() {
  local tag="$1" pids=() r p
  shift
  for r in 0 1 2 3; do
    srun_task "$r" "$@" >"$OUT/$tag.$r" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do
    wait "$p"
    rcs="$rcs $?"
  done
}
run_step srun timeout 120 "$BIN/train_gpt" "${GPT[@]}" --log-json "$OUT/srun.json"
if [ "$rcs" = " 0 0 0 0" ]; then
  pass "4 ranks under a simulated srun: all exit 0"
else
  fail "srun ranks exit$rcs"
  tail -n 5 "$OUT"/srun.*
fi
if python3 - "$OUT/ref.json" "$OUT/srun.json" <<'PY'; then
import json, sys
def steps(p):
    return [json.loads(l) for l in open(p) if l.strip()]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert len(a) == 3 and len(b) == 3, (len(a), len(b))
for x, y in zip(a, b):
    assert x["step"] == y["step"] and x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
PY
  pass "losses and grad norms equal the tessera run job's"
else
  fail "step log differs from the tessera run job's"
fi

# Rank 2 exits 3 after the barrier while the others sleep: they end at once
# (exit 1), naming rank 2, rather than after their 30 s.
run_step fail timeout 60 "$BIN/tessera_hello" --comm --exit-code 3 --fail-rank 2 --sleep 30
if [ "$rcs" = " 1 1 3 1" ] && grep -q "job aborted: rank 2 .*exited with code 3" "$OUT/fail.0"; then
  pass "rank 2 exits 3: the others end with 1, naming rank 2"
else
  fail "failing rank: exits$rcs"
  tail -n 5 "$OUT"/fail.*
fi
if [ "$FAILS" -gt 0 ]; then
  echo "srun_test: $FAILS check(s) failed"
  exit 1
fi
echo "srun_test: all checks passed"
