#!/usr/bin/env bash
# `tessera run` started with stdin, stdout or stderr closed (as by a daemon
# or `cmd >&-`) runs the job as with them on /dev/null: a closed descriptor
# is reopened on /dev/null before the launcher opens anything, so no pipe or
# socket of its own takes the number and receives the workers' output.
#
#   closed_stdio_test.sh TESSERA_BIN
set -uo pipefail
TESSERA="${1:?usage: closed_stdio_test.sh TESSERA_BIN}"
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# Lines of 8 bytes with the launcher's "[R] " prefix: when the launcher's
# descriptors 1 and 2 were its own eventfds, such a line was a valid eventfd
# write (other lengths failed with EINVAL and were lost silently), woke gRPC
# with garbage and failed the job (exit 143).
job=("$TESSERA" run --nproc-per-node 2 -- sh -c 'echo "o:$RANK"; echo "e:$RANK" >&2; exit "${CODE:-0}"')

# All three closed: the job succeeds.
"${job[@]}" <&- >&- 2>&-
rc=$?
[ "$rc" -eq 0 ] || fail "stdin, stdout and stderr closed: exit $rc, expected 0"

# stdin and stderr closed: stdout still carries every worker's stdout.
"${job[@]}" <&- >"$TMP/out" 2>&-
rc=$?
[ "$rc" -eq 0 ] || fail "stdin and stderr closed: exit $rc"
for r in 0 1; do
  grep -qx "\[$r\] o:$r" "$TMP/out" || fail "stderr closed: rank $r's stdout missing: $(cat "$TMP/out")"
done
grep -q "e:" "$TMP/out" && fail "stderr closed: a worker's stderr reached stdout: $(cat "$TMP/out")"

# stdin and stdout closed: stderr carries every worker's stderr; a failing
# job's report, and its exit code, are the same as ever.
"${job[@]}" <&- >&- 2>"$TMP/err"
rc=$?
[ "$rc" -eq 0 ] || fail "stdin and stdout closed: exit $rc: $(cat "$TMP/err")"
for r in 0 1; do
  grep -qx "\[$r\] e:$r" "$TMP/err" || fail "stdout closed: rank $r's stderr missing: $(cat "$TMP/err")"
done
CODE=3 "${job[@]}" <&- >&- 2>"$TMP/err"
rc=$?
[ "$rc" -eq 3 ] || fail "stdout closed, workers exit 3: exit $rc, expected 3: $(cat "$TMP/err")"
grep -q "root cause: rank [01] .*exited with code 3" "$TMP/err" || fail "stdout closed: no root-cause report: $(cat "$TMP/err")"

if [ "$FAILS" -gt 0 ]; then
  echo "closed_stdio_test: $FAILS check(s) failed"
  exit 1
fi
echo "closed_stdio_test: tessera run with closed standard descriptors runs as with /dev/null"
