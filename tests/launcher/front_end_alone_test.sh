#!/usr/bin/env bash
# `tessera` alone (tessera_tools not beside it) still runs `run` (the
# launcher needs nothing of the tools), and for every other subcommand says
# what is missing and exits 127, as a shell does for a command it cannot run.
#
#   front_end_alone_test.sh TESSERA
set -uo pipefail
TESSERA="${1:?usage: front_end_alone_test.sh TESSERA}"
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
[ "$FAILS" -eq 0 ] && echo "PASS" || exit 1
