#include "parallel/layers/linear.h"

#include "parallel/layers/buffer.h"
#include "runtime/kernels.h"

namespace tessera::parallel::layers {

ColumnParallelLinear::ColumnParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features,
                                           int chunks, const ParallelState& ps, float init_std)
    : ps_(ps), in_(in_features) {
  TESSERA_ARG_CHECK(out_features % chunks == 0 && (out_features / chunks) % ps.tp_size == 0, prefix, ": ",
                    out_features / chunks, " output features per block do not divide over tp ", ps.tp_size);
  weight_ = make_parameter(prefix + ".weight", {in_features, out_features}, 1, chunks, ps.tp_size, ps.tp_rank,
                           Init::Normal, init_std, true);
  bias_ = make_parameter(prefix + ".bias", {out_features}, 0, chunks, ps.tp_size, ps.tp_rank, Init::Zeros, 0, false);
  out_local_ = weight_.shape[1];
}

void ColumnParallelLinear::forward(const float* x, int64_t rows, float* y) {
  const float* in = x;
  if (ps_.sp()) {
    float* g = ensure_buffer(gathered_, ps_.device, rows * in_);
    ps_.tp_all_gather(x, g, rows / ps_.tp_size * in_);
    in = g;
  }
  input_ = in;
  kern::broadcast_rows(ps_.device, bias_.value, y, rows, out_local_);
  kern::gemm(ps_.device, false, false, rows, out_local_, in_, 1.f, in, in_, weight_.value, out_local_, 1.f, y,
             out_local_);
}

void ColumnParallelLinear::backward(const float* dy, int64_t rows, float* dx) {
  TESSERA_CHECK(input_ != nullptr, "backward before forward");
  kern::gemm(ps_.device, true, false, in_, out_local_, rows, 1.f, input_, in_, dy, out_local_, 1.f, weight_.grad,
             out_local_);
  kern::bias_grad(ps_.device, dy, bias_.grad, rows, out_local_);
  if (ps_.sp()) {
    float* full = ensure_buffer(dx_full_, ps_.device, rows * in_);
    kern::gemm(ps_.device, false, true, rows, in_, out_local_, 1.f, dy, out_local_, weight_.value, out_local_, 0.f,
               full, in_);
    ps_.tp_reduce_scatter(full, dx, rows / ps_.tp_size * in_);
  } else {
    kern::gemm(ps_.device, false, true, rows, in_, out_local_, 1.f, dy, out_local_, weight_.value, out_local_, 0.f, dx,
               in_);
    ps_.tp_all_reduce(dx, rows * in_);
  }
}

RowParallelLinear::RowParallelLinear(const std::string& prefix, int64_t in_features, int64_t out_features,
                                     const ParallelState& ps, float init_std)
    : ps_(ps), out_(out_features) {
  TESSERA_ARG_CHECK(in_features % ps.tp_size == 0, prefix, ": ", in_features, " input features do not divide over tp ",
                    ps.tp_size);
  weight_ = make_parameter(prefix + ".weight", {in_features, out_features}, 0, 1, ps.tp_size, ps.tp_rank, Init::Normal,
                           init_std, true);
  bias_ = make_parameter(prefix + ".bias", {out_features}, -1, 1, ps.tp_size, ps.tp_rank, Init::Zeros, 0, false);
  bias_.sp_partial = ps.sp();
  in_local_ = weight_.shape[0];
}

void RowParallelLinear::forward(const float* x, int64_t rows, const float* residual, float* out) {
  input_ = x;
  if (ps_.tp_size == 1) {
    // out = residual + b, then the GEMM accumulates onto it.
    kern::add_rows(ps_.device, residual, nullptr, bias_.value, out, rows, out_);
    kern::gemm(ps_.device, false, false, rows, out_, in_local_, 1.f, x, in_local_, weight_.value, out_, 1.f, out, out_);
    return;
  }
  float* partial = ensure_buffer(partial_, ps_.device, rows * out_);
  kern::gemm(ps_.device, false, false, rows, out_, in_local_, 1.f, x, in_local_, weight_.value, out_, 0.f, partial,
             out_);
  if (ps_.sp()) {
    const int64_t rows_out = rows / ps_.tp_size;
    float* s = ensure_buffer(scattered_, ps_.device, rows_out * out_);
    ps_.tp_reduce_scatter(partial, s, rows_out * out_);
    kern::add_rows(ps_.device, residual, s, bias_.value, out, rows_out, out_);
  } else {
    ps_.tp_all_reduce(partial, rows * out_);
    kern::add_rows(ps_.device, residual, partial, bias_.value, out, rows, out_);
  }
}

void RowParallelLinear::backward(const float* dout, int64_t rows, float* dx) {
  TESSERA_CHECK(input_ != nullptr, "backward before forward");
  const float* d = dout;
  if (ps_.sp()) {
    const int64_t rows_out = rows / ps_.tp_size;
    kern::bias_grad(ps_.device, dout, bias_.grad, rows_out, out_);  // partial: summed over TP by the optimizer
    float* full = ensure_buffer(dout_full_, ps_.device, rows * out_);
    ps_.tp_all_gather(dout, full, rows_out * out_);
    d = full;
  } else {
    kern::bias_grad(ps_.device, dout, bias_.grad, rows, out_);
  }
  kern::gemm(ps_.device, true, false, in_local_, out_, rows, 1.f, input_, in_local_, d, out_, 1.f, weight_.grad, out_);
  kern::gemm(ps_.device, false, true, rows, in_local_, out_, 1.f, d, out_, weight_.value, out_, 0.f, dx, in_local_);
}

}  // namespace tessera::parallel::layers
