#!/usr/bin/env bash
# Layer check (docs/architecture.md): dependencies point down only.
#   runtime/ < collectives/ < parallel/ < launcher/, examples/, integrations/
# A source under one of these folders may include ("...") its own folder or a
# lower one. launcher/ and examples/ are both on top: examples/ may include
# the launcher's worker bootstrap, launcher/ never includes examples/. No
# library or program includes tests/. Prints file:line for every include
# that breaks this and exits 1; exits 0 when there is none.
# Usage: layer_check.sh [SOURCE_ROOT]   (default: the repository root)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
cd "$root"

rank() {
  case "$1" in
    runtime) echo 0 ;;
    collectives) echo 1 ;;
    parallel) echo 2 ;;
    launcher | examples | integrations) echo 3 ;;
    tests) echo 4 ;;
    *) echo -1 ;;  # not a layer (system or generated headers such as tessera_version.h)
  esac
}

bad=0
checked=0
while IFS= read -r -d '' file; do
  from="${file%%/*}"
  from_rank="$(rank "$from")"
  lineno=0
  while IFS= read -r line || [ -n "$line" ]; do
    lineno=$((lineno + 1))
    [[ "$line" =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
    target="${BASH_REMATCH[1]}"
    checked=$((checked + 1))
    [[ "$target" == */* ]] || continue  # same folder
    to="${target%%/*}"
    to_rank="$(rank "$to")"
    [ "$to_rank" -ge 0 ] || continue
    why=""
    if [ "$to_rank" -gt "$from_rank" ]; then
      why="$from/ is below $to/"
    elif [ "$from" = launcher ] && [ "$to" = examples ]; then
      why="launcher/ must not include examples/ (programs call the launcher, not the other way)"
    elif [ "$to" = integrations ] && [ "$from" != integrations ]; then
      why="nothing includes integrations/ (bindings to other frameworks, on top of the libraries)"
    fi
    if [ -n "$why" ]; then
      echo "$file:$lineno: includes \"$target\": $why (layers: runtime < collectives < parallel < launcher, examples)"
      bad=$((bad + 1))
    fi
  done <"$file"
done < <(find runtime collectives parallel launcher examples integrations -type f \
  \( -name '*.h' -o -name '*.cc' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.c' \) -print0 | sort -z)

if [ "$bad" -gt 0 ]; then
  echo "layer_check: $bad include(s) reach up a layer"
  exit 1
fi
echo "layer_check: $checked includes checked, none reaches up a layer"
