#!/usr/bin/env bash
# README's shell blocks are run from the checkout by newcomers copying them:
# every tessera, train_gpt or generate command there names its built path
# (build/bin/tessera), never a bare `tessera` that is not on PATH.
# Prints README.md:LINE for each offender; exits 1 when there is one.
set -euo pipefail
readme="${1:?usage: readme_commands.sh README.md}"
bad=$(awk '/^```/ { inblock = !inblock; next }
           inblock && /^(tessera|train_gpt|generate)( |$)/ { printf "%s:%d: bare command (use build/bin/%s): %s\n", FILENAME, NR, $1, $0 }' "$readme")
if [[ -n "$bad" ]]; then
  echo "$bad"
  exit 1
fi
echo "README commands name build/bin paths"
