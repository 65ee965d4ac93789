// Tensor-parallel linear layers (Megatron-LM / NxD ColumnParallelLinear and
// RowParallelLinear). The weight layout is an option: [in, out] as Hugging
// Face's Conv1D (GPT-2; the default), or [out, in] as torch.nn.Linear (Llama):
// column-parallel layers split the output dimension (dim 1 of Conv1D, dim 0
// of Linear), row-parallel ones the input dimension (dim 0 of Conv1D, dim 1
// of Linear). Biases are optional (LinearOptions::bias).
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
#include <vector>

#include "parallel/layers/parallel_state.h"
#include "parallel/layers/parameter.h"

namespace tessera::parallel::layers {

enum class WeightLayout {
  kConv1D,  // [in, out]: y = x W
  kLinear,  // [out, in]: y = x W^T
};

struct LinearOptions {
  WeightLayout layout = WeightLayout::kConv1D;
  bool bias = true;  // false: no bias Parameter (bias() is an unbound placeholder)
  // Column-parallel only: pieces of the outputs (0: tp_size). With
  // tp_parts < tp_size, tp_size / tp_parts consecutive TP ranks hold the same
  // piece (grouped-query attention's K/V heads when tp exceeds them) and sum
  // its weight and bias gradients over ps.kv (the group of those ranks).
  int tp_parts = 0;
};

class ColumnParallelLinear {
 public:
  // out_features is split over TP; `chunks` > 1 splits each of `chunks` equal
  // blocks of the outputs separately (fused QKV: each rank gets its heads of q, k and v).
  ColumnParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features, int chunks,
                       const ParallelState& ps, float init_std);
  ColumnParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features, int chunks,
                       const ParallelState& ps, float init_std, const LinearOptions& options);

  int64_t in_features() const { return in_; }
  int64_t out_local() const { return out_local_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }
  bool has_bias() const { return opt_.bias; }
  // The layer's Parameters: the weight, then the bias when it has one.
  std::vector<Parameter*> params();

  // x: [rows_in, in], rows_in = rows / tp under SP else rows. y: [rows, out_local] = x W + b.
  void forward(const float* x, int64_t rows, float* y);
  // dy: [rows, out_local]. Writes dx [rows_in, in] (already reduced over TP).
  void backward(const float* dy, int64_t rows, float* dx);

  // Pieces of forward/backward for several column-parallel layers reading
  // one input (Llama's q/k/v, gate/up): gather the input once, run each
  // layer on it, sum their input gradients and reduce them once.
  // Under SP all-gathers x [rows / tp, in] into this layer's buffer and returns it; else returns x.
  const float* gather_input(const float* x, int64_t rows);
  // y = x_full W + b on the full [rows, in] input (kept referenced for backward).
  void forward_full(const float* x_full, int64_t rows, float* y);
  // Weight and bias gradients, and dx_full [rows, in] = (accumulate ? dx_full : 0) + dy W^T, not reduced over TP.
  void backward_partial(const float* dy, int64_t rows, float* dx_full, bool accumulate);
  // Sums dx_full over TP into dx [rows_in, in] (reduce-scatter under SP; else
  // all-reduce in place, dx == dx_full allowed).
  void reduce_input_grad(float* dx_full, int64_t rows, float* dx) const;

 private:
  const ParallelState& ps_;
  LinearOptions opt_;
  int64_t in_, out_local_;
  int replicas_ = 1;  // TP ranks holding the same piece
  Parameter weight_, bias_;
  const float* input_ = nullptr;  // full [rows, in] input of the last forward
  Tensor gathered_, dx_full_, dy_sum_;
};

class RowParallelLinear {
 public:
  // in_features is split over TP; the bias is replicated.
  RowParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features, const ParallelState& ps,
                    float init_std);
  // options.tp_parts must be 0.
  RowParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features, const ParallelState& ps,
                    float init_std, const LinearOptions& options);

  int64_t in_local() const { return in_local_; }
  int64_t out_features() const { return out_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }
  bool has_bias() const { return opt_.bias; }
  std::vector<Parameter*> params();

  // x: [rows, in_local]. out: [rows_out, out] = residual + reduce_tp(x W) + b, rows_out = rows / tp under SP.
  // The residual add is fused; `out` must not alias x.
  void forward(const float* x, int64_t rows, const float* residual, float* out);
  // dout: [rows_out, out]. Writes dx [rows, in_local].
  void backward(const float* dout, int64_t rows, float* dx);

 private:
  const ParallelState& ps_;
  LinearOptions opt_;
  int64_t in_local_, out_;
  Parameter weight_, bias_;
  const float* input_ = nullptr;
  Tensor partial_, scattered_, dout_full_;
};

}  // namespace tessera::parallel::layers
