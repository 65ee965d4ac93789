#!/usr/bin/env bash
# Wall time of launching a job whose workers join, pass a barrier and exit:
# `tessera run --nproc-per-node N` against `mpirun --oversubscribe -np N` of
# the same program (build/bin/tessera_hello), alternated in one run.
#
#   launcher/bench_launch.sh [BUILD_DIR] [N] [REPS] [-- extra tessera_hello flags, e.g. --comm]
#
# MPI=0 skips mpirun (e.g. `MPI=0 launcher/bench_launch.sh build 128 5`: 128
# local workers start, meet at a barrier and exit). The machine's load
# average is printed before and after: the figures are only as quiet as it.
# mpirun runs at its best settings for a start on one host: only the
# shared-memory transport (pml ob1, btl self,vader) and none of the network
# stacks that MPI_Init would otherwise probe (UCX, libfabric, PSM): a
# quarter less time to the first barrier than the defaults on this machine.
# MPI_FLAGS replaces them (MPI_FLAGS= for OpenMPI's defaults).
set -euo pipefail
BUILD=${1:-build}
N=${2:-8}
REPS=${3:-10}
shift $(( $# < 3 ? $# : 3 ))
[[ ${1:-} == -- ]] && shift
EXTRA=("$@")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
TESSERA=$BUILD/bin/tessera
HELLO=$BUILD/bin/tessera_hello
[[ -x $TESSERA && -x $HELLO ]] || { echo "build tessera and tessera_hello first ($BUILD/bin)" >&2; exit 2; }

# Prints "BARRIER TOTAL" in seconds: until the N-th worker printed that it
# passed the first barrier ("rank R of N ok", flushed after the barrier),
# and until the job ended. Fails the script if the job fails. The reader
# starts the job itself, after its own start-up: timing from before a
# `date | python3` pipe counted the interpreter's start (0.2 s through a
# pyenv shim) and floored the figure of any job faster than that.
time_one() {
  python3 -c '
import subprocess, sys, time
n, cmd, seen, at = int(sys.argv[1]), sys.argv[2:], 0, None
with open("/tmp/bench_launch.log", "wb") as err:
    s = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    for line in iter(p.stdout.readline, ""):
        if " ok (round 0)" in line:
            seen += 1
            if seen == n: at = time.time()
    rc = p.wait()
end = time.time()
print("%.4f %.4f" % ((at or float("nan")) - s, end - s))
sys.exit(0 if seen == n and rc == 0 else 1)' "$N" "$@" || { echo "failed: $* (stderr in /tmp/bench_launch.log)" >&2; cat /tmp/bench_launch.log >&2; exit 1; }
}

stats() {  # min median mean of the numbers on stdin (one a line)
  sort -g | awk '{a[NR]=$1; s+=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2;
                 printf "min %.3f s  median %.3f s  mean %.3f s  (n=%d)\n", a[1], m, s/NR, NR}'
}

MPI=${MPI:-1}
best_mpi_flags="--mca pml ob1 --mca btl self,vader --mca mtl ^ofi,psm,psm2 --mca osc ^ucx"
read -r -a MPI_ARGS <<<"${MPI_FLAGS-$best_mpi_flags}"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
t_run=() t_mpi=()
time_one "$TESSERA" run --nproc-per-node "$N" -- "$HELLO" "${EXTRA[@]}" >/dev/null  # warm the page cache
for ((i = 0; i < REPS; i++)); do
  t_run+=("$(time_one "$TESSERA" run --nproc-per-node "$N" -- "$HELLO" "${EXTRA[@]}")")
  [[ $MPI == 0 ]] || t_mpi+=("$(time_one mpirun --oversubscribe -np "$N" "${MPI_ARGS[@]}" "$HELLO" "${EXTRA[@]}")")
done
echo "machine: $(nproc) cores, load average $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after; $N workers; $REPS runs each; hello flags: ${EXTRA[*]:-(none)}"
[[ $MPI == 0 ]] || echo "mpirun flags: --oversubscribe ${MPI_ARGS[*]:-(the OpenMPI defaults)}"
col() { printf '%s\n' "${@:2}" | awk -v c="$1" '{print $c}'; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
for what in "1 to the first barrier" "2 whole job"; do
  c=${what%% *}
  echo "${what#* }:"
  printf '  tessera run --nproc-per-node %d : ' "$N"; col "$c" "${t_run[@]}" | stats
  if [[ $MPI != 0 ]]; then
    printf '  mpirun --oversubscribe -np %d  : ' "$N"; col "$c" "${t_mpi[@]}" | stats
    echo "  median ratio mpirun / tessera run: $(echo "$(col "$c" "${t_mpi[@]}" | median) / $(col "$c" "${t_run[@]}" | median)" | bc -l | cut -c1-5)x"
  fi
done
