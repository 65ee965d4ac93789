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
# Tests labelled "long" (minutes of training) run with: scripts/test.sh -L long
if [ $# -eq 0 ]; then set -- -LE long; fi
# Tests labelled "multihost" run jobs across test hosts made of namespaces
# (tests/multihost/rig.sh); they need root and skip elsewhere. Say which.
if why="$(source "$ROOT/tests/multihost/rig.sh" && rig_can_run)"; then
  echo "multihost tests: will run (root can create network namespaces here)"
else
  echo "multihost tests: SKIPPED on this machine: $why"
fi
ctest --output-on-failure -j "${TESSERA_TEST_JOBS:-2}" --timeout 600 "$@"
