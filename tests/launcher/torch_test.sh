#!/usr/bin/env bash
# An unchanged torch.distributed program (torch_ddp.py: gloo, env://, an
# all-reduce and a DDP backward) under `tessera run --nproc-per-node 2`: it
# meets at MASTER_ADDR:MASTER_PORT and exits 0; a rank that raises is the
# root cause; a rank SIGKILLed in round 0 is restarted with --max-restarts 1
# and the group meets again with TORCHELASTIC_RESTART_COUNT=1.
#
#   torch_test.sh TESSERA_BIN
#
# Needs PyTorch (Debian: python3-torch; scripts/install-deps.sh installs it
# with TESSERA_DEPS_TORCH=1); exits 77 (ctest: skipped), saying so, without.
set -uo pipefail
TESSERA="${1:?usage: torch_test.sh TESSERA_BIN}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PY=""
for p in /usr/bin/python3 python3; do
  if "$p" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' 2>/dev/null; then
    PY="$(command -v "$p")"
    break
  fi
done
if [ -z "$PY" ]; then
  echo "SKIPPED: no python3 with torch.distributed and gloo (apt-get install python3-torch)"
  exit 77
fi
OUT="$(mktemp -d /tmp/tessera-torch.XXXXXX)"
trap '[ -n "${KEEP_OUT:-}" ] || rm -rf "$OUT"' EXIT
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
pass() { echo "ok: $*"; }
export OPENBLAS_NUM_THREADS=1

"$TESSERA" run --nproc-per-node 2 -- "$PY" "$HERE/torch_ddp.py" >"$OUT/ok.log" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "^\[0\] rank 0 of 2: all_reduce 3 grad 1.5 restart 0$" "$OUT/ok.log" &&
  grep -q "^\[1\] rank 1 of 2: all_reduce 3 grad 1.5 restart 0$" "$OUT/ok.log"; then
  pass "2 ranks: init_process_group(gloo, env://), all_reduce = 3, DDP grad = 1.5"
else
  fail "2 ranks: exit $rc"
  tail -n 30 "$OUT/ok.log"
fi

RAISE_ON_RANK=1 "$TESSERA" run --nproc-per-node 2 -- "$PY" "$HERE/torch_ddp.py" >"$OUT/raise.log" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "root cause: rank 1 on node 0 .*exited with code 1" "$OUT/raise.log" &&
  grep -A12 "root cause" "$OUT/raise.log" | grep -q "RuntimeError: rank 1 raises as asked"; then
  pass "a rank that raises is the root cause (exit 1, its traceback's last line)"
else
  fail "raise: exit $rc"
  tail -n 30 "$OUT/raise.log"
fi

KILL_ON_RANK=1 "$TESSERA" run --nproc-per-node 2 --max-restarts 1 -- "$PY" "$HERE/torch_ddp.py" \
  >"$OUT/restart.log" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q "round 0 failed: rank 1 .*signal 9\|round 0 failed: rank 1 .*SIGKILL\|round 0 failed: rank 1" "$OUT/restart.log" &&
  grep -q "^\[0\] rank 0 of 2: all_reduce 3 grad 1.5 restart 1$" "$OUT/restart.log" &&
  grep -q "^\[1\] rank 1 of 2: all_reduce 3 grad 1.5 restart 1$" "$OUT/restart.log"; then
  pass "rank 1 SIGKILLed in round 0: restarted, the group met again with TORCHELASTIC_RESTART_COUNT=1"
else
  fail "restart: exit $rc"
  tail -n 30 "$OUT/restart.log"
fi
if [ "$FAILS" -gt 0 ]; then
  echo "torch_test: $FAILS check(s) failed"
  exit 1
fi
echo "torch_test: all checks passed"
