#include "parallel/models/generation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include "parallel/checkpoint/checkpoint.h"
#include "parallel/checkpoint/safetensors.h"
#include "parallel/layers/kv_cache.h"
#include "parallel/models/families.h"
#include "parallel/models/hf_io.h"
#include "runtime/bf16.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/sim_clock.h"

namespace tessera::parallel::models {

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& o, uint64_t request, int64_t step,
                     std::vector<std::pair<float, int32_t>>& scratch) {
  TESSERA_ARG_CHECK(vocab >= 1, "sampling from ", vocab, " logits");
  if (o.greedy) {
    int64_t best = 0;
    for (int64_t j = 1; j < vocab; ++j)
      if (logits[j] > logits[best]) best = j;
    return static_cast<int32_t>(best);
  }
  TESSERA_ARG_CHECK(o.temperature > 0 && o.top_p > 0 && o.top_p <= 1 && o.top_k >= 0, "sampling: temperature ",
                    o.temperature, ", top_k ", o.top_k, ", top_p ", o.top_p);
  scratch.clear();
  for (int64_t j = 0; j < vocab; ++j)
    if (std::isfinite(logits[j])) scratch.emplace_back(logits[j], static_cast<int32_t>(j));
  TESSERA_CHECK(!scratch.empty(), "sampling: no finite logit");
  // Larger logits first, the lower id first among equal ones: one order on every rank.
  auto before = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = scratch.size();
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < keep) {
    keep = static_cast<size_t>(o.top_k);
    std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(keep), scratch.end(), before);
    scratch.resize(keep);
  }
  std::sort(scratch.begin(), scratch.end(), before);
  // Softmax of logits / temperature over the kept tokens (in double), then the top-p prefix.
  const double inv_t = 1.0 / o.temperature, top = scratch.front().first;
  std::vector<double> p(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp((scratch[i].first - top) * inv_t);
  if (o.top_p < 1) {
    double cum = 0;
    size_t n = 0;
    while (n < keep && cum < o.top_p * sum) cum += p[n++];
    keep = std::max<size_t>(1, n);
    sum = cum > 0 ? cum : p[0];
  }
  // A uniform draw in [0, 1) keyed by (seed, request, step).
  const uint64_t r = splitmix64(splitmix64(splitmix64(o.seed) ^ request) ^ static_cast<uint64_t>(step));
  const double u = static_cast<double>(r >> 11) * 0x1.0p-53 * sum;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return scratch[i].second;
  }
  return scratch[keep - 1].second;
}

InferenceWeights::InferenceWeights(CausalLM& model, Device* device, DType dtype) : model_(model), dtype_(dtype) {
  TESSERA_ARG_CHECK(dtype == DType::F32 || dtype == DType::BF16, "inference weights as ", dtype_name(dtype),
                    " (F32 or BF16)");
  int64_t total = 0;
  for (parallel::layers::Parameter* p : model.parameters()) total += p->numel();
  buffer_ = Tensor::container({std::max<int64_t>(total, 1)}, dtype, device);
  bytes_ = static_cast<uint64_t>(total) * dtype_size(dtype);
  float* base = buffer_.data<float>();
  int64_t off = 0;
  for (parallel::layers::Parameter* p : model.parameters()) {
    p->value = base + off;
    p->grad = nullptr;
    p->offset = off;
    off += p->numel();
  }
}

void InferenceWeights::finish() {
  if (dtype_ != DType::BF16) return;
  for (parallel::layers::Parameter* p : model_.parameters()) bf16::round_inplace(p->value, p->numel());
}

double GenerationResult::tpot_wall_s() const {
  if (steps.size() < 2) return 0;
  double s = 0;
  for (size_t i = 1; i < steps.size(); ++i) s += steps[i].wall_s;
  return s / static_cast<double>(steps.size() - 1);
}

double GenerationResult::tpot_emulated_s() const {
  if (steps.size() < 2) return 0;
  double s = 0;
  for (size_t i = 1; i < steps.size(); ++i) s += steps[i].emulated_s;
  return s / static_cast<double>(steps.size() - 1);
}

void gather_logits(const parallel::layers::ParallelState& ps, const ModelConfig& cfg, const float* shard, int64_t rows,
                   std::vector<float>& gathered, std::vector<float>& full) {
  const int tp = ps.tp_size;
  const int64_t w = vocab_shard(cfg, tp), v = cfg.vocab;
  full.resize(static_cast<size_t>(rows * v));
  const float* all = shard;
  if (tp > 1) {
    gathered.resize(static_cast<size_t>(tp * rows * w));
    ps.tp_all_gather(shard, gathered.data(), rows * w);
    all = gathered.data();
  }
  for (int t = 0; t < tp; ++t) {
    const int64_t begin = t * w, count = std::clamp<int64_t>(v - begin, 0, w);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(full.data() + r * v + begin, all + (t * rows + r) * w, sizeof(float) * static_cast<size_t>(count));
  }
}

