#include "parallel/layers/linear.h"

#include <cstring>

#include "parallel/layers/buffer.h"
#include "runtime/kernels.h"

namespace tessera::parallel::layers {

namespace {
bool linear(const LinearOptions& o) { return o.layout == WeightLayout::kLinear; }
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features,
                                           int chunks, const ParallelState& ps, float init_std)
    : ColumnParallelLinear(prefix, in_features, out_features, chunks, ps, init_std, LinearOptions{}) {}

ColumnParallelLinear::ColumnParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features,
                                           int chunks, const ParallelState& ps, float init_std,
                                           const LinearOptions& options)
    : ps_(ps), opt_(options), in_(in_features) {
  const int parts = options.tp_parts > 0 ? options.tp_parts : ps.tp_size;
  TESSERA_ARG_CHECK(parts <= ps.tp_size && ps.tp_size % parts == 0, prefix, ": ", parts,
                    " output pieces do not divide over tp ", ps.tp_size);
  TESSERA_ARG_CHECK(out_features % chunks == 0 && (out_features / chunks) % parts == 0, prefix, ": ",
                    out_features / chunks, " output features per block do not divide over ",
                    parts == ps.tp_size ? "tp " : "pieces ", parts);
  replicas_ = ps.tp_size / parts;
  const int tp_parts = options.tp_parts;
  if (linear(options)) {
    weight_ = make_parameter(prefix + ".weight", {out_features, in_features}, 0, chunks, ps.tp_size, ps.tp_rank,
                             Init::Normal, init_std, true, tp_parts);
    out_local_ = weight_.shape[0];
  } else {
    weight_ = make_parameter(prefix + ".weight", {in_features, out_features}, 1, chunks, ps.tp_size, ps.tp_rank,
                             Init::Normal, init_std, true, tp_parts);
    out_local_ = weight_.shape[1];
  }
  bias_ = make_parameter(prefix + ".bias", {out_features}, 0, chunks, ps.tp_size, ps.tp_rank, Init::Zeros, 0, false,
                         tp_parts);
}

std::vector<Parameter*> ColumnParallelLinear::params() {
  if (opt_.bias) return {&weight_, &bias_};
  return {&weight_};
}

const float* ColumnParallelLinear::gather_input(const float* x, int64_t rows) {
  if (!ps_.sp()) return x;
  float* g = ensure_buffer(gathered_, ps_.device, rows * in_);
  ps_.tp_all_gather(x, g, rows / ps_.tp_size * in_);
  return g;
}

void ColumnParallelLinear::forward(const float* x, int64_t rows, float* y) {
  forward_full(gather_input(x, rows), rows, y);
}

void ColumnParallelLinear::forward_full(const float* in, int64_t rows, float* y) {
  input_ = in;
  float beta = 0.f;
  if (opt_.bias) {
    kern::broadcast_rows(ps_.device, bias_.value, y, rows, out_local_);
    beta = 1.f;
  }
  if (linear(opt_)) {
    kern::gemm(ps_.device, false, true, rows, out_local_, in_, 1.f, in, in_, weight_.value, in_, beta, y, out_local_);
  } else {
    kern::gemm(ps_.device, false, false, rows, out_local_, in_, 1.f, in, in_, weight_.value, out_local_, beta, y,
               out_local_);
  }
}

void ColumnParallelLinear::backward(const float* dy, int64_t rows, float* dx) {
  float* full = ps_.sp() ? ensure_buffer(dx_full_, ps_.device, rows * in_) : dx;
  backward_partial(dy, rows, full, false);
  reduce_input_grad(full, rows, dx);
}

void ColumnParallelLinear::backward_partial(const float* dy, int64_t rows, float* dx_full, bool accumulate) {
  TESSERA_CHECK(input_ != nullptr, "backward before forward");
  // A piece held by several TP ranks: its gradient is the sum of theirs.
  // The input is the same on all of them, so summing dy sums x^T dy.
  const float* dyw = dy;
  if (replicas_ > 1) {
    TESSERA_CHECK(ps_.kv_replicas == replicas_, weight_.name, ": held by ", replicas_,
                  " TP ranks but the ParallelState's kv groups have ", ps_.kv_replicas);
    float* sum = ensure_buffer(dy_sum_, ps_.device, rows * out_local_);
    ps_.kv_all_reduce(dy, sum, rows * out_local_);
    dyw = sum;
  }
  const float beta = accumulate ? 1.f : 0.f;
  if (linear(opt_)) {
    kern::gemm_grad(ps_.device, true, false, out_local_, in_, rows, 1.f, dyw, out_local_, input_, in_, 1.f,
                    weight_.grad, in_);
  } else {
    kern::gemm_grad(ps_.device, true, false, in_, out_local_, rows, 1.f, input_, in_, dyw, out_local_, 1.f,
                    weight_.grad, out_local_);
  }
  if (opt_.bias) kern::bias_grad(ps_.device, dyw, bias_.grad, rows, out_local_);
  if (linear(opt_)) {
    kern::gemm(ps_.device, false, false, rows, in_, out_local_, 1.f, dy, out_local_, weight_.value, in_, beta, dx_full,
               in_);
  } else {
    kern::gemm(ps_.device, false, true, rows, in_, out_local_, 1.f, dy, out_local_, weight_.value, out_local_, beta,
               dx_full, in_);
  }
}

