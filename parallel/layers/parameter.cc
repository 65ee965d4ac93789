#include "parallel/layers/parameter.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/error.h"
#include "runtime/random.h"

namespace tessera::parallel::layers {

uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

namespace {

// Standard normal from two counter-based uniforms (Box-Muller).
float normal_at(uint64_t key, int64_t i) {
  uint64_t a = splitmix64(key ^ splitmix64(static_cast<uint64_t>(2 * i)));
  uint64_t b = splitmix64(key ^ splitmix64(static_cast<uint64_t>(2 * i + 1)));
  double u1 = (static_cast<double>(a >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
  double u2 = static_cast<double>(b >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace

int64_t Parameter::full_block() const { return split_dim < 0 ? 0 : full_shape[split_dim] / chunks; }

int64_t Parameter::local_block() const {
  if (split_dim < 0) return 0;
  return (full_block() + tp_parts - 1) / tp_parts;
}

Parameter make_parameter(std::string name, Shape full_shape, int split_dim, int chunks, int tp_size, int tp_rank,
                         Init init, float init_std, bool decay, int tp_parts) {
  Parameter p;
  p.name = std::move(name);
  p.full_shape = full_shape;
  p.split_dim = tp_size > 1 ? split_dim : -1;
  p.chunks = chunks;
  p.tp_size = tp_size;
  p.tp_rank = tp_rank;
  if (tp_parts <= 0) tp_parts = tp_size;
  TESSERA_CHECK(tp_parts <= tp_size && tp_size % tp_parts == 0, p.name, ": ", tp_parts, " pieces over tp ", tp_size);
  p.tp_parts = p.split_dim >= 0 ? tp_parts : 1;
  p.init = init;
  p.init_std = init_std;
  p.decay = decay;
  p.shape = full_shape;
  if (p.split_dim >= 0) {
    TESSERA_CHECK(full_shape[split_dim] % chunks == 0, p.name);
    p.shape[split_dim] = p.local_block() * chunks;
  }
  return p;
}

void for_each_shard_run(const Parameter& p, const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  if (p.split_dim < 0) {
    fn(0, 0, p.numel());
    return;
  }
  // Element (outer, c, inner) with c along split_dim; the local rows of block k
  // are [k lb, (k+1) lb), holding full rows k fb + part lb + [0, lb) while
  // they stay below fb, padding after.
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < p.split_dim; ++d) outer *= p.shape[d];
  for (size_t d = p.split_dim + 1; d < p.shape.size(); ++d) inner *= p.shape[d];
  const int64_t local_dim = p.shape[p.split_dim], full_dim = p.full_shape[p.split_dim];
  const int64_t lb = p.local_block(), fb = p.full_block();
  const int64_t first = p.tp_part() * lb;
  const int64_t valid = std::clamp<int64_t>(fb - first, 0, lb);
  for (int64_t o = 0; o < outer; ++o) {
    for (int k = 0; k < p.chunks; ++k) {
      const int64_t local = (o * local_dim + k * lb) * inner;
      if (valid > 0) fn(local, (o * full_dim + k * fb + first) * inner, valid * inner);
      if (valid < lb) fn(local + valid * inner, -1, (lb - valid) * inner);
    }
  }
}

void for_each_shard_element(const Parameter& p, const std::function<void(int64_t, int64_t)>& fn) {
  for_each_shard_run(p, [&](int64_t local, int64_t full, int64_t count) {
    for (int64_t i = 0; i < count; ++i) fn(local + i, full < 0 ? -1 : full + i);
  });
}

void init_parameter(Parameter& p, uint64_t seed) {
  TESSERA_CHECK(p.value != nullptr, "parameter ", p.name, " is not bound to a ParamBuffer");
  const uint64_t key = splitmix64(seed ^ hash_name(p.name));
  for_each_shard_element(p, [&](int64_t li, int64_t gi) {
    float v = 0;
    if (gi >= 0) {
      switch (p.init) {
        case Init::Zeros:
          v = 0;
          break;
        case Init::Ones:
          v = 1;
          break;
        case Init::Normal:
          v = p.init_std * normal_at(key, gi);
          break;
      }
    }
    p.value[li] = v;
  });
}

void load_shard(Parameter& p, const float* full) {
  for_each_shard_run(p, [&](int64_t local, int64_t gi, int64_t count) {
    if (gi >= 0) {
      std::memcpy(p.value + local, full + gi, static_cast<size_t>(count) * sizeof(float));
    } else {
      std::fill_n(p.value + local, count, 0.f);
    }
  });
}

void store_shard(const Parameter& p, float* full) {
  for_each_shard_run(p, [&](int64_t local, int64_t gi, int64_t count) {
    if (gi >= 0) std::memcpy(full + gi, p.value + local, static_cast<size_t>(count) * sizeof(float));
  });
}

}  // namespace tessera::parallel::layers
