#include "runtime/device.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <new>

namespace tessera {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

namespace {
// The one list of device presets: every tool (train_gpt, plan, bench) reads it.
struct DevicePreset {
  const char* name;
  uint64_t hbm_bytes;
  double peak_flops_bf16, peak_flops_fp32, hbm_bandwidth;
  double sustained_fraction, kernel_launch_s;  // see DeviceSpec (and each preset's sources)
  int compute_units = 0, gemm_tile_m = 0, gemm_tile_n = 0, gemm_tile_k = 0;
  double hbm_sustained_fraction = 1, megatron_sustained_fraction = 0;
};
const DevicePreset kDevicePresets[] = {
    // NeuronCore-v2: a Trainium chip has 2 cores, 190 TFLOP/s bf16 and 47.5
    // TFLOP/s fp32 dense, 32 GiB HBM at 820 GiB/s; one core gets half.
    // Sustained: half of peak, 1 us per kernel launch (assumptions).
    {"trn1-core", static_cast<uint64_t>(16 * kGiB), 95e12, 23.75e12, 410 * kGiB, 0.5, 1e-6},
    // NeuronCore-v3: a Trainium2 chip has 8 cores, 667 TFLOP/s bf16 and 181
    // TFLOP/s fp32 dense, 96 GiB HBM at 2.9 TB/s; one core gets an eighth.
    {"trn2-core", static_cast<uint64_t>(12 * kGiB), 667e12 / 8, 181e12 / 8, 2.9e12 / 8, 0.5, 1e-6},
    // NeuronCore-v2 of Inferentia2 (inferentia2.rst): a chip has 2 cores, 190
    // TFLOP/s bf16 and 47.5 fp32, 32 GiB HBM at 820 GiB/s; one core gets half
    // (the same core as trn1's). Sustained fraction and launch as trn1-core.
    {"inf2-core", static_cast<uint64_t>(16 * kGiB), 95e12, 23.75e12, 410 * kGiB, 0.5, 1e-6},
    // NeuronCore-v4 (trainium3.rst): a Trainium3 chip has 8 cores, 671 TFLOP/s
    // bf16 and 183 fp32 dense, 144 GiB HBM at 4.9 TB/s; one core gets an eighth.
    {"trn3-core", static_cast<uint64_t>(18 * kGiB), 671e12 / 8, 183e12 / 8, 4.9e12 / 8, 0.5, 1e-6},
    // NVIDIA A100 80GB SXM datasheet: 80 GB HBM2e at 2039 GB/s, 312 TFLOP/s
    // dense bf16, 19.5 TFLOP/s fp32 (no TF32), 108 SMs (A100 whitepaper).
    // Sustained: 267.9 of 312 TFLOP/s = 0.859, the best bf16 matmul that
    // mamf-finder.py measured on an A100 SXM (ml-engineering, "Maximum
    // Achievable Matmul FLOPS", CUDA 12.1, shape 6912x16384x2048, whose
    // tiles fill whole waves); GEMM tiles 128 x 256 x 64, CUTLASS's SM80
    // default for 16-bit tensor-core GEMMs (NVIDIA's "Matrix Multiplication
    // Background" guide lists 256x128 / 128x256 as cuBLAS's largest tiles).
    // ~4 us per CUDA kernel launch (assumption). Used by dgx-a100.
    // Streaming kernels sustain 1.80 of the 2.039 TB/s: a read kernel
    // measured on an A100 80GB SXM, 88% of peak by Nsight Compute too (NVIDIA
    // developer forum, "Trouble to Reach Peak Bandwidth of A100", 2025; the
    // GTC talk it cites saw no kernel above about 90%).
    // With 2022's software (the repository's setup: NGC PyTorch 22.07, CUDA
    // 11.7) an fp16 square GEMM ran at 230 TFLOP/s on an A100 80GB, form
    // factor not stated (mli/transformers-benchmarks, README
    // "Micro-Benchmarking Summary", from micro_bench.ipynb: the best of
    // n = 128 to 8192, so 8192^3, the only size whose wave fill allows it):
    // over that shape's own wave fill (2048 tiles in 19 waves of 108) that
    // is what an ideal shape sustains with the software the published
    // Megatron-LM runs used (`--runtime megatron-lm`).
    {"a100-80gb", static_cast<uint64_t>(80 * kGiB), 312e12, 19.5e12, 2039e9, 267.9 / 312, 4e-6, 108, 128, 256, 64,
     1.80e12 / 2039e9, 230.0 / 312 * (19.0 * 108) / 2048},
    // Small core for tests: 256 MiB, 1 TFLOP/s, 100 GB/s, all of it sustained, no launch cost.
    {"test-core", 256ull << 20, 1e12, 0.5e12, 100e9, 1.0, 0.0},
};
}  // namespace

DeviceSpec DeviceSpec::preset(const std::string& name) {
  for (const DevicePreset& p : kDevicePresets) {
    if (name != p.name) continue;
    DeviceSpec s;
    s.name = name;
    s.hbm_bytes = p.hbm_bytes;
    s.peak_flops_bf16 = p.peak_flops_bf16;
    s.peak_flops_fp32 = p.peak_flops_fp32;
    s.hbm_bandwidth = p.hbm_bandwidth;
    s.sustained_fraction = p.sustained_fraction;
    s.kernel_launch_s = p.kernel_launch_s;
    s.compute_units = p.compute_units;
    s.gemm_tile_m = p.gemm_tile_m;
    s.gemm_tile_n = p.gemm_tile_n;
    s.gemm_tile_k = p.gemm_tile_k;
    s.hbm_sustained_fraction = p.hbm_sustained_fraction;
    s.megatron_sustained_fraction = p.megatron_sustained_fraction;
    return s;
  }
  std::string names;
  for (const DevicePreset& p : kDevicePresets) names += std::string(names.empty() ? "" : ", ") + p.name;
  throw InvalidArgument("unknown device preset '" + name + "' (expected one of " + names + ")");
}

std::vector<std::string> DeviceSpec::preset_names() {
  std::vector<std::string> names;
  for (const DevicePreset& p : kDevicePresets) names.emplace_back(p.name);
  return names;
}

DeviceOutOfMemory::DeviceOutOfMemory(const std::string& device, uint64_t requested, uint64_t in_use, uint64_t capacity)
    : Error(detail::concat("device out of memory on ", device, ": requested ", requested, " bytes with ", in_use,
                           " bytes in use of ", capacity, " bytes capacity (", capacity - std::min(in_use, capacity),
                           " free)")),
      requested_(requested),
      in_use_(in_use),
      capacity_(capacity) {}

size_t round_block_size(size_t b) {
  if (b == 0) return 64;
  if (b < (1u << 20)) return (b + 63) & ~size_t{63};
  size_t p = size_t{1} << (63 - __builtin_clzll(b));
  size_t step = p / 8;
  return (b + step - 1) / step * step;
}

namespace {

// Keeps freed blocks by rounded size and hands them out again, so a
// training step's buffers are faulted in once and reused afterwards.
class CachingHeapMemory : public DeviceMemory {
 public:
  ~CachingHeapMemory() override {
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) std::free(p);
  }
  void* allocate(size_t bytes) override {
    size_t r = round(bytes);
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = cache_.find(r);
      if (it != cache_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= r;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, r);
    if (!p) {
      release_all();
      p = std::aligned_alloc(64, r);
    }
    return p;
  }
  void free(void* p, size_t bytes) override {
    size_t r = round(bytes);
    std::lock_guard<std::mutex> lk(mu_);
    if (cached_bytes_ + r > kMaxCached) {
      std::free(p);
      return;
    }
    cache_[r].push_back(p);
    cached_bytes_ += r;
  }

