// Device: one emulated accelerator core.
//
// A Device owns a DeviceSpec (the chip figures it emulates), a memory
// backend that provides the bytes, strict memory accounting against the
// spec's HBM capacity (DeviceOutOfMemory when exceeded), and a SimClock that
// accumulates the modeled time of the work charged to it.
//
// Thread-safety: allocate/free and the clock may be called from any thread
// (the collectives' progress thread frees buffers too); statistics are
// consistent snapshots. A Device must outlive every Tensor allocated on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/sim_clock.h"

namespace tessera {

struct DeviceSpec {
  std::string name;
  uint64_t hbm_bytes = 0;      // memory capacity of this core
  double peak_flops_bf16 = 0;  // dense FLOP/s
  double peak_flops_fp32 = 0;  // dense FLOP/s
  double hbm_bandwidth = 0;    // bytes/s
  // Of the peak, what the core sustains on kernels (runtime/kernel_cost.h),
  // and the fixed cost of launching one kernel: both assumptions (no public
  // figure), shared by the emulated cores and the planner.
  double sustained_fraction = 1;
  double kernel_launch_s = 0;
  // Of hbm_bandwidth, what a streaming kernel sustains (the memory-bound
  // kernels' roofline, runtime/kernel_cost.h); 1 where no measurement is named.
  double hbm_sustained_fraction = 1;
  // What a GEMM of ideal shape sustained with the software of the published
  // Megatron-LM runs (2021-22: CUDA 11 and its cuBLAS), which
  // `--runtime megatron-lm` costs GEMMs at instead of sustained_fraction
  // (parallel/cost_model.h); 0: the same as sustained_fraction.
  double megatron_sustained_fraction = 0;
  // GEMM tiling (runtime/kernel_cost.h, gemm_efficiency): the compute units
  // a GEMM's output tiles are spread over (SMs), and the tile each unit
  // computes at a time, m x n of the output and k of the contraction per
  // step, as the device's GEMM library picks them. compute_units == 0: no
  // quantisation (every shape sustains sustained_fraction).
  int compute_units = 0;
  int gemm_tile_m = 0, gemm_tile_n = 0, gemm_tile_k = 0;

  double peak_flops(DType t) const { return (t == DType::F32) ? peak_flops_fp32 : peak_flops_bf16; }
  // The bandwidth memory-bound kernels are costed at (bytes/s).
  double sustained_hbm_bandwidth() const { return hbm_bandwidth * hbm_sustained_fraction; }

  // One of preset_names() ("trn1-core", "trn2-core", "a100-80gb", "test-core");
  // throws InvalidArgument naming the presets for anything else.
  static DeviceSpec preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

class DeviceOutOfMemory : public Error {
 public:
  DeviceOutOfMemory(const std::string& device, uint64_t requested, uint64_t in_use, uint64_t capacity);
  uint64_t requested() const { return requested_; }
  uint64_t in_use() const { return in_use_; }
  uint64_t capacity() const { return capacity_; }

 private:
  uint64_t requested_, in_use_, capacity_;
};

// Where a device's bytes come from. The default keeps freed blocks for reuse,
// because a fresh page costs far more than copying one on these machines.
// Another backend (e.g. a shared-memory arena peers can map) can replace it.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Returns 64-byte aligned memory of at least `bytes`, or nullptr when the
  // backend itself is exhausted. Contents are unspecified.
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* p, size_t bytes) = 0;
};

// The size class a caching backend files a block under: 64-byte granularity
// below 1 MiB, then 1/8 steps of the power of two, so blocks of similar sizes
// are recycled. Shared by every caching backend (heap, shared-memory arena).
size_t round_block_size(size_t bytes);

// Heap backend that caches freed blocks by rounded size (a caching allocator).
std::unique_ptr<DeviceMemory> make_caching_heap_memory();

struct MemoryStats {
  uint64_t in_use = 0;
  uint64_t peak = 0;
  uint64_t capacity = 0;
  uint64_t num_allocs = 0;
  uint64_t num_frees = 0;
};

class Device {
 public:
  explicit Device(DeviceSpec spec, int index = 0, std::unique_ptr<DeviceMemory> memory = nullptr);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceSpec& spec() const { return spec_; }
  int index() const { return index_; }  // the rank it belongs to (for messages)
  std::string name() const;             // "trn1-core:3"

  // Charges `bytes` and returns zero-filled memory; throws DeviceOutOfMemory.
  void* allocate(size_t bytes);
  void free(void* p, size_t bytes);
  // The same for a buffer whose elements the core holds in fewer bytes than
  // the CPU does (bf16 values in 4-byte float containers, runtime/bf16.h):
  // `bytes` allocated, `charged` counted (and freed with the same two).
  void* allocate(size_t bytes, size_t charged);
  void free(void* p, size_t bytes, size_t charged);

  // The element types this core holds activations (and their gradients) and
  // parameter gradients in: F32 (the default) or BF16 (mixed precision,
  // runtime/kernels.h: kernels round their outputs and are charged at the
  // bf16 peak and 2-byte traffic). Set before anything is allocated for them.
  void set_precision(DType activations, DType grads);
  DType act_dtype() const { return act_dtype_; }
  DType grad_dtype() const { return grad_dtype_; }

  // Replaces the memory backend; only while nothing is allocated.
  void set_memory(std::unique_ptr<DeviceMemory> memory);
  DeviceMemory* memory() const { return memory_.get(); }

  MemoryStats memory_stats() const;
  void reset_peak();

  SimClock& clock() { return clock_; }
  const SimClock& clock() const { return clock_; }

 private:
  DeviceSpec spec_;
  int index_;
  std::unique_ptr<DeviceMemory> memory_;
  mutable std::mutex mu_;
  MemoryStats stats_;
  SimClock clock_;
  DType act_dtype_ = DType::F32, grad_dtype_ = DType::F32;
};

}  // namespace tessera
