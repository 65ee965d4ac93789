// The Trainer's training checkpoints: TrainerState (cereal) and
// Trainer::save_checkpoint / load_checkpoint over parallel/checkpoint/checkpoint.h.
#include "parallel/models/gpt/trainer_state.h"

#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/models/families.h"
#include "parallel/models/gpt/hf.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::parallel::models::gpt {

namespace ckpt = parallel::checkpoint;
using detail::concat;

TrainerState make_trainer_state(const TrainOptions& o, int64_t step, const std::string& run_id, int pp) {
  TrainerState s;
  s.step = step;
  s.run_id = run_id;
  s.seed = o.seed;
  s.next_sample = step * o.global_batch;
  ModelConfig m = o.model;
  m.name.clear();
  s.model_json = m.to_json();
  s.seq = o.seq;
  s.micro_batch = o.micro_batch;
  s.global_batch = o.global_batch;
  s.steps = o.steps;
  s.lr = o.lr;
  s.min_lr = o.min_lr;
  s.warmup = o.warmup;
  s.decay_steps = o.adamw.lr.decay_steps;
  s.beta1 = o.adamw.beta1;
  s.beta2 = o.adamw.beta2;
  s.eps = o.adamw.eps;
  s.weight_decay = o.adamw.weight_decay;
  s.clip_norm = o.adamw.clip_norm;
  s.tp = o.tp;
  s.dp = o.dp;
  s.pp = pp;
  s.zero1 = o.adamw.zero1;
  s.sequence_parallel = o.sequence_parallel;
  s.bucket_elems = o.adamw.bucket_elems;
  s.data = o.data;
  s.val_fraction = o.val_fraction;
  return s;
}

ModelConfig model_of(const TrainerState& s, const std::string& where) {
  return ModelConfig::from_json_text(s.model_json, where + " (its model)");
}

TrainOptions options_of(const TrainerState& s, const std::string& where) {
  TrainOptions o;
  o.model = model_of(s, where);
  o.seq = s.seq;
  o.tp = s.tp;
  o.dp = s.dp;
  o.sequence_parallel = s.sequence_parallel;
  o.micro_batch = s.micro_batch;
  o.global_batch = s.global_batch;
  o.steps = s.steps;
  o.lr = s.lr;
  o.min_lr = s.min_lr;
  o.warmup = s.warmup;
  o.adamw.beta1 = s.beta1;
  o.adamw.beta2 = s.beta2;
  o.adamw.eps = s.eps;
  o.adamw.weight_decay = s.weight_decay;
  o.adamw.clip_norm = s.clip_norm;
  o.adamw.zero1 = s.zero1;
  o.adamw.bucket_elems = s.bucket_elems;
  o.seed = s.seed;
  o.data = s.data;
  o.val_fraction = s.val_fraction;
  return o;
}

std::string encode_trainer_state(const TrainerState& s) {
  std::ostringstream out;
  {
    cereal::PortableBinaryOutputArchive a(out);
    a(TrainerState::kVersion, s);
  }
  return out.str();
}

TrainerState decode_trainer_state(const std::string& bytes, const std::string& where) {
  std::istringstream in(bytes);
  TrainerState s;
  uint32_t version = 0;
  try {
    cereal::PortableBinaryInputArchive a(in);
    a(version);
    if (version != TrainerState::kVersion)
      throw FormatError(concat(where, ": trainer state version ", version, " is not supported (this build reads ",
                               TrainerState::kVersion, ")"));
    a(s);
  } catch (const cereal::Exception& e) {
    throw FormatError(concat(where, ": trainer state does not decode (", e.what(), ")"));
  }
  if (in.peek() != std::char_traits<char>::eof())
    throw FormatError(concat(where, ": trainer state has trailing bytes"));
  return s;
}

