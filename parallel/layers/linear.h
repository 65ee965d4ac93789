// Tensor-parallel linear layers (Megatron-LM / NxD ColumnParallelLinear and
// RowParallelLinear), weights stored [in, out] as Hugging Face's Conv1D.
//
// Activations are row-major [rows, features]. Without sequence parallelism
// the input of a column-parallel layer and the output of a row-parallel one
// are replicated over the TP group (all-reduce in the column layer's backward
// and the row layer's forward). With it they hold rows / tp rows of the
// sequence-sharded activations: the column layer all-gathers its input (and
// reduce-scatters its input gradient), the row layer reduce-scatters its
// output (and all-gathers its output gradient).
//
// forward() keeps a pointer to its input for backward(): the caller keeps the
// input alive and unchanged until then. Gradients accumulate (+=) into the
// Parameters' grad buffers so micro-batches accumulate for free.
// Not thread-safe; one instance per layer.
#pragma once

#include <string>

#include "parallel/layers/parallel_state.h"
#include "parallel/layers/parameter.h"

namespace tessera::parallel::layers {

class ColumnParallelLinear {
 public:
  // out_features is split over TP; `chunks` > 1 splits each of `chunks` equal
  // blocks of the outputs separately (fused QKV: each rank gets its heads of q, k and v).
  ColumnParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features, int chunks,
                       const ParallelState& ps, float init_std);

  int64_t in_features() const { return in_; }
  int64_t out_local() const { return out_local_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

  // x: [rows_in, in], rows_in = rows / tp under SP else rows. y: [rows, out_local] = x W + b.
  void forward(const float* x, int64_t rows, float* y);
  // dy: [rows, out_local]. Writes dx [rows_in, in] (already reduced over TP).
  void backward(const float* dy, int64_t rows, float* dx);

 private:
  const ParallelState& ps_;
  int64_t in_, out_local_;
  Parameter weight_, bias_;
  const float* input_ = nullptr;  // full [rows, in] input of the last forward
  Tensor gathered_, dx_full_;
};

class RowParallelLinear {
 public:
  // in_features is split over TP; the bias is replicated.
  RowParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features, const ParallelState& ps,
                    float init_std);

  int64_t in_local() const { return in_local_; }
  int64_t out_features() const { return out_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

  // x: [rows, in_local]. out: [rows_out, out] = residual + reduce_tp(x W) + b, rows_out = rows / tp under SP.
  // The residual add is fused; `out` must not alias x.
  void forward(const float* x, int64_t rows, const float* residual, float* out);
  // dout: [rows_out, out]. Writes dx [rows, in_local].
  void backward(const float* dout, int64_t rows, float* dx);

 private:
  const ParallelState& ps_;
  int64_t in_local_, out_;
  Parameter weight_, bias_;
  const float* input_ = nullptr;
  Tensor partial_, scattered_, dout_full_;
};

}  // namespace tessera::parallel::layers
