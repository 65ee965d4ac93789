#!/usr/bin/env bash
# Multi-host tests on the namespace rig (tests/multihost/rig.sh): jobs across
# two test hosts that share nothing but a bridge, as two machines do.
#
#   multihost_test.sh CASE BIN_DIR
#
# CASE: rig | bench | forced | train | faults | faults_mpi | delay | delay_model | nodns | torch. Exits 77 (ctest: skipped) when
# namespaces cannot be made here, saying why.
set -uo pipefail
CASE="${1:?usage: multihost_test.sh CASE BIN_DIR}"
BIN="$(cd "${2:?usage: multihost_test.sh CASE BIN_DIR}" && pwd)"
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/rig.sh"

if ! why="$(rig_can_run)"; then
  echo "SKIPPED: multihost tests need root with network namespaces: $why"
  exit "$RIG_SKIP"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export TESSERA_CPU_ROTATION=off
# Under ASan (build-address): OpenMPI dlclose()s its plugins, so the slow
# unwinder is needed for tests/sanitizers/lsan.supp (set by ctest) to match
# its leaks. Harmless otherwise; a user's setting wins.
export ASAN_OPTIONS="${ASAN_OPTIONS:-fast_unwind_on_malloc=0}"
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
pass() { echo "ok: $*"; }

# Runs `tessera run` on every host (node i on mh_i) with the given program;
# writes host i's output to $OUT/run.i and its exit code to $OUT/rc.i.
# Extra environment for the workers: pass VAR=VALUE words before `--`.
run_on_hosts() {
  local k="$1" nproc="$2"
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do
    envs+=("$1")
    shift
  done
  shift
  local pids=()
  for ((i = 0; i < k; ++i)); do
    rig_exec "$i" env TESSERA_JOB_TOKEN="$TOKEN" "${envs[@]}" "$BIN/tessera" run --nnodes "$k" \
      --node-rank "$i" --nproc-per-node "$nproc" --coordinator "$RIG_SUBNET_PREFIX.1:29500" --rdzv-timeout 60 -- "$@" \
      >"$OUT/run.$i" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < k; ++i)); do
    wait "${pids[$i]}"
    echo $? >"$OUT/rc.$i"
  done
}

# mpirun from the rig's head node over its hosts (launch agent instead of ssh).
mpirun_on_hosts() {
  local np="$1"
  shift
  {
    echo "mh0 slots=2"
    echo "mh1 slots=2"
  } >"$OUT/hostfile"
  rig_head mpirun -np "$np" --hostfile "$OUT/hostfile" --mca plm_rsh_agent "$(rig_agent)" \
    --mca oob_tcp_if_include "$RIG_SUBNET_PREFIX.0/24" --mca btl_tcp_if_include "$RIG_SUBNET_PREFIX.0/24" \
    --mca btl self,vader,tcp --bind-to none \
    -x OPENBLAS_NUM_THREADS -x TESSERA_CPU_ROTATION -x TESSERA_LOG_LEVEL -x TESSERA_TRANSPORT -x ASAN_OPTIONS \
    -x LSAN_OPTIONS -x TSAN_OPTIONS "$@"
}

TOKEN="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
OUT="$(mktemp -d /tmp/tessera-mh.XXXXXX)"
cleanup_out() { rm -rf "$OUT"; }

case "$CASE" in
  rig)
    # The rig isolates what two machines do not share, and touches nothing
    # of the root network namespace.
    before="$(ip -o addr show; ip -o link show | sed 's/ link-netns[^ ]*//')"
    rig_up 2 || exit 1
    h0="$(rig_exec 0 hostname)" h1="$(rig_exec 1 hostname)"
    [ "$h0" = mh0 ] && [ "$h1" = mh1 ] && pass "host names mh0, mh1" || fail "host names '$h0' '$h1'"
    rig_exec 1 sh -c 'echo x > /dev/shm/tessera-rig-probe'
    if rig_exec 0 test -e /dev/shm/tessera-rig-probe || [ -e /dev/shm/tessera-rig-probe ]; then
      fail "/dev/shm is shared"
    else
      pass "/dev/shm private to each host"
    fi
    rig_exec 1 sleep 2 &
    sleeper=$!
    sleep 0.3
    n0="$(rig_exec 0 sh -c 'ls /proc | grep -c "^[0-9]"')"
    n1="$(rig_exec 1 sh -c 'ls -d /proc/[0-9]*/ | wc -l')"
    [ "$n0" -lt 6 ] && [ "$n1" -ge 2 ] && pass "PID namespaces apart (mh0 sees $n0 pids)" || fail "pids mh0=$n0 mh1=$n1"
    wait "$sleeper"
    m0="$(rig_exec 0 readlink /proc/self/ns/mnt)" m1="$(rig_exec 1 readlink /proc/self/ns/mnt)"
    [ "$m0" != "$m1" ] && pass "mount namespaces apart" || fail "same mount namespace"
    a="$(rig_exec 1 getent hosts mh0 | awk '{print $1}')"
    [ "$a" = "$RIG_SUBNET_PREFIX.1" ] && pass "mh1 resolves mh0 to $a" || fail "mh1 resolves mh0 to '$a'"
    # TCP across the bridge (bash's /dev/tcp), and not to the root namespace's loopback.
    rig_exec 1 timeout 5 bash -c "until exec 3<>/dev/tcp/$RIG_SUBNET_PREFIX.1/29599; do sleep 0.1; done 2>/dev/null
      echo hi >&3" 2>/dev/null &
    sender=$!
    got="$(rig_exec 0 timeout 5 python3 -c '