ModelConfig init_model_config(const std::string& path, bool* checkpoint) {
  if (auto dir = parallel::checkpoint::resolve_checkpoint(path)) {
    *checkpoint = true;
    parallel::checkpoint::Checkpoint ck(*dir);
    ModelConfig c = ModelConfig::from_json_text(ck.model_json(), ck.where() + " (the manifest's model)");
    ck.verify_model(*model_layout(c));
    return c;
  }
  *checkpoint = false;
  auto src = parallel::checkpoint::open_safetensors(path);
  ModelConfig c = hf_model_config(path, *src);
  check_hf_tensors(*src, c);
  return c;
}

void load_init_weights(CausalLM& model, const std::string& path, collectives::Communicator* world) {
  if (auto dir = parallel::checkpoint::resolve_checkpoint(path)) {
    parallel::checkpoint::Checkpoint ck(*dir);
    ck.verify_collective(world);
    for (parallel::layers::Parameter* p : model.parameters()) {
      auto t = ck.tensors().find(p->name);
      TESSERA_ARG_CHECK(t != ck.tensors().end(), ck.where(), " has no tensor ", p->name);
      TESSERA_ARG_CHECK(t->second.shape == p->full_shape, ck.where(), ": tensor ", p->name, " has shape ",
                        shape_str(t->second.shape), ", the model's is ", shape_str(p->full_shape));
      ck.read_f32(*p, parallel::checkpoint::StateKind::Param, 0, p->numel(), p->value);
    }
    return;
  }
  auto src = parallel::checkpoint::open_safetensors(path);
  for (parallel::layers::Parameter* p : model.parameters()) {
    Tensor t = Tensor::empty(p->full_shape, DType::F32);
    read_hf_tensor(*src, model.config(), p->name, t);
    parallel::layers::load_shard(*p, t.data<float>());
  }
}

namespace {
double emulated_now(const Device* d) { return d ? d->clock().totals().total_s() : 0.0; }
}  // namespace

