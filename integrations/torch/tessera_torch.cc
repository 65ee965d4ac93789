// tessera's collectives as a torch.distributed backend ("tessera"), built as
// the Python module tessera_torch (integrations/torch/README.md).
//
// ProcessGroupTessera holds one tessera Communicator (collectives/), which
// meets its peers through the c10d Store torch.distributed hands to the
// backend's constructor (wrapped as a collectives::Store), so the backend
// runs wherever env:// (or any torch init method) runs. Every op runs on the
// calling thread, blocking (tessera's calls are short and in issue order);
// the returned Work is complete, carries its result tensors in a completed
// Future (DDP's reducer reads them from there) and reports the wall time of
// the call and the modeled time of the same collective on the emulated
// interconnect (Communicator::last_modeled_seconds()).
//
// all_reduce stages the tensor in a shared-memory arena (64 MiB per rank)
// so the shm transport serves it in place (its direct algorithm, one round)
// rather than in chunks through its channels; DDP's buckets take this path.
//
// Dtypes: float32, bfloat16, float16, int32 and int64 natively; int8, uint8
// and int16 are widened to int32 for the call and narrowed back (exact:
// sums and products wrap modulo 2^bits as gloo's do; min and max are
// unchanged). Reductions: sum, product, min, max, and avg for floating
// types (ReduceOp.AVG).
#include <pybind11/chrono.h>
#include <torch/extension.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/shm_memory.h"

namespace tessera::integrations {
namespace {

namespace coll = tessera::collectives;
using Clock = std::chrono::steady_clock;

// torch's c10d Store as tessera's: the keys of the group's rendezvous go
// through whatever store torch.distributed set up (TCPStore for env://).
class C10dStore final : public coll::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<::c10d::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::string& value) override {
    s_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    const std::vector<uint8_t> v = s_->get(key);
    return std::string(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      s_->wait(keys, timeout);
    } catch (const c10::Error& e) {
      throw TimeoutError("tessera_torch: torch.distributed store: waiting for '" + (keys.empty() ? "" : keys[0]) +
                         "' failed: " + e.what_without_backtrace());
    }
  }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }

 private:
  c10::intrusive_ptr<::c10d::Store> s_;
};

// A finished call: wall and modeled seconds, and the result tensors.
class TesseraWork final : public ::c10d::Work {
 public:
  TesseraWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs, double wall, double modeled)
      : ::c10d::Work(rank, type), outputs_(std::move(outputs)), wall_(wall), modeled_(modeled) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  double wall_seconds() const { return wall_; }
  double modeled_seconds() const { return modeled_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  double wall_, modeled_;
};

// How a torch dtype travels: tessera's dtype, and whether it is widened to int32.
struct Wire {
  DType dtype;
  bool widen;
};

Wire wire_of(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return {DType::F32, false};
    case at::kBFloat16:
      return {DType::BF16, false};
    case at::kHalf:
      return {DType::F16, false};
    case at::kInt:
      return {DType::I32, false};
    case at::kLong:
      return {DType::I64, false};
    case at::kChar:
    case at::kByte:
    case at::kShort:
      return {DType::I32, true};
    default:
      break;
  }
  TORCH_CHECK(false, "tessera: ", op, ": dtype ", t.scalar_type(),
              " is not supported (float32, bfloat16, float16, int8, uint8, int16, int32, int64)");
}

coll::ReduceOp reduce_op_of(const ::c10d::ReduceOp& op, const at::Tensor& t) {
  switch (op.op_) {
    case ::c10d::ReduceOp::SUM:
      return coll::ReduceOp::Sum;
    case ::c10d::ReduceOp::PRODUCT:
      return coll::ReduceOp::Prod;
    case ::c10d::ReduceOp::MIN:
      return coll::ReduceOp::Min;
    case ::c10d::ReduceOp::MAX:
      return coll::ReduceOp::Max;
    case ::c10d::ReduceOp::AVG:
      TORCH_CHECK(at::isFloatingType(t.scalar_type()), "tessera: ReduceOp.AVG needs a floating dtype, not ",
                  t.scalar_type());
      return coll::ReduceOp::Avg;
    default:
      break;
  }
  TORCH_CHECK(false, "tessera: reduce op ", static_cast<int>(op.op_),
              " is not supported (SUM, PRODUCT, MIN, MAX, AVG)");
}

void check_cpu_dense(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.device().is_cpu(), "tessera: ", op, ": tensors must be on the CPU, not ", t.device());
  TORCH_CHECK(t.layout() == at::kStrided, "tessera: ", op, ": sparse tensors are not supported");
}

