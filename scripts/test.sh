#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
# Extra arguments go to ctest (e.g. scripts/test.sh -R Collectives).
# TESSERA_SANITIZE=address|undefined|thread builds into build-<sanitizer>/.
source "$(dirname "$0")/common.sh"
if [ -n "${TESSERA_SANITIZE:-}" ] && [ -z "${TESSERA_BUILD_DIR:-}" ]; then
  BUILD_DIR="$ROOT/build-$TESSERA_SANITIZE"
fi
tessera_build
cd "$BUILD_DIR"
# Tests labelled "long" (minutes of training) run with: scripts/test.sh -L long;
# clang-tidy over the tree (minutes) with: scripts/test.sh -L tidy.
if [ $# -eq 0 ]; then set -- -LE 'long|tidy'; fi
# Tests labelled "multihost" run jobs across test hosts made of namespaces
# (tests/multihost/rig.sh); they need root and skip elsewhere. Say which.
if why="$(source "$ROOT/tests/multihost/rig.sh" && rig_can_run)"; then
  echo "multihost tests: will run (root can create network namespaces here)"
else
  echo "multihost tests: SKIPPED on this machine: $why"
fi
# Concurrent mpiruns (two tests at once) race to create OpenMPI's per-host
# session directory, which each removes again when it is empty at exit: one
# of ~60 failed here with "mkdir ... /tmp/ompi.HOST.UID: File exists". A
# non-empty file named output-* is one OpenMPI's cleanup keeps, so the
# directory stays and nobody creates it concurrently.
ompi_top="${TMPDIR:-/tmp}/ompi.$(hostname | cut -d. -f1).$(id -u)"
mkdir -p -m 700 "$ompi_top" && echo "kept by tessera's scripts/test.sh" > "$ompi_top/output-tessera-keep" || true
rc=0
ctest --output-on-failure -j "${TESSERA_TEST_JOBS:-2}" --timeout 600 "$@" || rc=$?
# ctest lists skipped tests without their reasons: print each with the reason
# its GTEST_SKIP() gave (from the full log of the run), and how many there were.
log="$BUILD_DIR/Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  awk '
    /^[0-9]+\/[0-9]+ Test: / { name = $3 }
    /: Skipped$/ { want = 1; next }
    want { reason[name] = $0; want = 0 }
    /^\[  SKIPPED \] / && name != "" && !(name in seen) { seen[name] = 1; order[++n] = name }
    END {
      printf "%d test(s) skipped\n", n
      for (i = 1; i <= n; ++i) printf "  skipped: %s: %s\n", order[i], (order[i] in reason ? reason[order[i]] : "(no reason given)")
    }' "$log"
fi
exit "$rc"