GenerationResult generate(CausalLM& model, const parallel::layers::ParallelState& ps,
                          const std::vector<GenerationRequest>& requests, const SamplingOptions& sampling,
                          int max_batch, const std::function<void(const GenerationStep&)>& on_step) {
  const ModelConfig& cfg = model.config();
  TESSERA_ARG_CHECK(!requests.empty(), "generate: no prompts");
  const size_t nreq = requests.size();
  int64_t longest = 0;
  for (size_t i = 0; i < nreq; ++i) {
    const GenerationRequest& q = requests[i];
    const auto p = static_cast<int64_t>(q.prompt.size());
    TESSERA_ARG_CHECK(p >= 1, "prompt ", i, " is empty");
    TESSERA_ARG_CHECK(q.max_new_tokens >= 1, "prompt ", i, ": --max-new-tokens must be >= 1, not ", q.max_new_tokens);
    TESSERA_ARG_CHECK(q.arrival_step >= 0, "prompt ", i, ": arrival step ", q.arrival_step);
    for (int32_t t : q.prompt)
      TESSERA_ARG_CHECK(t >= 0 && t < cfg.vocab, "prompt ", i, ": token id ", t, " is outside the vocabulary [0, ",
                        cfg.vocab, ") of model '", cfg.name, "'");
    // As vLLM's max_model_len: the prompt and every new token within the context (the cache holds them all).
    TESSERA_ARG_CHECK(p + q.max_new_tokens <= cfg.max_seq, "prompt ", i, ": ", p, " tokens + ", q.max_new_tokens,
                      " new exceed model '", cfg.name, "''s context of ", cfg.max_seq, " tokens");
    longest = std::max(longest, p + q.max_new_tokens);
  }
  const int slots = max_batch > 0 ? std::min<int>(max_batch, static_cast<int>(nreq)) : static_cast<int>(nreq);
  GenerationResult res;
  // A slot per request holds its own prompt + new tokens; shared slots the longest.
  if (slots == static_cast<int>(nreq)) {
    for (const GenerationRequest& q : requests)
      res.slot_capacity.push_back(static_cast<int64_t>(q.prompt.size()) + q.max_new_tokens);
  } else {
    res.slot_capacity.assign(static_cast<size_t>(slots), longest);
  }
  Device* dev = ps.device;
  std::unique_ptr<parallel::layers::KvCache> cache;
  const uint64_t in_use = dev ? dev->memory_stats().in_use : 0;
  try {
    cache = std::make_unique<parallel::layers::KvCache>(dev, model.num_layers(), kv_cache_width(cfg, ps.tp_size),
                                                        res.slot_capacity);
  } catch (const DeviceOutOfMemory& e) {
    int64_t cached = 0;
    for (int64_t c : res.slot_capacity) cached += c;
    throw InvalidArgument(detail::concat(
        "the batch does not fit the KV cache: ", slots, " sequence(s) of up to ", longest, " tokens (", cached,
        " cached tokens) need ", e.requested(), " bytes on each TP rank, and device ", dev ? dev->name() : "?", " has ",
        e.capacity() - std::min(e.in_use(), e.capacity()), " of ", e.capacity(),
        " bytes free beside the weights; use fewer or shorter prompts, fewer --max-new-tokens, or a larger --tp"));
  }
  // What the device charged for the cache (its one allocation), by its own counter.
  res.kv_cache_bytes = dev ? dev->memory_stats().in_use - in_use : cache->bytes();
  res.tokens.assign(nreq, {});
  res.first_step.assign(nreq, -1);

  // Which request each slot serves (-1: free), the requests waiting, the token each running one feeds next.
  std::vector<int> slot_req(static_cast<size_t>(slots), -1);
  std::deque<int> waiting;
  for (size_t i = 0; i < nreq; ++i) waiting.push_back(static_cast<int>(i));
  std::stable_sort(waiting.begin(), waiting.end(),
                   [&](int a, int b) { return requests[a].arrival_step < requests[b].arrival_step; });
  std::vector<int32_t> next(nreq, 0), tokens;
  std::vector<int> fwd_slots, fwd_reqs;
  std::vector<int64_t> lens;
  std::vector<float> gathered, full;
  std::vector<std::pair<float, int32_t>> scratch;
  size_t done = 0;
  for (int64_t step = 0; done < nreq; ++step) {
    fwd_slots.clear();
    fwd_reqs.clear();
    lens.clear();
    tokens.clear();
    int prefills = 0;
    // Running sequences decode their last token; arrived requests take free slots and prefill.
    for (int s = 0; s < slots; ++s) {
      int r = slot_req[static_cast<size_t>(s)];
      if (r >= 0) {
        fwd_slots.push_back(s);
        fwd_reqs.push_back(r);
        lens.push_back(1);
        tokens.push_back(next[static_cast<size_t>(r)]);
      }
    }
    for (int s = 0; s < slots; ++s) {
      if (slot_req[static_cast<size_t>(s)] >= 0 || waiting.empty() || requests[waiting.front()].arrival_step > step)
        continue;
      const int r = waiting.front();
      waiting.pop_front();
      slot_req[static_cast<size_t>(s)] = r;
      cache->reset(s);
      fwd_slots.push_back(s);
      fwd_reqs.push_back(r);
      const std::vector<int32_t>& p = requests[static_cast<size_t>(r)].prompt;
      lens.push_back(static_cast<int64_t>(p.size()));
      tokens.insert(tokens.end(), p.begin(), p.end());
      ++prefills;
    }
    if (fwd_slots.empty()) continue;  // nothing arrived yet: the step is idle
    const Stopwatch wall;
    const double emu0 = emulated_now(dev);
    const float* logits = model.forward_cached(*cache, tokens.data(), fwd_slots, lens, false);
    const auto rows = static_cast<int64_t>(fwd_slots.size());
    gather_logits(ps, cfg, logits, rows, gathered, full);
    GenerationStep st;
    st.step = step;
    st.batch = static_cast<int>(rows);
    st.prefills = prefills;
    for (int64_t i = 0; i < rows; ++i) {
      const int r = fwd_reqs[static_cast<size_t>(i)];
      std::vector<int32_t>& out = res.tokens[static_cast<size_t>(r)];
      const int32_t t = sample_token(full.data() + i * cfg.vocab, cfg.vocab, sampling, static_cast<uint64_t>(r),
                                     static_cast<int64_t>(out.size()), scratch);
      if (out.empty()) res.first_step[static_cast<size_t>(r)] = step;
      out.push_back(t);
      next[static_cast<size_t>(r)] = t;
      st.requests.push_back(r);
      st.tokens.push_back(t);
      if (static_cast<int64_t>(out.size()) == requests[static_cast<size_t>(r)].max_new_tokens) {
        slot_req[static_cast<size_t>(fwd_slots[static_cast<size_t>(i)])] = -1;  // leaves the batch
        ++done;
      }
    }
    st.wall_s = wall.seconds();
    st.emulated_s = emulated_now(dev) - emu0;
    if (on_step) on_step(st);
    res.steps.push_back(std::move(st));
  }
  return res;
}

}  // namespace tessera::parallel::models