import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 29599)); s.listen(1); c,a=s.accept(); print(a[0], c.recv(10).decode().strip())' 2>&1)"
    [ "$got" = "$RIG_SUBNET_PREFIX.2 hi" ] && pass "TCP mh1 -> mh0 over the bridge" || fail "TCP across hosts: '$got'"
    wait "$sender"
    rig_down
    after="$(ip -o addr show; ip -o link show | sed 's/ link-netns[^ ]*//')"
    [ "$before" = "$after" ] && pass "root namespace's addresses and links unchanged" || fail "root namespace changed"
    if ip netns list | grep -q "tsrmh-$$-"; then fail "namespaces left behind"; else pass "namespaces removed"; fi
    ;;

  bench)
    # A 4-rank all-reduce (every element checked by the bench) across 2 hosts
    # x 2 ranks, under both launchers; the communicator says what carried it.
    rig_up 2 || exit 1
    run_on_hosts 2 2 -- "$BIN/tessera" bench all_reduce -b 8 -e 4M -f 8 -n 3 -w 1 --json "$OUT/bench_run.json"
    if [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ]; then
      pass "tessera run: bench all_reduce across 2 hosts"
    else
      fail "tessera run bench: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1")"
      tail -n 20 "$OUT/run.0" "$OUT/run.1"
    fi
    t="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["transport"])' "$OUT/bench_run.json" 2>&1)"
    [ "$t" = "shm+tcp" ] && pass "tessera run: world transport shm+tcp" || fail "tessera run: transport '$t'"
    mpirun_on_hosts 4 "$BIN/tessera" bench all_reduce -b 8 -e 4M -f 8 -n 3 -w 1 --json "$OUT/bench_mpi.json" \
      >"$OUT/mpi.out" 2>&1
    rc=$?
    [ $rc = 0 ] && pass "mpirun: bench all_reduce across 2 hosts" || {
      fail "mpirun bench: exit $rc"
      tail -n 30 "$OUT/mpi.out"
    }
    t="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["transport"])' "$OUT/bench_mpi.json" 2>&1)"
    [ "$t" = "shm+tcp" ] && pass "mpirun: world transport shm+tcp" || fail "mpirun: transport '$t'"
    # Hierarchical all-gather, reduce-scatter and broadcast across the hosts
    # (every element checked by the bench): chosen by default at 1 MiB.
    for op in all_gather reduce_scatter broadcast; do
      run_on_hosts 2 2 -- "$BIN/tessera" bench "$op" -b 1K -e 1M -f 32 -n 2 -w 1 --root 3 --json "$OUT/$op.json"
      a="$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]; print(r[-1].get("algorithm"), max(x["oop"]["wrong"] or 0 for x in r))' "$OUT/$op.json" 2>&1)"
      if [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ] && [ "$a" = "hier 0" ]; then
        pass "tessera run: $op across 2 hosts exact, 1 MiB served by hier"
      else
        fail "tessera run $op: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1"), algorithm and wrong: '$a'"
        tail -n 20 "$OUT/run.0" "$OUT/run.1"
      fi
    done
    # tessera_hello: store, barrier and an all-reduce through the worker library.
    mpirun_on_hosts 4 "$BIN/tessera_hello" --comm >"$OUT/hello.out" 2>&1
    rc=$?
    n="$(grep -c 'ok (round 0)' "$OUT/hello.out")"
    [ $rc = 0 ] && [ "$n" = 4 ] && pass "mpirun: tessera_hello --comm on 4 ranks" || {
      fail "mpirun hello: exit $rc, $n ok lines"
      tail -n 20 "$OUT/hello.out"
    }
    ;;

  forced)
    # TESSERA_TRANSPORT=shm across hosts is refused by name, never mapped;
    # TESSERA_TRANSPORT=tcp carries every link.
    rig_up 2 || exit 1
    run_on_hosts 2 2 TESSERA_TRANSPORT=shm TESSERA_TIMEOUT_S=20 -- "$BIN/tessera_hello" --comm
    if [ "$(cat "$OUT/rc.0")" != 0 ] && [ "$(cat "$OUT/rc.1")" != 0 ]; then
      pass "forced shm across hosts fails on both hosts"
    else
      fail "forced shm: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1")"
    fi
    # Whichever rank fails first is the root cause both launchers print.
    if grep -A9 "root cause" "$OUT/run.0" | grep -Eq "is on host 'mh[01]', not on this host 'mh[01]'; shared memory cannot reach another host"; then
      pass "forced shm names the other host"
    else
      fail "forced shm: no message naming mh1"
      tail -n 20 "$OUT/run.0"
    fi
    grep -q "/proc/.*/fd" "$OUT/run.0" "$OUT/run.1" && fail "forced shm tried to open another host's /proc"
    run_on_hosts 2 2 TESSERA_TRANSPORT=tcp -- "$BIN/tessera" bench all_reduce -b 8 -e 1M -f 16 -n 2 -w 1 \
      --json "$OUT/tcp.json"
    t="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["transport"])' "$OUT/tcp.json" 2>&1)"
    if [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ] && [ "$t" = tcp ]; then
      pass "forced tcp: bench passes, transport tcp"
    else
      fail "forced tcp: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1"), transport '$t'"
    fi
    ;;


  train)
    # tp2 x dp2 GPT training across 2 hosts (TP inside a host, DP across),
    # under both launchers: the step log (loss, grad_norm) equals the
    # single-host run's exactly.
    GPT=(--tp 2 --dp 2 --steps 4 --layers 2 --hidden 64 --heads 4 --seq 32 --vocab 256 --micro-batch 2
      --device test-core --seed 7)
    "$BIN/tessera" run --nproc-per-node 4 -- "$BIN/train_gpt" "${GPT[@]}" --log-json "$OUT/one_host.json" \
      >"$OUT/one_host.out" 2>&1 || {
      fail "single-host reference run failed"
      tail -n 20 "$OUT/one_host.out"
    }
    rig_up 2 || exit 1
    run_on_hosts 2 2 TESSERA_LOG_LEVEL=debug -- "$BIN/train_gpt" "${GPT[@]}" --log-json "$OUT/run.json"
    if [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ]; then
      pass "tessera run: train_gpt tp2 x dp2 across 2 hosts"
    else
      fail "tessera run train: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1")"
      tail -n 20 "$OUT/run.0" "$OUT/run.1"
    fi
    mpirun_on_hosts 4 "$BIN/train_gpt" "${GPT[@]}" --log-json "$OUT/mpi.json" >"$OUT/mpi.out" 2>&1
    rc=$?
    [ $rc = 0 ] && pass "mpirun: train_gpt tp2 x dp2 across 2 hosts" || {
      fail "mpirun train: exit $rc"
      tail -n 30 "$OUT/mpi.out"
    }
    # Which transport each group took (debug lines of the routed transport).
    grep -q "group 'world' rank 0 of 4: 2 host(s)" "$OUT/run.0" && pass "world spans 2 hosts" ||
      fail "world group did not see 2 hosts"
    lines="$(cat "$OUT/run.0" "$OUT/run.1")"
    if grep -q "group 'tp0' rank [01] of 2: 1 host(s), this rank on host 'mh0'" <<<"$lines" &&
      grep -q "group 'tp1' rank [01] of 2: 1 host(s), this rank on host 'mh1'" <<<"$lines" &&
      [ "$(grep -c "group 'dp[01]' rank [01] of 2: 2 host(s)" <<<"$lines")" = 4 ]; then
      pass "TP groups inside one host, DP groups across both"
    else
      fail "groups do not split as TP inside a host / DP across hosts"
      grep "group '" <<<"$lines" | head
    fi
    for f in run mpi; do
      if python3 - "$OUT/one_host.json" "$OUT/$f.json" <<'PY'; then
