// sgemm throughput at a GPT's GEMM shapes, the yardstick of train_gpt's
// --bench-sgemm mode: the forward (NN), input-gradient (NT) and
// weight-gradient (TN) products of QKV, attention output, MLP up and down
// and the LM head for `rows` tokens, each timed over repetitions, FLOP/s
// = total FLOPs / total time. Host buffers; single caller thread.
#pragma once

#include <cstdint>

#include "parallel/model_config.h"

namespace tessera::gpt {

// Runs for at least `min_seconds`; returns FLOP/s.
double measure_sgemm_flops(const parallel::ModelConfig& cfg, int64_t rows, double min_seconds);

}  // namespace tessera::gpt
