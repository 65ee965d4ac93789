// GEMM throughput at a GPT's GEMM shapes, the yardstick of train_gpt's
// --bench-sgemm mode and of bench_gemm (fp32 against bf16): the forward
// (NN), input-gradient (NT) and weight-gradient (TN) products of QKV,
// attention output, MLP up and down and the LM head for `rows` tokens, each
// timed over repetitions, FLOP/s = total FLOPs / total time. Host buffers;
// single caller thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/model_config.h"
#include "runtime/dtype.h"

namespace tessera::gpt {

// One product C[m, n] (+)= op(A) op(B) over k.
struct GemmShape {
  std::string what;  // "qkv NN", ...
  bool ta = false, tb = false, accumulate = false;
  int64_t m = 0, n = 0, k = 0;
};
// The model's GEMMs for `rows` tokens (three per weight: forward, input and weight gradient).
std::vector<GemmShape> model_gemm_shapes(const parallel::ModelConfig& cfg, int64_t rows);

// Runs `shapes` (sgemm for F32, bf16::gemm for BF16) for at least
// `min_seconds`; returns FLOP/s.
double measure_gemm_flops(const std::vector<GemmShape>& shapes, DType dtype, double min_seconds);
// sgemm at the model's shapes.
double measure_sgemm_flops(const parallel::ModelConfig& cfg, int64_t rows, double min_seconds);

}  // namespace tessera::gpt