import json, sys
def steps(p):
    return [json.loads(l) for l in open(p) if l.strip()]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
assert len(a) == 4 and len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert x["step"] == y["step"] and x["loss"] == y["loss"] and x["grad_norm"] == y["grad_norm"], (x, y)
print("losses", [x["loss"] for x in b])
PY
        pass "$f: losses and grad norms equal the single-host run's"
      else
        fail "$f: step log differs from the single-host run"
      fi
    done
    ;;

  faults)
    rig_up 2 || exit 1
    HB=(--heartbeat-timeout 8)
    # Starts a looping all-reduce job on both hosts in the background.
    start_loop() {
      LOOP_PIDS=()
      for ((i = 0; i < 2; ++i)); do
        rig_exec "$i" env TESSERA_JOB_TOKEN="$TOKEN" TESSERA_TIMEOUT_S=4 "$BIN/tessera" run --nnodes 2 --node-rank "$i" \
          --nproc-per-node 2 --coordinator "$RIG_SUBNET_PREFIX.1:29500" --rdzv-timeout 60 "${HB[@]}" -- \
          "$BIN/tessera_hello" --comm --loop-seconds 120 >"$OUT/$1.$i" 2>&1 &
        LOOP_PIDS+=($!)
      done
      for ((n = 0; n < 300; ++n)); do
        [ "$(cat "$OUT/$1.0" "$OUT/$1.1" 2>/dev/null | grep -c 'ok (round 0)')" = 4 ] && return 0
        sleep 0.1
      done
      echo "job did not start"
      return 1
    }
    # Waits for both launchers (at most $2 s each); writes rc.<name>.<i>.
    wait_loop() {
      for ((i = 0; i < 2; ++i)); do
        local p="${LOOP_PIDS[$i]}" n
        for ((n = 0; n < $2 * 10; ++n)); do
          kill -0 "$p" 2>/dev/null || break
          sleep 0.1
        done
        if kill -0 "$p" 2>/dev/null; then
          echo hang >"$OUT/rc.$1.$i"
          kill -KILL "$p" 2>/dev/null
        fi
        wait "$p"
        local rc=$?
        [ "$(cat "$OUT/rc.$1.$i" 2>/dev/null)" = hang ] || echo "$rc" >"$OUT/rc.$1.$i"
      done
    }

    # 1. mh1's cable cut mid-job.
    start_loop linkdown || fail "link-down job did not start"
    t0=$(date +%s)
    rig_link 1 down
    wait_loop linkdown 40
    t1=$(date +%s)
    r0="$(cat "$OUT/rc.linkdown.0")" r1="$(cat "$OUT/rc.linkdown.1")"
    # Bound: collective timeout 4 s (+ the local grace) and heartbeat timeout 8 s, plus kill grace.
    if [ "$r0" != 0 ] && [ "$r0" != hang ] && [ "$r1" != 0 ] && [ "$r1" != hang ] && [ $((t1 - t0)) -le 25 ]; then
      pass "link down: both launchers exit non-zero ($r0, $r1) within $((t1 - t0)) s"
    else
      fail "link down: launchers exit '$r0' / '$r1'"
    fi
    if grep -A3 "root cause" "$OUT/linkdown.0" | grep -Eq "rank [23] is on host 'mh1'|host:? +mh1|\(mh1\)"; then
      pass "link down: mh0's root cause names mh1 and its rank"
    else
      fail "link down: mh0's root cause does not name mh1"
    fi
    grep -q "root cause" "$OUT/linkdown.1" && pass "link down: mh1's launcher states a root cause" ||
      fail "link down: mh1's launcher gives no root cause"
    echo "--- mh0:"; grep -A4 "job failed" "$OUT/linkdown.0" | head -8
    echo "--- mh1:"; grep -A4 "job failed\|root cause" "$OUT/linkdown.1" | head -8
    # The host comes back: nothing of the old job is left there to rejoin.
    rig_link 1 up
    sleep 1
    left="$(rig_exec 1 sh -c 'for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done' | grep -E 'tessera|hello' || true)"
    [ -z "$left" ] && pass "link back up: no process of the old job left on mh1" || fail "left on mh1: $left"

    [ -n "${ONLY_LINKDOWN:-}" ] && exit 0
    # 2. A node with another job's token cannot join; the right one can.
    rig_exec 0 env TESSERA_JOB_TOKEN="$TOKEN" "$BIN/tessera" run --nnodes 2 --node-rank 0 --nproc-per-node 2 \
      --coordinator "$RIG_SUBNET_PREFIX.1:29500" --rdzv-timeout 60 -- "$BIN/tessera_hello" --comm >"$OUT/tok.0" 2>&1 &
    p0=$!
    rig_exec 1 env TESSERA_JOB_TOKEN=not-this-jobs-token "$BIN/tessera" run --nnodes 2 --node-rank 1 \
      --nproc-per-node 2 --coordinator "$RIG_SUBNET_PREFIX.1:29500" --rdzv-timeout 10 -- "$BIN/tessera_hello" --comm \
      >"$OUT/tok.bad" 2>&1
    rb=$?
    rig_exec 1 env TESSERA_JOB_TOKEN="$TOKEN" "$BIN/tessera" run --nnodes 2 --node-rank 1 --nproc-per-node 2 \
      --coordinator "$RIG_SUBNET_PREFIX.1:29500" --rdzv-timeout 60 -- "$BIN/tessera_hello" --comm >"$OUT/tok.1" 2>&1
    r1=$?
    wait $p0
    r0=$?
    if [ $rb != 0 ] && [ $r0 = 0 ] && [ $r1 = 0 ] && [ "$(cat "$OUT/tok.0" "$OUT/tok.1" | grep -c 'ok (round 0)')" = 4 ]; then
      pass "wrong token refused (exit $rb), right token joins and the job passes"
    else
      fail "token: wrong-token node exit $rb, job exits $r0 / $r1"
      tail -n 5 "$OUT/tok.bad" "$OUT/tok.0"
    fi

    # 3. A second launcher for node 1 with the job's own token (the host
    #    "came back") while the job runs: refused, and the job is unharmed.
    start_loop_short() {
      LOOP_PIDS=()
      for ((i = 0; i < 2; ++i)); do
        rig_exec "$i" env TESSERA_JOB_TOKEN="$TOKEN" "$BIN/tessera" run --nnodes 2 --node-rank "$i" --nproc-per-node 2 \
          --coordinator "$RIG_SUBNET_PREFIX.1:29500" --rdzv-timeout 60 -- "$BIN/tessera_hello" --comm --loop-seconds 6 \
          >"$OUT/$1.$i" 2>&1 &
        LOOP_PIDS+=($!)
      done
      for ((n = 0; n < 300; ++n)); do
        [ "$(cat "$OUT/$1.0" "$OUT/$1.1" 2>/dev/null | grep -c 'ok (round 0)')" = 4 ] && return 0
        sleep 0.1
      done
      return 1
    }
    start_loop_short again || fail "rejoin job did not start"
    rig_exec 1 env TESSERA_JOB_TOKEN="$TOKEN" "$BIN/tessera" run --nnodes 2 --node-rank 1 --nproc-per-node 2 \
      --coordinator "$RIG_SUBNET_PREFIX.1:29500" --rdzv-timeout 10 -- "$BIN/tessera_hello" --comm >"$OUT/again.extra" 2>&1
    rx=$?
    wait_loop again 40
    if [ $rx != 0 ] && grep -q "already joined round 0" "$OUT/again.extra" && [ "$(cat "$OUT/rc.again.0")" = 0 ] &&
      [ "$(cat "$OUT/rc.again.1")" = 0 ]; then
      pass "a second node 1 is refused (already joined round 0); the running job passes"
    else
      fail "second node 1: exit $rx, job $(cat "$OUT/rc.again.0") / $(cat "$OUT/rc.again.1")"
      tail -n 3 "$OUT/again.extra"
    fi

    # 4. Every process of mh1 killed mid-job (the host dies).
    start_loop kill || fail "kill job did not start"
    t0=$(date +%s)
    kill -KILL "${RIG_PIDS[1]}"
    wait_loop kill 40
    t1=$(date +%s)
    r0="$(cat "$OUT/rc.kill.0")"
    if [ "$r0" != 0 ] && [ "$r0" != hang ] && [ $((t1 - t0)) -le 10 ]; then
      pass "host killed: mh0's launcher exits non-zero ($r0) within $((t1 - t0)) s"
    else
      fail "host killed: mh0's launcher exits '$r0'"
    fi
    if grep -A3 "root cause" "$OUT/kill.0" | grep -Eq "rank [23] is on host 'mh1'|host:? +mh1|\(mh1\)"; then
      pass "host killed: root cause names mh1"
    else
      fail "host killed: root cause does not name mh1"
    fi
    echo "--- mh0:"; grep -A4 "job failed" "$OUT/kill.0" | head -8
    ;;

  faults_mpi)
    # Under mpirun: every process of mh1 killed mid-job. mpirun notices the
    # lost daemon and exits non-zero; the ranks of mh0 fail naming mh1.
    # (A cut link instead leaves OpenMPI 4.1's mpirun waiting for the
    # unreachable daemon after the ranks aborted; see docs/launcher.md.)
    rig_up 2 || exit 1
    rm -f "$OUT/mpi.out"
    TESSERA_TIMEOUT_S=4 mpirun_on_hosts 4 -x TESSERA_TIMEOUT_S "$BIN/tessera_hello" --comm --loop-seconds 120 \
      >"$OUT/mpi.out" 2>&1 &
    p=$!
    for ((n = 0; n < 300; ++n)); do
      [ "$(grep -c 'ok (round 0)' "$OUT/mpi.out" 2>/dev/null)" = 4 ] && break
      sleep 0.1
    done
    t0=$(date +%s)
    kill -KILL "${RIG_PIDS[1]}"
    for ((n = 0; n < 400; ++n)); do
      kill -0 "$p" 2>/dev/null || break
      sleep 0.1
    done
    t1=$(date +%s)
    if kill -0 "$p" 2>/dev/null; then
      fail "mpirun still running 40 s after mh1 died"
      kill -KILL "$p"
    fi
    wait "$p"
    rc=$?
    [ $rc != 0 ] && [ $((t1 - t0)) -le 15 ] && pass "mpirun exits non-zero ($rc) $((t1 - t0)) s after mh1 died" ||
      fail "mpirun exit $rc after $((t1 - t0)) s"
    if grep -q "rank [23] is on host 'mh1'" "$OUT/mpi.out"; then
      pass "mh0's ranks name mh1 in their error"
    else
      fail "no error naming mh1"
      tail -n 20 "$OUT/mpi.out"
    fi
    ;;
  delay | delay_model)
    # 100 us more on every link between the hosts (RIG_DELAY_US: the rig's
    # delayed wire, rig_wire.cc; this kernel has no sch_netem). The model is
    # given the links' figures measured by `bench sendrecv` in the same minute
    # (one-way alpha = the time of an 8-byte exchange, both directions at once
    # as in the all-reduce's steps; bandwidth from 64 KiB):
    # between hosts under the load of the all-reduce's cross-host step (one
    # exchange per host: the hosts are crowded, below, so hier_leader serves),
    # inside a host by a 2-rank exchange on mh0.
    # delay: the wire adds at least 100 us one way, and the small all-reduce
    # across 2 hosts x 2 ranks (the model given the measured latencies) is
    # exact and takes the log-step algorithm for crowded hosts (hier_leader)
    # at every size from 8 B to 64 KiB. delay_model (label long: a
    # timing test, only meaningful on a machine that is not oversubscribed):
    # also within 20% of the model at every size, as the median over 5
    # rounds of (measured / modeled in the same round).
    wire="$BIN/tests/tessera_rig_wire"
    [ -x "$wire" ] || {
      fail "no $wire (build target tessera_rig_wire)"
      exit 1
    }
    # A core per host (RIG_HOST_CPUS), as machines have their own: otherwise
    # the 4 ranks and the wire share both cores and every hand-off waits for
    # the other host's work. Each host then has 2 ranks on one core, which
    # the communicator sees in their affinity masks: the host is crowded
    # (collectives/host.h), so the small all-reduce sends one message per
    # host across (hier_leader) and the shm transport waits without spinning.
    RIG_HOST_CPUS=1 RIG_DELAY_US=100 RIG_WIRE="$wire" rig_up 2 || exit 1
    rounds=1
    [ "$CASE" = delay_model ] && rounds=5
    for ((k = 1; k <= rounds; ++k)); do
      run_on_hosts 2 1 -- "$BIN/tessera" bench sendrecv -b 8 -e 64K -f 8192 -n 300 -w 20 --json "$OUT/x$k.json"
      rig_exec 0 "$BIN/tessera" bench sendrecv -r 2 -b 8 -e 64K -f 8192 -n 300 -w 20 --json "$OUT/l$k.json" \
        >"$OUT/l$k.out" 2>&1
      links="$(python3 - "$OUT/x$k.json" "$OUT/l$k.json" <<'PY'