// The buffer a tensor's data crosses in: itself when contiguous and of a
// native dtype, else a contiguous (widened) copy written back by done().
struct Staged {
  at::Tensor user, wire;
  DType dtype;
  Staged(const at::Tensor& t, const char* op) : user(t) {
    check_cpu_dense(t, op);
    const Wire w = wire_of(t, op);
    dtype = w.dtype;
    wire = w.widen ? t.to(at::kInt).contiguous() : t.contiguous();
  }
  void* data() { return wire.data_ptr(); }
  size_t count() const { return static_cast<size_t>(wire.numel()); }
  void done() {
    if (!wire.is_same(user)) user.copy_(wire);
  }
};

class ProcessGroupTessera final : public ::c10d::ProcessGroup {
 public:
  ProcessGroupTessera(const c10::intrusive_ptr<::c10d::Store>& store, int rank, int size,
                      std::chrono::milliseconds timeout)
      : ::c10d::ProcessGroup(rank, size) {
    coll::CommOptions o;
    o.timeout = timeout;
    o.name = "torch";
    comm_ = coll::Communicator::create(std::make_shared<C10dStore>(store), rank, size, o);
    // Shared memory the peers can map: an all_reduce staged here is served
    // in place (the shm transport's direct algorithm: one round) instead of
    // through the channels in chunks. Optional: without it (or for a tensor
    // that does not fit) the tensor's own memory is used.
    try {
      arena_ = make_shm_memory(kArenaBytes);
    } catch (const std::exception&) {
      arena_.reset();
    }
  }