std::string resume_mismatches(const TrainerState& saved, const TrainOptions& now) {
  const TrainerState n = make_trainer_state(now, saved.step, saved.run_id, saved.pp);
  std::ostringstream out;
  auto cmp = [&](const char* what, auto a, auto b) {
    if (a != b) out << what << ": the checkpoint has " << a << ", this run " << b << "\n";
  };
  cmp("model", saved.model_json, n.model_json);
  cmp("seq", saved.seq, n.seq);
  cmp("global batch", saved.global_batch, n.global_batch);
  cmp("steps (the learning-rate schedule decays over them)", saved.decay_steps, n.decay_steps);
  cmp("seed", saved.seed, n.seed);
  cmp("lr", saved.lr, n.lr);
  cmp("min lr", saved.min_lr, n.min_lr);
  cmp("warmup", saved.warmup, n.warmup);
  cmp("weight decay", saved.weight_decay, n.weight_decay);
  cmp("clip norm", saved.clip_norm, n.clip_norm);
  cmp("beta1", saved.beta1, n.beta1);
  cmp("beta2", saved.beta2, n.beta2);
  cmp("eps", saved.eps, n.eps);
  cmp("validation fraction", saved.val_fraction, n.val_fraction);
  if (saved.data != n.data) out << "data files differ\n";
  return out.str();
}

std::string relayout_trainer_state(const std::string& bytes, int tp, int dp, int pp, const std::string& where) {
  TrainerState st = decode_trainer_state(bytes, where);
  st.tp = tp;
  st.dp = dp;
  st.pp = pp;
  return encode_trainer_state(st);
}

namespace {

// 128 random bits from world rank 0, the same on every rank.
std::string new_run_id(collectives::Communicator* world) {
  int32_t bits[4] = {0, 0, 0, 0};
  if (world == nullptr || world->rank() == 0) {
    std::random_device rd;
    for (int32_t& b : bits) b = static_cast<int32_t>(rd());
  }
  if (world != nullptr && world->size() > 1) world->broadcast(bits, 4, DType::I32, 0);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", static_cast<uint32_t>(bits[0]), static_cast<uint32_t>(bits[1]),
                static_cast<uint32_t>(bits[2]), static_cast<uint32_t>(bits[3]));
  return buf;
}

// Each parameter of every model chunk this rank holds, with the range of its
// shard whose moments it holds. `tied_copy` (the last pipeline stage's copy of
// the tied embedding, kept equal to the first stage's) is loaded like the
// original but not saved, so every element is stored once.
std::vector<ckpt::HeldTensor> held_tensors(const std::vector<parallel::layers::Parameter*>& params,
                                           parallel::optim::DistributedOptimizer& opt,
                                           const parallel::layers::Parameter* tied_copy) {
  std::map<int64_t, size_t> by_offset;
  std::vector<ckpt::HeldTensor> held;
  held.reserve(params.size());
  const DType stored = opt.config().param_dtype;  // bf16 parameters are saved as 16-bit values
  for (parallel::layers::Parameter* p : params) {
    by_offset[p->offset] = held.size();
    ckpt::HeldTensor h;
    h.param = p;
    h.save = p != tied_copy;
    h.dtype = stored;
    held.push_back(h);
  }
  opt.for_each_moment_run_mutable([&](int64_t off, int64_t n, float* m, float* v) {
    auto it = std::prev(by_offset.upper_bound(off));
    ckpt::HeldTensor& h = held[it->second];
    TESSERA_CHECK(off + n <= h.param->offset + h.param->numel() && h.m == nullptr, "moment run at ", off,
                  " is not inside one parameter");
    h.moment_begin = off - h.param->offset;
    h.moment_end = h.moment_begin + n;
    h.m = m;
    h.v = v;
  });
  // The master weights come in the moments' runs.
  opt.for_each_master_run([&](int64_t off, int64_t n, float* master) {
    ckpt::HeldTensor& h = held[std::prev(by_offset.upper_bound(off))->second];
    TESSERA_CHECK(off - h.param->offset == h.moment_begin && n == h.moment_end - h.moment_begin, "master run at ", off,
                  " is not the moments' run of ", h.param->name);
    h.master = master;
  });
  return held;
}

}  // namespace

ckpt::SaveResult Trainer::save_checkpoint(const std::string& root, int keep, FileOps* ops) {
  collectives::Communicator* world = ps_.world.get();
  if (run_id_.empty()) run_id_ = new_run_id(world);
  ckpt::SaveSpec spec;
  spec.root = root;
  spec.step = step_;
  spec.run_id = run_id_;
  spec.layout = {ps_.tp_size, ps_.dp_size, ps_.pp_size, opts_.adamw.zero1, ps_.sp(), {}};
  if (opts_.virtual_stages == 1) spec.layout.stages = opts_.stages;
  spec.tp_rank = ps_.tp_rank;
  spec.dp_rank = ps_.dp_rank;
  spec.pp_rank = ps_.pp_rank;
  spec.world_rank = ps_.global_rank();
  spec.model_json = opts_.model.to_json();
  spec.trainer_state = encode_trainer_state(make_trainer_state(opts_, step_, run_id_, ps_.pp_size));
  spec.keep = keep;
  spec.ops = ops;
  return ckpt::save_checkpoint(world, held_tensors(parameters(), *opt_, tied_copy()), spec);
}