import json, sys
out = []
for f in sys.argv[1:]:
    # An exchange (both directions at once, as in the all-reduce's steps): its time
    # is the one-way time under that load.
    r = {x["size_bytes"]: x["oop"]["time_us"] for x in json.load(open(f))["results"]}
    a, t = r[8], r[65536]
    out.append("%.2f,%.4f" % (a, 65536 / max(t - a, 1e-3) / 1e3))  # us, GB/s
print(" ".join(out))
PY
)" || {
        fail "round $k: link exchange failed"
        tail -n 5 "$OUT/run.0" "$OUT/run.1" "$OUT/l$k.out"
        continue
      }
      read -r inter intra <<<"$links"
      echo "round $k (load $(cut -d' ' -f1 /proc/loadavg)): between hosts $inter, inside a host $intra (us,GB/s)"
      # The functional case gives the model the latencies only (a bandwidth
      # from one 64 KiB exchange on a loaded machine is too noisy to pick by).
      if [ "$CASE" = delay ]; then
        inter="${inter%%,*}" intra="${intra%%,*}"
      fi
      run_on_hosts 2 2 TESSERA_NET_INTER_HOST="$inter" TESSERA_NET_INTRA_HOST="$intra" -- \
        "$BIN/tessera" bench all_reduce -b 8 -e 64K -f 2 -n 300 -w 30 --json "$OUT/ar$k.json"
      [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ] || {
        fail "round $k: all-reduce exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1")"
        tail -n 10 "$OUT/run.0" "$OUT/run.1"
      }
    done
    verdict="$(python3 - "$OUT" "$CASE" <<'PY'
