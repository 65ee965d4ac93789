// Element-wise reduction kernels of the collectives (f32, i32, i64; bf16 and
// f16 are reduced by the communicator in an f32 workspace, so they
// accumulate in f32). Avg is reduced as Sum and divided at the end.
// Stateless and thread-safe; no allocation.
#pragma once

#include <cstddef>
#include <cstring>

#include "collectives/communicator.h"

namespace tessera::collectives {

// dst[i] = a[i] op b[i] for n elements (dst may alias a or b). Large
// out-of-place outputs (reduce2_streams) are written with streaming stores,
// bypassing the cache; the results are the same either way.
void reduce2(void* dst, const void* a, const void* b, size_t n, DType dtype, ReduceOp op);
// True when reduce2 of n elements writes with streaming stores (dst aliasing
// neither input: !aliased; at least 1 MiB; an x86-64 CPU with AVX2).
bool reduce2_streams(size_t n, DType dtype, bool aliased);
// Streaming (non-temporal) stores for the shm algorithms' large outputs:
// streaming_stores() says whether this CPU has them (x86-64 with AVX2);
// copy_streaming(dst, src, bytes) copies with them (a plain memcpy without),
// and streaming_fence() orders them before a later store (a publish round
// that tells the peers the data is there). The copy leaves dst out of the
// cache: only for outputs not read again soon.
bool streaming_stores();
void copy_streaming(void* dst, const void* src, size_t bytes);
// memcpy (the same signature as copy_streaming, to choose between them).
inline void copy_cached(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
void streaming_fence();
// buf[i] /= divisor (Avg; integers truncate toward zero).
void divide(void* buf, size_t n, DType dtype, int divisor);
// True for dtypes the kernels take directly.
inline bool kernel_dtype(DType t) { return t == DType::F32 || t == DType::I32 || t == DType::I64; }

}  // namespace tessera::collectives
