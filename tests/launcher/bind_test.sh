#!/usr/bin/env bash
# `tessera run` binds local rank i to the i-th CPU of its own affinity mask
# when 2 <= workers <= CPUs; not with TESSERA_BIND=0, nor with more workers
# than CPUs. Each worker prints the CPUs it may run on.
#
#   bind_test.sh TESSERA_BIN
set -uo pipefail
TESSERA="${1:?usage: bind_test.sh TESSERA_BIN}"
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
read -r -a CPUS <<<"$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
N=${#CPUS[@]}
ALL="$(python3 -c 'import os; print(",".join(map(str, sorted(os.sched_getaffinity(0)))))')"
# What rank R may run on, as "R: 0,1".
probe=(python3 -c 'import os; print(os.environ["RANK"] + ":", ",".join(map(str, sorted(os.sched_getaffinity(0)))), os.environ.get("TESSERA_BOUND_CPUS", "-"), flush=True)')
if [ "$N" -lt 2 ]; then
  echo "SKIPPED: needs 2 CPUs (this process may use $N)"
  exit 77
fi
out="$("$TESSERA" run --nproc-per-node "$N" -- "${probe[@]}" 2>&1)" || fail "bound run: $out"
for ((i = 0; i < N; ++i)); do
  grep -qx "\[$i\] $i: ${CPUS[$i]} $ALL" <<<"$out" || fail "rank $i not bound to CPU ${CPUS[$i]}: $out"
done
out="$(TESSERA_BIND=0 "$TESSERA" run --nproc-per-node "$N" -- "${probe[@]}" 2>&1)" || fail "TESSERA_BIND=0 run: $out"
for ((i = 0; i < N; ++i)); do
  grep -qx "\[$i\] $i: $ALL -" <<<"$out" || fail "TESSERA_BIND=0: rank $i bound: $out"
done
out="$("$TESSERA" run --nproc-per-node $((N + 1)) -- "${probe[@]}" 2>&1)" || fail "oversubscribed run: $out"
for ((i = 0; i <= N; ++i)); do
  grep -qx "\[$i\] $i: $ALL -" <<<"$out" || fail "$((N + 1)) workers on $N CPUs: rank $i bound: $out"
done
if [ "$FAILS" -gt 0 ]; then
  echo "bind_test: $FAILS check(s) failed"
  exit 1
fi
echo "bind_test: ranks bound one CPU each when they fit, else not"
