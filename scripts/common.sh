# Shared by scripts/demo.sh and scripts/test.sh: install what is missing, then
# configure and build into build/ (or $TESSERA_BUILD_DIR).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TESSERA_BUILD_DIR:-$ROOT/build}"
JOBS="${TESSERA_JOBS:-$(nproc)}"

# OpenMPI refuses to run as root unless both variables are set.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Ranks usually outnumber cores here: one BLAS thread per process.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"

tessera_build() {
  "$ROOT/scripts/install-deps.sh"
  local extra=()
  [ "${CI:-}" = "true" ] && extra+=(-DTESSERA_WERROR=ON)
  # Always passed, so a build dir reused without TESSERA_SANITIZE drops a
  # sanitizer left in its cache by an earlier run.
  extra+=("-DTESSERA_SANITIZE=${TESSERA_SANITIZE:-}")
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${TESSERA_BUILD_TYPE:-RelWithDebInfo}" "${extra[@]}" >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
}
