#!/usr/bin/env bash
# A worker binary loads no MPI at start (launcher/mpi_boot.h loads it under
# mpirun only) and, with TESSERA_STATIC_GRPC, no shared gRPC, protobuf or
# abseil: each costs every worker's start CPU (docs/launcher.md, Benchmark).
# That the worker still joins under mpirun is launcher_run_test's (MpiRun*).
# --forbid REGEX names more libraries none of the binaries may load (the
# `tessera` front-end: no OpenBLAS or oneDNN either, launcher/front_end.h).
#
#   worker_libs_test.sh STATIC_GRPC(ON|OFF) [--forbid REGEX] BINARY...
set -uo pipefail
STATIC="${1:?usage: worker_libs_test.sh ON|OFF [--forbid REGEX] BINARY...}"
shift
FORBID=""
if [[ ${1:-} == --forbid ]]; then
  FORBID="${2:?--forbid needs a regular expression}"
  shift 2
fi
FAILS=0
for bin in "$@"; do
  libs="$(ldd "$bin")" || { echo "FAIL: ldd $bin"; FAILS=$((FAILS + 1)); continue; }
  if grep -E 'libmpi|libopen-(rte|pal)|libpmix|libhwloc' <<<"$libs"; then
    echo "FAIL: $bin loads MPI at start (above)"
    FAILS=$((FAILS + 1))
  fi
  if [[ $STATIC =~ ^(ON|1|TRUE|YES)$ ]] && grep -E 'libgrpc|libgpr|libprotobuf|libabsl_|libupb' <<<"$libs"; then
    echo "FAIL: $bin loads gRPC, protobuf or abseil as shared libraries with TESSERA_STATIC_GRPC=ON (above)"
    FAILS=$((FAILS + 1))
  fi
  if [[ -n $FORBID ]] && grep -E "$FORBID" <<<"$libs"; then
    echo "FAIL: $bin loads a library it must not (above; forbidden: $FORBID)"
    FAILS=$((FAILS + 1))
  fi
  echo "$bin: $(wc -l <<<"$libs") shared objects"
done
[ "$FAILS" -eq 0 ] && echo "PASS" || exit 1
