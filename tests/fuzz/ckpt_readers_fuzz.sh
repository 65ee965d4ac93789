#!/usr/bin/env bash
# Builds tests/fuzz/ckpt_readers_fuzz.cc with clang++ -fsanitize=fuzzer,address
# (the reader sources compiled with clang and ASan; the rest of tessera linked
# from the gcc-built static libraries) and runs it for a bounded time on a
# seed corpus the target writes itself. Exit 0: no crash, leak, ASan report
# or timeout. Exit 77 (ctest: skipped) when clang's libFuzzer is not installed.
# Usage: ckpt_readers_fuzz.sh SOURCE_DIR BUILD_DIR WORK_DIR SECONDS
set -euo pipefail
src=$1 build=$2 work=$3 secs=${4:-30}
cxx=$(command -v clang++ || true)
if [ -z "$cxx" ]; then echo "ckpt_readers_fuzz: clang++ not installed (apt-get install clang libclang-rt-14-dev)"; exit 77; fi
mkdir -p "$work"
bin=$work/ckpt_readers_fuzz
objs=()
# An object is rebuilt when its source or any header it may include changed
# (a stale object compiled against an older class layout breaks the ODR).
for f in tests/fuzz/ckpt_readers_fuzz.cc parallel/checkpoint/safetensors.cc parallel/checkpoint/checkpoint.cc \
         parallel/checkpoint/ckpt_tool.cc; do
  o=$work/$(basename "$f").o
  if [ ! -f "$o" ] || [ "$src/$f" -nt "$o" ] ||
     [ -n "$(find "$src/runtime" "$src/collectives" "$src/parallel" -name '*.h' -newer "$o" -print -quit)" ]; then
    "$cxx" -std=c++20 -g -O1 -fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer \
      -I"$src" -I"$build/parallel" -I"$build/parallel/gen" -c "$src/$f" -o "$o"
  fi
  objs+=("$o")
done
if ! "$cxx" -fsanitize=fuzzer,address "${objs[@]}" -o "$bin" -L"$build/lib" \
    -Wl,--start-group -ltessera_parallel -ltessera_collectives -ltessera_plan_proto -ltessera_runtime -Wl,--end-group \
    -lprotobuf -lspdlog -lfmt -lopenblas -ldnnl -lgomp -lcrypto -lpthread 2>"$work/link.log"; then
  if grep -q "libclang_rt.fuzzer" "$work/link.log"; then
    echo "ckpt_readers_fuzz: libFuzzer runtime missing (apt-get install libclang-rt-14-dev)"; exit 77
  fi
  cat "$work/link.log"; exit 1
fi
rm -rf "$work/corpus" "$work/seeds"
mkdir -p "$work/corpus"
TESSERA_FUZZ_SEEDS=$work/seeds "$bin" -runs=0 "$work/corpus" >/dev/null 2>&1
cd "$work"  # crash-* files land here
exec "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  "$work/corpus" "$work/seeds"
