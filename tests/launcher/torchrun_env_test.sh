#!/usr/bin/env bash
# Every variable torchrun (torch/distributed/run.py, its LocalElasticAgent)
# gives a worker, checked against torchrun's definition under `tessera run`:
# a 2-node job (2 + 3 workers, two agents on this host) and a restart.
#
#   torchrun_env_test.sh TESSERA_BIN
set -uo pipefail
TESSERA="${1:?usage: torchrun_env_test.sh TESSERA_BIN}"
OUT="$(mktemp -d /tmp/tessera-torchrun-env.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT
FAILS=0
fail() {
  echo "FAIL: $*"
  FAILS=$((FAILS + 1))
}
VARS="RANK LOCAL_RANK GROUP_RANK ROLE_RANK ROLE_NAME LOCAL_WORLD_SIZE WORLD_SIZE GROUP_WORLD_SIZE ROLE_WORLD_SIZE
MASTER_ADDR MASTER_PORT TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID
TORCHELASTIC_USE_AGENT_STORE NCCL_ASYNC_ERROR_HANDLING OMP_NUM_THREADS TESSERA_COORDINATOR"
# Each worker writes its variables to $OUT/<tag>.<RANK>; rank 0 also binds
# MASTER_PORT as torch's TCPStore does (SO_REUSEADDR, all interfaces) and
# every other rank connects to it: the port is free for rank 0's store.
cat >"$OUT/worker.sh" <<'EOT'
#!/usr/bin/env bash
set -u
tag="$1"; shift
for v in $VARS; do printf '%s=%s\n' "$v" "${!v-<unset>}"; done >"$OUT/$tag.$RANK"
if [ "${FAIL_FIRST_ROUND:-}" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 3; fi
python3 - "$OUT/$tag.store.$RANK" <<'EOP'
import os, socket, sys, time
rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
n = int(os.environ["WORLD_SIZE"])
if rank == 0:
    s = socket.socket(socket.AF_INET6)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port)); s.listen(64); s.settimeout(30)
    for _ in range(n - 1): c, _ = s.accept(); c.sendall(b"ok"); c.close()
    res = "served %d" % (n - 1)
else:
    deadline = time.time() + 30
    while True:
        try:
            c = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=5); break
        except OSError:
            if time.time() > deadline: raise
            time.sleep(0.05)
    res = c.recv(2).decode()
open(sys.argv[1], "w").write(res + "\n")
EOP
EOT
chmod +x "$OUT/worker.sh"
export OUT VARS
unset OMP_NUM_THREADS NCCL_ASYNC_ERROR_HANDLING
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
export TESSERA_JOB_TOKEN=torchrun-env-test
"$TESSERA" run --nnodes 2 --node-rank 1 --nproc-per-node 3 --coordinator "127.0.0.1:$port" --max-restarts 2 \
  -- "$OUT/worker.sh" two >"$OUT/n1.log" 2>&1 &
n1=$!
"$TESSERA" run --nnodes 2 --node-rank 0 --nproc-per-node 2 --coordinator "127.0.0.1:$port" --max-restarts 2 \
  -- "$OUT/worker.sh" two >"$OUT/n0.log" 2>&1
