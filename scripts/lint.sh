#!/usr/bin/env bash
# Format and lint checks with Debian's clang-format and clang-tidy, against
# the checked-in .clang-format and .clang-tidy.
#
#   scripts/lint.sh              check format and run clang-tidy (needs a configured build/)
#   scripts/lint.sh --format     check format only (fast; ctest runs this)
#   scripts/lint.sh --tidy       run clang-tidy only
#   scripts/lint.sh --fix        rewrite files with clang-format (tidy findings are fixed by hand)
#
# Exits non-zero naming each file that is not formatted and each clang-tidy
# finding. TESSERA_BUILD_DIR picks the build whose compile_commands.json tidy
# reads (default build/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TESSERA_BUILD_DIR:-$ROOT/build}"
cd "$ROOT"

mode=all
case "${1:-}" in
  "") ;;
  --format) mode=format ;;
  --tidy) mode=tidy ;;
  --fix) mode=fix ;;
  *) echo "usage: scripts/lint.sh [--format|--tidy|--fix]" >&2; exit 2 ;;
esac

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "lint: $1 not found (Debian package $2; scripts/install-deps.sh installs it)" >&2; exit 1; }
}

# Tracked C++ sources (and untracked ones git does not ignore).
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.cc' '*.h' | grep -v '^build')

status=0
if [ "$mode" = fix ]; then
  need clang-format clang-format
  clang-format -i "${files[@]}"
  exit 0
fi

if [ "$mode" = all ] || [ "$mode" = format ]; then
  need clang-format clang-format
  bad=()
  for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "lint: ${#bad[@]} file(s) not formatted per .clang-format (run scripts/lint.sh --fix):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    status=1
  else
    echo "lint: clang-format: ${#files[@]} files formatted"
  fi
fi

if [ "$mode" = all ] || [ "$mode" = tidy ]; then
  need clang-tidy clang-tidy
  need run-clang-tidy clang-tidy
  [ -f "$BUILD_DIR/compile_commands.json" ] || { echo "lint: $BUILD_DIR/compile_commands.json missing: configure first (scripts/test.sh)" >&2; exit 1; }
  # Translation units only; headers are checked through HeaderFilterRegex.
  # integrations/torch compiles against PyTorch's headers, which Debian's
  # clang-tidy 14 cannot parse (c10::IValue incomplete types): left to GCC's -Werror.
  mapfile -t tus < <(printf '%s\n' "${files[@]}" | grep '\.cc$' | grep -v '^integrations/')
  log="$(mktemp)"
  trap 'rm -f "$log"' EXIT
  # The compile commands are GCC's: clang does not know some GCC-only warning
  # flags (tests/faults adds -Wno-maybe-uninitialized for GCC), so tell it to
  # ignore warning options it does not know.
  if ! run-clang-tidy -quiet -p "$BUILD_DIR" -j "${TESSERA_JOBS:-$(nproc)}" \
    -extra-arg=-Wno-unknown-warning-option "${tus[@]/#/$ROOT/}" >"$log" 2>&1; then
    grep -E 'warning:|error:' "$log" | sort -u >&2 || cat "$log" >&2
    echo "lint: clang-tidy found problems (above)" >&2
    status=1
  else
    echo "lint: clang-tidy: ${#tus[@]} translation units clean"
  fi
fi
exit $status