import glob, json, os, statistics, sys
d, case = sys.argv[1], sys.argv[2]
ks = [k for k in range(1, 6) if os.path.exists(os.path.join(d, "ar%d.json" % k))]
rounds = [json.load(open(os.path.join(d, "ar%d.json" % k)))["results"] for k in ks]
alpha = [json.load(open(os.path.join(d, "x%d.json" % k)))["results"][0]["oop"]["time_us"] for k in ks]
if not rounds or (case == "delay_model" and len(rounds) < 3):
    print("FAIL only %d round(s) completed" % len(rounds)); sys.exit()
bad = []
print("one-way latency between hosts (median of %d): %.1f us" % (len(alpha), statistics.median(alpha)))
if statistics.median(alpha) < 100:
    bad.append("one-way latency %.1f us < the 100 us added" % statistics.median(alpha))
sizes = [r["size_bytes"] for r in rounds[0]]
if sizes[0] != 8 or sizes[-1] != 65536:
    bad.append("sizes %s, not 8 B to 64 KiB" % sizes)
for i, size in enumerate(sizes):
    meas = [r[i]["oop"]["time_us"] for r in rounds]
    # modeled busbw = size / modeled time * 2(p-1)/p, p = 4
    model = [size * 1.5 / (r[i]["modeled_busbw_gbps"] * 1e3) for r in rounds]
    ratio = statistics.median(m / p for m, p in zip(meas, model))
    algos = {r[i]["algorithm"] for r in rounds}
    wrong = max(r[i]["oop"]["wrong"] or 0 for r in rounds)
    print("%6d B: measured %7.1f us, modeled %7.1f us (medians; median ratio %.2f), %s"
          % (size, statistics.median(meas), statistics.median(model), ratio, "/".join(sorted(algos))))
    if algos != {"hier_leader"}: bad.append("%d B served by %s" % (size, algos))
    if wrong: bad.append("%d B: %d wrong elements" % (size, wrong))
    if case == "delay_model" and abs(ratio - 1) > 0.2:
        bad.append("%d B off the model by %+.0f%%" % (size, 100 * (ratio - 1)))