rc0=$?
wait $n1
rc1=$?
[ $rc0 = 0 ] && [ $rc1 = 0 ] || fail "2-node job: exit $rc0 / $rc1: $(tail -n 5 "$OUT/n0.log" "$OUT/n1.log")"
get() { sed -n "s/^$2=//p" "$OUT/$1"; }
run_id="$(get two.0 TORCHELASTIC_RUN_ID)"
master_port="$(get two.0 MASTER_PORT)"
[ -n "$run_id" ] || fail "TORCHELASTIC_RUN_ID empty"
[ "$master_port" != "$port" ] || fail "MASTER_PORT is the coordinator's port $port"
for r in 0 1 2 3 4; do
  f="two.$r"
  [ -e "$OUT/$f" ] || {
    fail "rank $r wrote nothing"
    continue
  }
  node=$((r < 2 ? 0 : 1))
  local_rank=$((r < 2 ? r : r - 2))
  nproc=$((r < 2 ? 2 : 3))
  # name, torchrun's definition (the value it has here)
  for want in "RANK=$r" "LOCAL_RANK=$local_rank" "GROUP_RANK=$node" "ROLE_RANK=$r" "ROLE_NAME=default" \
    "LOCAL_WORLD_SIZE=$nproc" "WORLD_SIZE=5" "GROUP_WORLD_SIZE=2" "ROLE_WORLD_SIZE=5" "MASTER_ADDR=127.0.0.1" \
    "MASTER_PORT=$master_port" "TORCHELASTIC_RESTART_COUNT=0" "TORCHELASTIC_MAX_RESTARTS=2" \
    "TORCHELASTIC_RUN_ID=$run_id" "TORCHELASTIC_USE_AGENT_STORE=False" "NCCL_ASYNC_ERROR_HANDLING=1" \
    "OMP_NUM_THREADS=1" "TESSERA_COORDINATOR=127.0.0.1:$port"; do
    grep -qx "$want" "$OUT/$f" || fail "rank $r: want $want, got $(grep "^${want%%=*}=" "$OUT/$f")"
  done
  want_store=$([ $r = 0 ] && echo "served 4" || echo ok)
  [ "$(cat "$OUT/two.store.$r" 2>/dev/null)" = "$want_store" ] ||
    fail "rank $r: store at MASTER_PORT: '$(cat "$OUT/two.store.$r" 2>/dev/null)' (want '$want_store')"
done
# One node, one worker, the user's OMP_NUM_THREADS and NCCL_ASYNC_ERROR_HANDLING
# kept; torchrun sets OMP_NUM_THREADS=1 only for more than one local worker.
unset TESSERA_JOB_TOKEN
"$TESSERA" run --nproc-per-node 1 -- "$OUT/worker.sh" one >"$OUT/one.log" 2>&1 || fail "1 worker: $(tail -n 5 "$OUT/one.log")"
grep -qx "OMP_NUM_THREADS=<unset>" "$OUT/one.0" || fail "1 worker: $(grep OMP_NUM "$OUT/one.0")"
OMP_NUM_THREADS=3 NCCL_ASYNC_ERROR_HANDLING=0 "$TESSERA" run --nproc-per-node 2 -- "$OUT/worker.sh" kept \
  >"$OUT/kept.log" 2>&1 || fail "kept: $(tail -n 5 "$OUT/kept.log")"
grep -qx "OMP_NUM_THREADS=3" "$OUT/kept.1" && grep -qx "NCCL_ASYNC_ERROR_HANDLING=0" "$OUT/kept.1" ||
  fail "the user's OMP_NUM_THREADS / NCCL_ASYNC_ERROR_HANDLING not kept: $(cat "$OUT/kept.1")"
grep -qx "MASTER_ADDR=127.0.0.1" "$OUT/kept.0" || fail "one node: $(grep MASTER_ADDR "$OUT/kept.0")"
[ "$(cat "$OUT/kept.store.0" 2>/dev/null)" = "served 1" ] || fail "one node: rank 0's store at MASTER_PORT"
c="$(get kept.0 TESSERA_COORDINATOR)"
[ "$(get kept.0 MASTER_PORT)" != "${c##*:}" ] || fail "one node: MASTER_PORT is the coordinator's port"
# A restart: rank 1 fails in round 0; round 1 has TORCHELASTIC_RESTART_COUNT=1.
FAIL_FIRST_ROUND=1 "$TESSERA" run --nproc-per-node 2 --max-restarts 1 -- "$OUT/worker.sh" restart \
  >"$OUT/restart.log" 2>&1 || fail "restart: $(tail -n 5 "$OUT/restart.log")"
for r in 0 1; do
  grep -qx "TORCHELASTIC_RESTART_COUNT=1" "$OUT/restart.$r" && grep -qx "TORCHELASTIC_MAX_RESTARTS=1" "$OUT/restart.$r" ||
    fail "restart: rank $r: $(grep TORCHELASTIC_ "$OUT/restart.$r")"
done
if [ "$FAILS" -gt 0 ]; then
  echo "torchrun_env_test: $FAILS check(s) failed"
  exit 1
fi
echo "torchrun_env_test: every torchrun variable as torchrun defines it"
