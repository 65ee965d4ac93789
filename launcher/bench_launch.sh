#!/usr/bin/env bash
# Wall time of launching a job whose workers join, pass a barrier and exit:
# `tessera run --nproc-per-node N` against `mpirun --oversubscribe -np N` of
# the same program (build/bin/tessera_hello), alternated in one run.
#
#   launcher/bench_launch.sh [BUILD_DIR] [N] [REPS] [-- extra tessera_hello flags, e.g. --comm]
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

time_one() {  # prints seconds; fails the script if the job fails
  local s e
  s=$(date +%s.%N)
  "$@" >/tmp/bench_launch.log 2>&1 || { echo "failed: $* (output in /tmp/bench_launch.log)" >&2; cat /tmp/bench_launch.log >&2; exit 1; }
  e=$(date +%s.%N)
  echo "$e - $s" | bc -l
}

stats() {  # min median mean of the numbers on stdin
  sort -g | awk '{a[NR]=$1; s+=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2;
                 printf "min %.3f s  median %.3f s  mean %.3f s  (n=%d)\n", a[1], m, s/NR, NR}'
}

t_run=() t_mpi=()
time_one "$TESSERA" run --nproc-per-node "$N" -- "$HELLO" "${EXTRA[@]}" >/dev/null  # warm the page cache
for ((i = 0; i < REPS; i++)); do
  t_run+=("$(time_one "$TESSERA" run --nproc-per-node "$N" -- "$HELLO" "${EXTRA[@]}")")
  t_mpi+=("$(time_one mpirun --oversubscribe -np "$N" "$HELLO" "${EXTRA[@]}")")
done
echo "machine: $(nproc) cores; $N workers; $REPS runs each; hello flags: ${EXTRA[*]:-(none)}"
printf 'tessera run --nproc-per-node %d : ' "$N"; printf '%s\n' "${t_run[@]}" | stats
printf 'mpirun --oversubscribe -np %d  : ' "$N"; printf '%s\n' "${t_mpi[@]}" | stats