print("FAIL " + "; ".join(bad) if bad else "OK")
PY
)"
    echo "$verdict"
    case "$verdict" in
      *OK)
        if [ "$CASE" = delay ]; then
          pass "100 us added: small all-reduce exact, hier_leader (O(log p) steps) from 8 B to 64 KiB"
        else
          pass "100 us added: small all-reduce within 20% of the model from 8 B to 64 KiB"
        fi
        ;;
      *) fail "delayed small all-reduce: ${verdict##*FAIL }" ;;
    esac
    ;;
  torch)
    # An unchanged torch.distributed program (tests/launcher/torch_ddp.py:
    # gloo, env://, an all-reduce and a DDP backward, exact values) across
    # the 2 hosts, one rank each: rank 0's TCPStore on MASTER_ADDR (node 0,
    # 10.77.0.1) and MASTER_PORT. Skipped without PyTorch.
    PY=""
    for p in /usr/bin/python3 python3; do
      "$p" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null && PY="$(command -v "$p")" && break
    done
    if [ -z "$PY" ]; then
      echo "SKIPPED: no python3 with torch.distributed and gloo (apt-get install python3-torch)"
      exit "$RIG_SKIP"
    fi
    rig_up 2 || exit 1
    run_on_hosts 2 1 -- "$PY" "$HERE/../launcher/torch_ddp.py"
    if [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ] &&
      grep -q "^\[0\] rank 0 of 2: all_reduce 3 grad 1.5 restart 0$" "$OUT/run.0" &&
      grep -q "^\[1\] rank 1 of 2: all_reduce 3 grad 1.5 restart 0$" "$OUT/run.1"; then
      pass "torch DDP across 2 hosts: all_reduce = 3, grad = 1.5 on both"
    else
      fail "torch across hosts: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1")"
      tail -n 20 "$OUT/run.0" "$OUT/run.1"
    fi
    ;;
  nodns)
    # Host names that resolve nowhere (each host's /etc/hosts names only
    # itself, at 127.0.1.1, as Debian's does), no TESSERA_TCP_ADDR: ranks
    # advertise the interface that reaches the coordinator (tessera run) or
    # mpirun's out-of-band address (mpirun), so jobs across the hosts run.
    unset TESSERA_TCP_ADDR TESSERA_SOCKET_IFNAME TESSERA_COORDINATOR_HOST
    RIG_NO_DNS=1 rig_up 2 || exit 1
    a="$(rig_exec 1 getent hosts mh0)"
    [ -z "$a" ] && pass "mh1 cannot resolve mh0" || fail "mh1 resolves mh0: '$a'"
    a="$(rig_exec 0 getent hosts mh0 | awk '{print $1}')"
    [ "$a" = 127.0.1.1 ] && pass "mh0's own name is 127.0.1.1" || fail "mh0 resolves itself to '$a'"
    run_on_hosts 2 2 -- "$BIN/tessera" bench all_reduce -b 8 -e 1M -f 32 -n 2 -w 1 --json "$OUT/run.json"
    t="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["transport"])' "$OUT/run.json" 2>&1)"
    if [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ] && [ "$t" = "shm+tcp" ]; then
      pass "tessera run --nnodes 2: exact all-reduce over shm+tcp without DNS"
    else
      fail "tessera run without DNS: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1"), transport '$t'"
      tail -n 20 "$OUT/run.0" "$OUT/run.1"
    fi
    mpirun_on_hosts 4 "$BIN/tessera" bench all_reduce -b 8 -e 1M -f 32 -n 2 -w 1 --json "$OUT/mpi.json" \
      >"$OUT/mpi.out" 2>&1
    rc=$?
    t="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["transport"])' "$OUT/mpi.json" 2>&1)"
    [ $rc = 0 ] && [ "$t" = "shm+tcp" ] && pass "mpirun: exact all-reduce over shm+tcp without DNS" || {
      fail "mpirun bench without DNS: exit $rc, transport '$t'"
      tail -n 30 "$OUT/mpi.out"
    }
    mpirun_on_hosts 4 "$BIN/tessera_hello" --comm >"$OUT/hello.out" 2>&1
    rc=$?
    n="$(grep -c 'ok (round 0)' "$OUT/hello.out")"
    [ $rc = 0 ] && [ "$n" = 4 ] && pass "mpirun: tessera_hello --comm (rank 0's coordinator) without DNS" || {
      fail "mpirun hello without DNS: exit $rc, $n ok lines"
      tail -n 20 "$OUT/hello.out"
    }
    # TESSERA_SOCKET_IFNAME picks the interface; one that matches nothing is
    # refused on every rank, naming the interfaces there are.
    run_on_hosts 2 2 TESSERA_SOCKET_IFNAME=eth -- "$BIN/tessera_hello" --comm
    [ "$(cat "$OUT/rc.0")" = 0 ] && [ "$(cat "$OUT/rc.1")" = 0 ] && pass "TESSERA_SOCKET_IFNAME=eth" ||
      fail "TESSERA_SOCKET_IFNAME=eth: exit $(cat "$OUT/rc.0") / $(cat "$OUT/rc.1")"
    run_on_hosts 2 2 TESSERA_SOCKET_IFNAME=ib TESSERA_TIMEOUT_S=10 -- "$BIN/tessera_hello" --comm
    if [ "$(cat "$OUT/rc.0")" != 0 ] && grep -q "no interface matches TESSERA_SOCKET_IFNAME='ib' (IPv4 interfaces up: lo 127.0.0.1, eth0 $RIG_SUBNET_PREFIX.[12])" "$OUT/run.0"; then
      pass "TESSERA_SOCKET_IFNAME=ib refused, naming the interfaces"
    else
      fail "TESSERA_SOCKET_IFNAME=ib: exit $(cat "$OUT/rc.0")"
      tail -n 20 "$OUT/run.0"
    fi
    ;;
  *)
    echo "unknown case '$CASE'" >&2
    exit 2
    ;;
esac
[ -n "${KEEP_OUT:-}" ] && echo "outputs kept in $OUT" || cleanup_out
if [ "$FAILS" -gt 0 ]; then
  echo "$CASE: $FAILS check(s) failed"
  exit 1
fi
echo "$CASE: all checks passed"