 private:
  static constexpr size_t kMaxCached = size_t{8} << 30;
  static size_t round(size_t b) { return round_block_size(b); }
  void release_all() {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) std::free(p);
    cache_.clear();
    cached_bytes_ = 0;
  }
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> cache_;
  size_t cached_bytes_ = 0;
};

}  // namespace

std::unique_ptr<DeviceMemory> make_caching_heap_memory() { return std::make_unique<CachingHeapMemory>(); }

Device::Device(DeviceSpec spec, int index, std::unique_ptr<DeviceMemory> memory)
    : spec_(std::move(spec)),
      index_(index),
      memory_(memory ? std::move(memory) : make_caching_heap_memory()),
      clock_(&spec_) {
  stats_.capacity = spec_.hbm_bytes;
}

Device::~Device() = default;

std::string Device::name() const { return spec_.name + ":" + std::to_string(index_); }

void* Device::allocate(size_t bytes) { return allocate(bytes, bytes); }

void* Device::allocate(size_t bytes, size_t charged) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stats_.in_use + charged > stats_.capacity) {
      throw DeviceOutOfMemory(name(), charged, stats_.in_use, stats_.capacity);
    }
    stats_.in_use += charged;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    ++stats_.num_allocs;
  }
  void* p = memory_->allocate(bytes);
  if (!p) {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.in_use -= charged;
    --stats_.num_allocs;
    throw DeviceOutOfMemory(name() + " (host memory exhausted)", charged, stats_.in_use, stats_.capacity);
  }
  std::memset(p, 0, bytes);
  return p;
}

void Device::free(void* p, size_t bytes) { free(p, bytes, bytes); }

void Device::free(void* p, size_t bytes, size_t charged) {
  if (!p) return;
  memory_->free(p, bytes);
  std::lock_guard<std::mutex> lk(mu_);
  stats_.in_use -= charged;
  ++stats_.num_frees;
}

void Device::set_precision(DType activations, DType grads) {
  for (DType t : {activations, grads})
    TESSERA_ARG_CHECK(t == DType::F32 || t == DType::BF16, "device precision ", dtype_name(t),
                      " (expected f32 or bf16)");
  act_dtype_ = activations;
  grad_dtype_ = grads;
}

void Device::set_memory(std::unique_ptr<DeviceMemory> memory) {
  std::lock_guard<std::mutex> lk(mu_);
  TESSERA_CHECK_EQ(stats_.in_use, 0u, "set_memory with live allocations on ", name());
  memory_ = std::move(memory);
}

MemoryStats Device::memory_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void Device::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  stats_.peak = stats_.in_use;
}

}  // namespace tessera