void Trainer::load_checkpoint(const std::string& dir) {
  collectives::Communicator* world = ps_.world.get();
  ckpt::Checkpoint ck(dir);
  const std::string w = ck.where();
  // The recorded model, checked against the tensors present, then against this run's.
  const ModelConfig saved = ModelConfig::from_json_text(ck.model_json(), w + " (the manifest's model)");
  ck.verify_model(*models::model_layout(saved));
  // Every file's size, SHA-256 and recorded model before anything else is believed.
  ck.verify_collective(world);
  const ModelConfig& mine = opts_.model;
  const std::string diff = models::model_differences(saved, mine, "the checkpoint", "this run");
  TESSERA_ARG_CHECK(diff.empty(), w, " holds another model:", diff);
  const bool training = ck.has_trainer_state();
  if (training) {
    const TrainerState st = decode_trainer_state(ck.read_trainer_state(), w);
    if (st.step != ck.step() || st.run_id != ck.run_id())
      throw FormatError(concat(ckpt::kTrainerStateName, " in ", ck.dir(), " belongs to run ", st.run_id, " at step ",
                               st.step, ", the manifest to run ", ck.run_id(), " at step ", ck.step(),
                               " (a trainer state copied from another checkpoint)"));
    const std::string diff = resume_mismatches(st, opts_);
    TESSERA_ARG_CHECK(diff.empty(), w, " is of another run configuration:\n", diff);
    TESSERA_ARG_CHECK(ck.has_kind(ckpt::StateKind::ExpAvg) && ck.has_kind(ckpt::StateKind::ExpAvgSq), w,
                      " holds no optimizer state");
  }
  std::vector<ckpt::HeldTensor> held = held_tensors(parameters(), *opt_, tied_copy());
  // Every shape is checked before the first byte is copied.
  for (const ckpt::HeldTensor& h : held) {
    const parallel::layers::Parameter& p = *h.param;
    auto t = ck.tensors().find(p.name);
    if (t == ck.tensors().end()) throw FormatError(concat(w, " has no tensor ", p.name));
    TESSERA_ARG_CHECK(t->second.shape == p.full_shape, w, ": tensor ", p.name, " has shape ",
                      shape_str(t->second.shape), ", the model's is ", shape_str(p.full_shape));
  }
  // The most precise copy of the weights this run can hold: an fp32 run
  // takes a bf16 run's master weights when the checkpoint has them; a bf16
  // run with master weights takes its masters from the checkpoint's masters,
  // else from its parameters as stored (an fp32 run's fp32 values), and its
  // parameters as stored (rounded to bf16 when they were fp32).
  const bool fp32_run = opts_.precision == DType::F32;
  const bool masters = ck.has_kind(ckpt::StateKind::Master);
  for (const ckpt::HeldTensor& h : held) {
    ck.read_f32(*h.param, fp32_run && masters ? ckpt::StateKind::Master : ckpt::StateKind::Param, 0, h.param->numel(),
                h.param->value);
    if (training && h.moment_end > h.moment_begin) {
      ck.read_f32(*h.param, ckpt::StateKind::ExpAvg, h.moment_begin, h.moment_end, h.m);
      ck.read_f32(*h.param, ckpt::StateKind::ExpAvgSq, h.moment_begin, h.moment_end, h.v);
    }
  }
  opt_->values_changed();  // bf16: rounds the values, masters = the rounded values
  for (const ckpt::HeldTensor& h : held)
    if (h.master && h.moment_end > h.moment_begin)
      ck.read_f32(*h.param, masters ? ckpt::StateKind::Master : ckpt::StateKind::Param, h.moment_begin, h.moment_end,
                  h.master);
  // Weights only (a `tessera ckpt shard` output): a fresh optimizer at step 0, a new run.
  step_ = training ? ck.step() : 0;
  if (training) run_id_ = ck.run_id();
}

}  // namespace tessera::parallel::models::gpt
