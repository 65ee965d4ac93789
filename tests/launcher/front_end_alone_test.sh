#!/usr/bin/env bash
# `tessera` alone (tessera_tools not beside it) still runs `run` (the
# launcher needs nothing of the tools but tessera_keeper), and for every
# other subcommand says what is missing and exits 127, as a shell does for a
# command it cannot run. Without tessera_keeper, `run` fails naming it.
#
#   front_end_alone_test.sh TESSERA TESSERA_KEEPER
set -uo pipefail
TESSERA="${1:?usage: front_end_alone_test.sh TESSERA TESSERA_KEEPER}"
KEEPER="${2:?usage: front_end_alone_test.sh TESSERA TESSERA_KEEPER}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$TESSERA" "$dir/tessera"
FAILS=0
"$dir/tessera" run --help >"$dir/run.out" 2>&1
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q -- "--nproc-per-node" "$dir/run.out"; then
  echo "FAIL: tessera run --help without tessera_tools: exit $rc"; cat "$dir/run.out"; FAILS=$((FAILS + 1))
fi
"$dir/tessera" plan --help >"$dir/plan.out" 2>&1
rc=$?
if [[ $rc -ne 127 ]] || ! grep -q "cannot execute '$dir/tessera_tools'" "$dir/plan.out"; then
  echo "FAIL: tessera plan without tessera_tools: exit $rc (want 127 naming $dir/tessera_tools)"; cat "$dir/plan.out"
  FAILS=$((FAILS + 1))
fi
"$dir/tessera" run --nproc-per-node 2 -- true >"$dir/nokeeper.out" 2>&1
rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "cannot start $dir/tessera_keeper: No such file or directory" "$dir/nokeeper.out"; then
  echo "FAIL: tessera run without tessera_keeper: exit $rc (want 1 naming $dir/tessera_keeper)"; cat "$dir/nokeeper.out"
  FAILS=$((FAILS + 1))
fi
cp "$KEEPER" "$dir/tessera_keeper"
out=$("$dir/tessera" run --nproc-per-node 2 -- sh -c 'echo "rank $RANK up"' 2>&1)
rc=$?
if [[ $rc -ne 0 ]] || [[ $(grep -c "rank [01] up" <<<"$out") -ne 2 ]]; then
  echo "FAIL: tessera run with tessera_keeper but no tessera_tools: exit $rc"; echo "$out"; FAILS=$((FAILS + 1))
fi
[ "$FAILS" -eq 0 ] && echo "PASS" || exit 1
