#!/usr/bin/env bash
# `tessera run` relays its workers' output without letting it hold up the
# job: a rank that writes without pause does not delay a failure; a reader of
# the launcher's stdout that stops reading (a paused pager) does not keep the
# failed job's workers alive nor the launcher from a SIGTERM; a reader that
# has gone (EPIPE) ends nothing but the relay. (Each took from a minute to
# for ever: the relay read a pipe until it was empty and wrote with blocking
# writes, on the loop that also reaps and handles signals.)
#
#   stalled_output_test.sh TESSERA_BIN
set -uo pipefail
TESSERA="${1:?usage: stalled_output_test.sh TESSERA_BIN}"
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
TMP="$(mktemp -d)"
tag="stalled-output-test-$$"
cleanup() {
  pkill -x -f "yes $tag" 2>/dev/null
  exec 3>&- 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
# Rank 1 fails after a second; rank 0 writes "yes TAG" lines for ever.
job=("$TESSERA" run --nproc-per-node 2 -- sh -c "if [ \"\$RANK\" = 1 ]; then sleep 1; exit 3; fi; exec yes $tag")
workers_gone_within() {  # SECONDS: true once no `yes TAG` runs, false if one still does then
  local until=$((SECONDS + $1))
  while pgrep -x -f "yes $tag" >/dev/null; do
    [ "$SECONDS" -lt "$until" ] || return 1
    sleep 0.2
  done
}

# 1. stdout read as fast as it comes (/dev/null): the failure ends the job.
start=$SECONDS
"${job[@]}" >/dev/null 2>"$TMP/e1"
rc=$?
took=$((SECONDS - start))
[ "$rc" -eq 3 ] || fail "a rank writing without pause: exit $rc, expected 3: $(tail -3 "$TMP/e1")"
[ "$took" -le 20 ] || fail "a rank writing without pause delayed the failure: ${took} s"
grep -q "root cause: rank 1 .*exited with code 3" "$TMP/e1" || fail "no root cause: $(tail -5 "$TMP/e1")"

# 2. stdout a pipe that nobody reads (a FIFO we hold open and never read):
# the workers are stopped after the failure, and a SIGTERM ends the launcher,
# which was waiting for its reader to take the last lines.
mkfifo "$TMP/fifo"
exec 3<>"$TMP/fifo"
"${job[@]}" >"$TMP/fifo" 2>"$TMP/e2" &
pid=$!
until pgrep -x -f "yes $tag" >/dev/null; do  # rank 0 writing (within the test's timeout)
  sleep 0.1
done
workers_gone_within 20 || fail "stdout not read: the workers still run 20 s after rank 1 failed"
kill -TERM "$pid"
start=$SECONDS
wait "$pid"
rc=$?
took=$((SECONDS - start))
[ "$rc" -eq 143 ] || fail "SIGTERM while stdout is not read: exit $rc, expected 143: $(tail -3 "$TMP/e2")"
[ "$took" -le 10 ] || fail "SIGTERM while stdout is not read: the launcher took ${took} s to leave"
exec 3>&-

# 3. The reader has gone (EPIPE on every write): the job ends as in 1.
start=$SECONDS
{
  "${job[@]}" 2>"$TMP/e3"
  echo $? >"$TMP/rc3"
} | head -c 1000 >/dev/null
took=$((SECONDS - start))
rc="$(cat "$TMP/rc3" 2>/dev/null)"
[ "$rc" = 3 ] || fail "stdout's reader gone: exit ${rc:-none}, expected 3: $(tail -3 "$TMP/e3")"
[ "$took" -le 20 ] || fail "stdout's reader gone: the job took ${took} s"
workers_gone_within 5 || fail "stdout's reader gone: a worker survived the job"

if [ "$FAILS" -gt 0 ]; then
  echo "stalled_output_test: $FAILS check(s) failed"
  exit 1
fi
echo "stalled_output_test: a flooding rank, a stalled reader and a gone reader hold up nothing"