void ColumnParallelLinear::reduce_input_grad(float* dx_full, int64_t rows, float* dx) const {
  if (ps_.sp()) {
    ps_.tp_reduce_scatter(dx_full, dx, rows / ps_.tp_size * in_);
    return;
  }
  ps_.tp_all_reduce(dx_full, rows * in_);
  if (dx != dx_full) std::memcpy(dx, dx_full, sizeof(float) * rows * in_);
}

RowParallelLinear::RowParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features,
                                     const ParallelState& ps, float init_std)
    : RowParallelLinear(prefix, in_features, out_features, ps, init_std, LinearOptions{}) {}

RowParallelLinear::RowParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features,
                                     const ParallelState& ps, float init_std, const LinearOptions& options)
    : ps_(ps), opt_(options), out_(out_features) {
  TESSERA_ARG_CHECK(in_features % ps.tp_size == 0, prefix, ": ", in_features, " input features do not divide over tp ",
                    ps.tp_size);
  TESSERA_CHECK(options.tp_parts == 0, prefix, ": row-parallel layers are not replicated");
  if (linear(options)) {
    weight_ = make_parameter(prefix + ".weight", {out_features, in_features}, 1, 1, ps.tp_size, ps.tp_rank,
                             Init::Normal, init_std, true);
    in_local_ = weight_.shape[1];
  } else {
    weight_ = make_parameter(prefix + ".weight", {in_features, out_features}, 0, 1, ps.tp_size, ps.tp_rank,
                             Init::Normal, init_std, true);
    in_local_ = weight_.shape[0];
  }
  bias_ = make_parameter(prefix + ".bias", {out_features}, -1, 1, ps.tp_size, ps.tp_rank, Init::Zeros, 0, false);
  bias_.sp_partial = ps.sp();
}

std::vector<Parameter*> RowParallelLinear::params() {
  if (opt_.bias) return {&weight_, &bias_};
  return {&weight_};
}

void RowParallelLinear::forward(const float* x, int64_t rows, const float* residual, float* out) {
  input_ = x;
  const float* bias = opt_.bias ? bias_.value : nullptr;
  auto xw = [&](float beta, float* y) {  // y = beta y + x W
    if (linear(opt_)) {
      kern::gemm(ps_.device, false, true, rows, out_, in_local_, 1.f, x, in_local_, weight_.value, in_local_, beta, y,
                 out_);
    } else {
      kern::gemm(ps_.device, false, false, rows, out_, in_local_, 1.f, x, in_local_, weight_.value, out_, beta, y,
                 out_);
    }
  };
  if (ps_.tp_size == 1) {
    if (bias) {
      // out = residual + b, then the GEMM accumulates onto it.
      kern::add_rows(ps_.device, residual, nullptr, bias, out, rows, out_);
      xw(1.f, out);
    } else {
      xw(0.f, out);
      kern::add_rows(ps_.device, residual, out, nullptr, out, rows, out_);
    }
    return;
  }
  float* partial = ensure_buffer(partial_, ps_.device, rows * out_);
  xw(0.f, partial);
  if (ps_.sp()) {
    const int64_t rows_out = rows / ps_.tp_size;
    float* s = ensure_buffer(scattered_, ps_.device, rows_out * out_);
    ps_.tp_reduce_scatter(partial, s, rows_out * out_);
    kern::add_rows(ps_.device, residual, s, bias, out, rows_out, out_);
  } else {
    ps_.tp_all_reduce(partial, rows * out_);
    kern::add_rows(ps_.device, residual, partial, bias, out, rows, out_);
  }
}

void RowParallelLinear::backward(const float* dout, int64_t rows, float* dx) {
  TESSERA_CHECK(input_ != nullptr, "backward before forward");
  const float* d = dout;
  if (ps_.sp()) {
    const int64_t rows_out = rows / ps_.tp_size;
    // partial: summed over TP by the optimizer
    if (opt_.bias) kern::bias_grad(ps_.device, dout, bias_.grad, rows_out, out_);
    float* full = ensure_buffer(dout_full_, ps_.device, rows * out_);
    ps_.tp_all_gather(dout, full, rows_out * out_);
    d = full;
  } else if (opt_.bias) {
    kern::bias_grad(ps_.device, dout, bias_.grad, rows, out_);
  }
  if (linear(opt_)) {
    kern::gemm_grad(ps_.device, true, false, out_, in_local_, rows, 1.f, d, out_, input_, in_local_, 1.f, weight_.grad,
                    in_local_);
    kern::gemm(ps_.device, false, false, rows, in_local_, out_, 1.f, d, out_, weight_.value, in_local_, 0.f, dx,
               in_local_);
  } else {
    kern::gemm_grad(ps_.device, true, false, in_local_, out_, rows, 1.f, input_, in_local_, d, out_, 1.f, weight_.grad,
                    out_);
    kern::gemm(ps_.device, false, true, rows, in_local_, out_, 1.f, d, out_, weight_.value, out_, 0.f, dx, in_local_);
  }
}

}  // namespace tessera::parallel::layers