  const std::string getBackendName() const override { return "tessera"; }

  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override {
    TORCH_CHECK(tensors.size() == 1, "tessera: allreduce takes one tensor per process, not ", tensors.size());
    Staged s(tensors[0], "allreduce");
    const coll::ReduceOp op = reduce_op_of(opts.reduceOp, tensors[0]);
    const size_t bytes = s.count() * dtype_size(s.dtype);
    void* shared = nullptr;
    if (arena_ && bytes > 0 && bytes <= kArenaBytes / 2) {
      try {
        shared = arena_->allocate(bytes);
      } catch (const std::exception&) {
        shared = nullptr;
      }
    }
    return run(::c10d::OpType::ALLREDUCE, tensors, [&] {
      if (shared) {
        std::memcpy(shared, s.data(), bytes);
        try {
          comm_->all_reduce(shared, shared, s.count(), s.dtype, op);
        } catch (...) {
          arena_->free(shared, bytes);
          throw;
        }
        std::memcpy(s.data(), shared, bytes);
        arena_->free(shared, bytes);
      } else {
        comm_->all_reduce(s.data(), s.data(), s.count(), s.dtype, op);
      }
      s.done();
    });
  }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override {
    TORCH_CHECK(tensors.size() == 1, "tessera: broadcast takes one tensor per process, not ", tensors.size());
    Staged s(tensors[0], "broadcast");
    return run(::c10d::OpType::BROADCAST, tensors, [&] {
      comm_->broadcast(s.data(), s.count(), s.dtype, static_cast<int>(opts.rootRank));
      s.done();
    });
  }

  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions&) override {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "tessera: allgather takes one tensor per process");
    TORCH_CHECK(static_cast<int>(outputs[0].size()) == getSize(), "tessera: allgather needs ", getSize(),
                " output tensors, got ", outputs[0].size());
    for (const auto& o : outputs[0])
      TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == inputs[0].scalar_type(),
                  "tessera: allgather: every output tensor must match the input's size and dtype");
    Staged in(inputs[0], "allgather");
    at::Tensor flat = at::empty({getSize() * inputs[0].numel()}, in.wire.options());
    return run(::c10d::OpType::ALLGATHER, outputs[0], [&] {
      comm_->all_gather(in.data(), flat.data_ptr(), in.count(), in.dtype);
      for (int r = 0; r < getSize(); ++r)
        outputs[0][r].copy_(flat.narrow(0, r * inputs[0].numel(), inputs[0].numel()).view(outputs[0][r].sizes()));
    });
  }

  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions&) override {
    TORCH_CHECK(output.numel() == getSize() * input.numel() && output.scalar_type() == input.scalar_type(),
                "tessera: all_gather_into_tensor: the output must hold world_size x the input");
    Staged in(input, "all_gather_into_tensor");
    Staged out(output, "all_gather_into_tensor");
    std::vector<at::Tensor> result{output};
    return run(::c10d::OpType::_ALLGATHER_BASE, result, [&] {
      comm_->all_gather(in.data(), out.data(), in.count(), in.dtype);
      out.done();
    });
  }

  c10::intrusive_ptr<::c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                  const ::c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "tessera: reduce_scatter takes one tensor per process");
    TORCH_CHECK(static_cast<int>(inputs[0].size()) == getSize(), "tessera: reduce_scatter needs ", getSize(),
                " input tensors, got ", inputs[0].size());
    for (const auto& i : inputs[0])
      TORCH_CHECK(i.numel() == outputs[0].numel() && i.scalar_type() == outputs[0].scalar_type(),
                  "tessera: reduce_scatter: every input tensor must match the output's size and dtype");
    at::Tensor flat = at::cat(inputs[0]).reshape({-1});
    Staged in(flat, "reduce_scatter");
    Staged out(outputs[0], "reduce_scatter");
    const coll::ReduceOp op = reduce_op_of(opts.reduceOp, outputs[0]);
    return run(::c10d::OpType::REDUCE_SCATTER, outputs, [&] {
      comm_->reduce_scatter(in.data(), out.data(), out.count(), out.dtype, op);
      out.done();
    });
  }

  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                        const ::c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(input.numel() == getSize() * output.numel() && output.scalar_type() == input.scalar_type(),
                "tessera: reduce_scatter_tensor: the input must hold world_size x the output");
    Staged in(input, "reduce_scatter_tensor");
    Staged out(output, "reduce_scatter_tensor");
    const coll::ReduceOp op = reduce_op_of(opts.reduceOp, output);
    std::vector<at::Tensor> result{output};
    return run(::c10d::OpType::_REDUCE_SCATTER_BASE, result, [&] {
      comm_->reduce_scatter(in.data(), out.data(), out.count(), out.dtype, op);
      out.done();
    });
  }

  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions&) override {
    std::vector<at::Tensor> none;
    return run(::c10d::OpType::BARRIER, none, [&] { comm_->barrier(); });
  }

  // Blocking, as tessera's send (which may wait for the matching recv):
  // an isend is complete when it returns.
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    TORCH_CHECK(tensors.size() == 1, "tessera: send takes one tensor");
    Staged s(tensors[0], "send");
    return run(::c10d::OpType::SEND, tensors,
               [&] { comm_->send(s.data(), s.count(), s.dtype, dst, static_cast<uint32_t>(tag)); });
  }

  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    TORCH_CHECK(tensors.size() == 1, "tessera: recv takes one tensor");
    Staged s(tensors[0], "recv");
    return run(::c10d::OpType::RECV, tensors, [&] {
      comm_->recv(s.data(), s.count(), s.dtype, src, static_cast<uint32_t>(tag));
      s.done();
    });
  }

  double total_modeled_seconds() const { return comm_->total_modeled_seconds(); }
  std::string transport() const { return comm_->transport(); }

  static c10::intrusive_ptr<::c10d::ProcessGroup> create(const c10::intrusive_ptr<::c10d::Store>& store, int rank,
                                                         int size, const std::chrono::duration<float>& timeout) {
    return c10::make_intrusive<ProcessGroupTessera>(store, rank, size,
                                                    std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  }

 private:
  // Runs the call, turning tessera's errors into torch's (a RuntimeError in
  // Python naming the peer), and returns its finished Work.
  template <typename F>
  c10::intrusive_ptr<::c10d::Work> run(::c10d::OpType type, const std::vector<at::Tensor>& outputs, F&& call) {
    const auto t0 = Clock::now();
    try {
      call();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "tessera: ", e.what());
    }
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    return c10::make_intrusive<TesseraWork>(getRank(), type, outputs, wall, comm_->last_modeled_seconds());
  }

  static constexpr size_t kArenaBytes = size_t{64} << 20;
  std::unique_ptr<DeviceMemory> arena_;  // outlives comm_ (declared first)
  std::shared_ptr<coll::Communicator> comm_;
};

}  // namespace
}  // namespace tessera::integrations

PYBIND11_MODULE(tessera_torch, m) {
  namespace py = pybind11;
  using tessera::integrations::ProcessGroupTessera;
  using tessera::integrations::TesseraWork;
  m.doc() = "tessera's collectives as the torch.distributed backend 'tessera' (registered on import)";
  py::module_ dist = py::module_::import("torch.distributed");
  py::class_<TesseraWork, ::c10d::Work, c10::intrusive_ptr<TesseraWork>>(m, "Work")
      .def("wall_seconds", &TesseraWork::wall_seconds, "Wall time of the call, in seconds")
      .def("modeled_seconds", &TesseraWork::modeled_seconds,
           "Modeled time of the same collective on the emulated interconnect, in seconds");
  py::class_<ProcessGroupTessera, ::c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupTessera>>(m,
                                                                                                 "ProcessGroupTessera")
      .def("total_modeled_seconds", &ProcessGroupTessera::total_modeled_seconds,
           "Modeled seconds of every collective so far")
      .def("transport", &ProcessGroupTessera::transport, "shm, tcp or shm+tcp");
  m.def("create_process_group", &ProcessGroupTessera::create, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"));
  dist.attr("Backend").attr("register_backend")("tessera", m.attr("create_process_group"));
}
