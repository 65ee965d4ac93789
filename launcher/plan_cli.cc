#include "launcher/plan_cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "parallel/inference_planner.h"
#include "parallel/models/hf_config.h"
#include "parallel/plan_io.h"
#include "parallel/planner.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/topology.h"

namespace tessera::launcher {

namespace {

using namespace tessera::parallel;  // the planner and plan files

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

struct PlanArgs {
  std::string model, topology, json, zero1, sp, recompute, order = "tp-dp-pp", precision = "bf16", device, schedule;
  std::string runtime = "tessera", overlap_grad_reduce = "off";
  std::string overlap_tp_backward;  // on|off; not given: on with megatron-lm, off with tessera
  bool fp16_lm_cross_entropy = false;
  int cores = 0, tp = 0, pp = 0, dp = 0, mbs = 0, vstages = 0, top = 5;
  long long global_batch = 0;
  int seq = 0;
  bool inference = false;
  int batch = 0, prompt_len = 0, gen_len = 0;
  double efficiency = 0, memory_fraction = 0.9, link_bw_gb_s = 0, link_latency_us = 0;
  CLI::App* cmd = nullptr;
};

std::string f(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", prec, v);
  return buf;
}

std::string gib(double bytes) { return f(bytes / kGiB, 2) + " GiB"; }

std::string onoff(bool b) { return b ? "on" : "off"; }

// "12 12 12 13" -> "[12 x3, 13]" when long.
std::string stages_text(const std::vector<int>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size();) {
    size_t j = i;
    while (j < s.size() && s[j] == s[i]) ++j;
    if (i) os << ", ";
    os << s[i];
    if (j - i > 1) os << " x" << (j - i);
    i = j;
  }
  os << "]";
  return os.str();
}

std::string coords_text(const std::vector<int>& c) {
  std::string s = "(";
  for (size_t i = 0; i < c.size(); ++i) s += (i ? "," : "") + std::to_string(c[i]);
  return s + ")";
}

std::string parts_text(const Placement& pl, const Topology& topo, MeshAxis a) {
  std::string s;
  for (const auto& p : pl.parts(a)) {
    if (p.extent <= 1) continue;
    const auto& d = topo.dims()[static_cast<size_t>(p.dim)];
    s += (s.empty() ? "" : " x ") + d.name + "[" + std::to_string(p.extent);
    if (p.stride > 1) s += " stride " + std::to_string(p.stride);
    s += "]";
  }
  return s.empty() ? "(size 1)" : s;
}

std::string hops_text(const HopStats& h) {
  return "max " + std::to_string(h.max_hops) + " hops, mean " + f(h.mean_hops, 2) + ", " +
         f(100 * h.one_hop_fraction, 1) + "% one-hop" + (h.ring ? " (ring incl. wrap)" : " (neighbours)");
}

void print_plan(std::ostream& os, const Topology& topo, const PlannerOptions& opts, const RankedPlan& p) {
  const PlanChoice& c = p.choice;
  const PlanCost& k = p.cost;
  os << "Best plan: tp=" << c.tp << " pp=" << c.pp << " dp=" << c.dp << " micro-batch=" << c.micro_batch
     << " virtual-stages=" << c.virtual_stages << " zero1=" << onoff(c.zero1)
     << " sequence-parallel=" << onoff(c.sequence_parallel) << " recompute=" << recompute_name(c.recompute) << "\n";
  os << "  schedule " << (c.pp == 1 ? "none" : pipeline::schedule_name(c.schedule)) << ", " << k.num_micro_batches
     << " micro-batches per step, rank order " << mesh_order_name(opts.order) << "\n";
  os << "  memory per rank (stage " << k.memory_stage << "): params " << gib(k.memory.params) << ", grads "
     << gib(k.memory.grads) << ", optimizer " << gib(k.memory.optimizer) << ", activations "
     << gib(k.memory.activations) << ", total " << gib(k.memory.total) << "\n";
  os << "  step time (stage " << k.time_stage << " paces the pipeline): compute " << f(k.time.compute, 4)
     << " s, tp_comm " << f(k.time.tp_comm, 4) << " s, pp_comm " << f(k.time.pp_comm, 4) << " s, bubble "
     << f(k.time.bubble, 4) << " s, dp_comm " << f(k.time.dp_comm, 4) << " s, total " << f(k.time.total, 4) << " s\n";
  if (c.pp > 1 && !k.stage_bubbles.empty()) {
    // What a trace of the step shows (trace_bubbles), against the equal-stage formula.
    os << "  bubble per stage (idle share of its pipeline phase, as the trace reads it):";
    const int p = static_cast<int>(k.stage_bubbles.size());
    for (int i = 0; i < p; ++i) {
      if (i < 6 || i >= p - 2)
        os << " stage " << i << " " << f(100 * k.stage_bubbles[static_cast<size_t>(i)].fraction(), 1) << "%"
           << (i + 1 < p ? "," : "");
      else if (i == 6)
        os << " ...";
    }
    os << "; schedule (p-1)/(v m+p-1) = "
       << f(100 * pipeline::bubble_fraction(c.pp, k.num_micro_batches, c.virtual_stages), 1) << "% (equal stages)\n";
  }
  os << "  FLOPs per step " << f(k.flops_per_step / 1e15, 2) << " PFLOP, achieved "
     << f(k.achieved_flops_per_device / 1e12, 2) << " TFLOP/s per device, MFU " << f(100 * k.mfu, 1) << "%\n";
  os << "  layers per stage: " << stages_text(c.stage_layers);
  if (c.virtual_stages > 1)
    os << " (each stage holds " << c.virtual_stages << " chunks of " << c.stage_layers[0] / c.virtual_stages
       << " layers; chunk j of stage i is the (j*pp + i)-th block of layers)";
  os << "\n";
  if (c.virtual_stages == 1 && c.pp > 1) {
    os << "  layer ranges:";
    int first = 0;
    const int p = static_cast<int>(c.stage_layers.size());
    for (int i = 0; i < p; ++i) {
      int n = c.stage_layers[static_cast<size_t>(i)];
      if (i < 6 || i >= p - 2)
        os << " stage " << i << " [" << first << ", " << first + n << ")" << (i + 1 < p ? "," : "");
      else if (i == 6)
        os << " ...";
      first += n;
    }
    os << "\n";
  }

  Mesh mesh({.tp = c.tp, .dp = c.dp, .pp = c.pp}, opts.order);
  Placement pl(topo, mesh);
  PlacementSummary s = summarize_placement(pl);
  os << "  placement:\n";
  os << "    TP groups on " << parts_text(pl, topo, MeshAxis::TP) << ": " << hops_text(s.tp) << "\n";
  os << "    PP stages on " << parts_text(pl, topo, MeshAxis::PP) << ": " << hops_text(s.pp) << "\n";
  os << "    DP groups on " << parts_text(pl, topo, MeshAxis::DP) << ": " << hops_text(s.dp) << "\n";
  std::string dims;
  for (const auto& d : topo.dims()) dims += (dims.empty() ? "" : ",") + d.name;
  os << "    rank (tp,dp,pp) -> core (" << dims << ")";
  const int n = mesh.world_size();
  const int shown = n <= 64 ? n : 8;
  if (shown < n) os << ", first " << shown << " and last 2 of " << n;
  os << ":\n";
  auto line = [&](int r) {
    MeshCoord mc = mesh.coord(r);
    os << "      " << r << " (" << mc.tp << "," << mc.dp << "," << mc.pp << ") -> " << pl.node(r) << " "
       << coords_text(pl.coords(r)) << "\n";
  };
  for (int r = 0; r < shown; ++r) line(r);
  if (shown < n) {
    os << "      ...\n";
    for (int r = n - 2; r < n; ++r) line(r);
  }
}

// How a topology joins its chips: "switch" (any chip level all-to-all), "one-row ring" (one chip
// level, a ring), "torus" (more), "" (one chip, or emulated cores).
std::string chip_links(const Topology& t) {
  int dims = 0;
  bool ring = false, sw = false;
  for (const TopologyDim& d : t.dims()) {
    if (d.level != TopoLevel::Chip || d.net.size <= 1) continue;
    ++dims;
    ring = d.net.kind == LinkKind::Ring;
    sw = sw || d.net.kind == LinkKind::Switch;
  }
  if (dims == 0 || Topology::is_emulated(t.name())) return "";
  if (sw) return "switch";
  return dims == 1 && ring ? "one-row ring" : "torus";
}

// The model's decode and prefill on this topology beside the other kind's at the same TP (a one-row
// ring against trn2.48xlarge's torus; a torus or a switch against inf2.48xlarge's one row), each time
// per output token split by what sets it (parallel::decode_terms), and the term that differs most.
void print_topology_comparison(const ModelConfig& model, const Topology& topo, const InferenceConfig& c,
                               const TopologyOptions& topts, int tp) {
  const std::string here_kind = chip_links(topo);
  if (here_kind.empty()) return;
  const std::string other_name = here_kind == "one-row ring" ? "trn2.48xlarge" : "inf2.48xlarge";
  const Topology other = Topology::load(other_name, topts);
  // The same TP if the other holds it, else the largest power of two below it that both hold.
  int t = tp;
  while (t > 1 && (other.num_cores() % t != 0 || topo.num_cores() % t != 0)) t /= 2;
  DecodeTerms a, b;
  try {
    a = decode_terms(model, topo, c, t);
    b = decode_terms(model, other, c, t);
  } catch (const InvalidArgument& e) {
    std::printf("\n(no comparison with %s at tp %d: %s)\n", other_name.c_str(), t, e.what());
    return;
  }
  std::printf("\nWhy %s (%s) and %s (%s) differ for %s at tp %d%s:\n", topo.name().c_str(), here_kind.c_str(),
              other_name.c_str(), chip_links(other).c_str(), model.name.c_str(), t,
              t == tp ? "" : " (the largest TP both hold)");
  const std::string& tn = topo.name();
  const std::string& on = other_name;
  const int w = static_cast<int>(std::max<size_t>(16, std::max(tn.size(), on.size())));
  auto row = [&](const char* what, const std::string& x, const std::string& y) {
    std::printf("  %-34s %*s %*s\n", what, w, x.c_str(), w, y.c_str());
  };
  auto ms = [](double s) { return f(s * 1e3, 4); };
  row("", tn, on);
  row("TTFT ms", ms(a.plan.ttft_s), ms(b.plan.ttft_s));
  row("TPOT ms", ms(a.plan.tpot_s), ms(b.plan.tpot_s));
  row("  kernels (HBM, FLOPs) ms", ms(a.kernels_s), ms(b.kernels_s));
  row("  TP all-reduce hop latency ms", ms(a.latency_s), ms(b.latency_s));
  row("  TP all-reduce link bandwidth ms", ms(a.bandwidth_s), ms(b.bandwidth_s));
  row("one decode all-reduce us", f(a.plan.allreduce_token_s * 1e6, 2), f(b.plan.allreduce_token_s * 1e6, 2));
  row("TP ring's slowest step, hops", std::to_string(a.plan.tp_ring_max_hops), std::to_string(b.plan.tp_ring_max_hops));
  row("HBM GB/s per core", f(topo.device().hbm_bandwidth / 1e9, 0), f(other.device().hbm_bandwidth / 1e9, 0));
  row("decode weights + KV at HBM ms", ms(a.plan.decode_memory_s), ms(b.plan.decode_memory_s));
  row("tokens/s per replica", f(c.batch / a.plan.tpot_s, 0), f(c.batch / b.plan.tpot_s, 0));
  // The term that differs most, named by what sets it.
  struct Term {
    std::string what;
    double here, there;
  };
  const std::vector<Term> terms = {
      {"the kernels (HBM: " + f(topo.device().hbm_bandwidth / 1e9, 0) + " against " +
           f(other.device().hbm_bandwidth / 1e9, 0) + " GB/s per core, reading the weights and KV cache in " +
           ms(a.plan.decode_memory_s) + " against " + ms(b.plan.decode_memory_s) + " ms; FLOPs and launches the rest)",
       a.kernels_s, b.kernels_s},
      {"the per-layer TP all-reduces' latency over hops (" + std::to_string(2 * model.layers + 1) +
           " all-reduces per token; the ring's slowest step " + std::to_string(a.plan.tp_ring_max_hops) + " against " +
           std::to_string(b.plan.tp_ring_max_hops) + " hop(s))",
       a.latency_s, b.latency_s},
      {"the TP all-reduces' link bandwidth", a.bandwidth_s, b.bandwidth_s}};
  const Term* top = &terms[0];
  for (const Term& t2 : terms)
    if (std::abs(t2.here - t2.there) > std::abs(top->here - top->there)) top = &t2;
  const double diff = a.plan.tpot_s - b.plan.tpot_s;
  std::printf("%s is %s ms %s per output token than %s; the term that differs most is %s: %s ms against %s ms\n",
              tn.c_str(), ms(std::abs(diff)).c_str(), diff >= 0 ? "slower" : "faster", on.c_str(), top->what.c_str(),
              ms(top->here).c_str(), ms(top->there).c_str());
}

// tessera plan --inference: one row per TP degree (docs/planner.md, "Inference").
int run_inference_plan(const PlanArgs& a) {
  if (!a.json.empty()) cli::check_output_file("--json", a.json);
  TopologyOptions topts;
  topts.device = a.device;
  const ModelConfig model = models::load_model(a.model);
  Topology topo = Topology::load(a.topology, topts);
  if (a.cores > 0) topo = topo.first_cores(a.cores);
  InferenceConfig c;
  c.batch = a.batch;
  c.prompt = a.prompt_len;
  c.generate = a.gen_len;
  c.dtype = a.precision == "fp32" ? DType::F32 : DType::BF16;
  c.tp = a.tp;
  c.memory_fraction = a.memory_fraction;
  const std::vector<InferencePlan> plans = plan_inference(model, topo, c);
  std::printf(
      "tessera plan --inference: %s on %s (%d cores of %s, %s HBM each), batch %d, prompt %d + %d new tokens, %s\n",
      model.name.c_str(), topo.name().c_str(), topo.num_cores(), topo.device().name.c_str(),
      gib(static_cast<double>(topo.device().hbm_bytes)).c_str(), c.batch, c.prompt, c.generate, a.precision.c_str());
  std::printf("%4s %8s %11s %11s %14s %10s %10s %12s %12s %s\n", "tp", "replicas", "weights", "kv cache",
              "max batch*ctx", "TTFT ms", "TPOT ms", "all-reduce us", "tokens/s", "fits");
  for (const InferencePlan& p : plans)
    std::printf("%4d %8d %11s %11s %14lld %10.3f %10.3f %12.2f %12.0f %s\n", p.tp, p.replicas,
                gib(p.weight_bytes).c_str(), gib(p.kv_bytes).c_str(), static_cast<long long>(p.max_cached_tokens),
                p.ttft_s * 1e3, p.tpot_s * 1e3, p.allreduce_token_s * 1e6, p.tokens_per_s, p.fits ? "yes" : "no");
  const InferencePlan& best = plans.front();
  if (!best.fits) {
    std::printf("nothing fits: tp %d needs %s of weights and %s of KV cache per core, %s usable\n", best.tp,
                gib(best.weight_bytes).c_str(), gib(best.kv_bytes).c_str(), gib(best.usable_bytes).c_str());
  } else {
    std::printf(
        "\nBest plan: tp=%d replicas=%d: TTFT %.3f ms (prefill %s-bound), %.3f ms per output token "
        "(decode %s-bound: weights %.3f ms + KV %.3f ms at HBM bandwidth; TP all-reduces %.3f ms), "
        "%.0f tokens/s\n",
        best.tp, best.replicas, best.ttft_s * 1e3,
        best.prefill_compute_s >= best.prefill_memory_s ? "compute" : "memory", best.tpot_s * 1e3,
        best.decode_compute_s > best.decode_memory_s ? "compute" : "memory",
        best.weight_bytes / topo.device().hbm_bandwidth * 1e3,
        (best.decode_memory_s - best.weight_bytes / topo.device().hbm_bandwidth) * 1e3, best.decode_comm_s * 1e3,
        best.tokens_per_s);
    std::printf(
        "the TP group spans %d chip(s); its ring's slowest step crosses %d hop(s), so each of the %d "
        "all-reduces per token (2 per layer and the embedding's) costs %.2f us\n",
        best.tp_group_chips, best.tp_ring_max_hops, 2 * model.layers + 1, best.allreduce_token_s * 1e6);
    std::printf("KV cache per core: %.0f bytes per token (2 x %d layers x %d K/V head(s) x %d head size x %zu bytes)\n",
                best.kv_bytes_per_token, model.layers, std::max(1, model.kv_heads / best.tp), model.head_size(),
                dtype_size(c.dtype));
    print_topology_comparison(model, topo, c, topts, best.tp);
  }
  if (!a.json.empty()) {
    nlohmann::json j = nlohmann::json::array();
    for (const InferencePlan& p : plans)
      j.push_back({{"tp", p.tp},
                   {"replicas", p.replicas},
                   {"weight_bytes", p.weight_bytes},
                   {"kv_bytes_per_token", p.kv_bytes_per_token},
                   {"kv_bytes", p.kv_bytes},
                   {"max_cached_tokens", p.max_cached_tokens},
                   {"fits", p.fits},
                   {"ttft_s", p.ttft_s},
                   {"tpot_s", p.tpot_s},
                   {"allreduce_token_s", p.allreduce_token_s},
                   {"tokens_per_s", p.tokens_per_s}});
    write_file_atomic(a.json, j.dump(2) + "\n");
  }
  return best.fits ? 0 : 1;
}

int run_plan(const PlanArgs& a) {
  if (!a.json.empty()) cli::check_output_file("--json", a.json);  // before a long search
  TopologyOptions topts;
  topts.link_bandwidth = a.link_bw_gb_s * 1e9;
  topts.link_latency = a.link_latency_us * 1e-6;
  topts.device = a.device;
  ModelConfig model = models::load_model(a.model);
  Topology topo = Topology::load(a.topology, topts);
  if (a.cores > 0) topo = topo.first_cores(a.cores);

  PlannerOptions o;
  o.train.global_batch = a.global_batch;
  o.train.seq = a.seq;
  o.train.fp32 = a.precision == "fp32";
  o.train.efficiency = a.efficiency;
  o.train.memory_fraction = a.memory_fraction;
  o.train.runtime = parse_runtime(a.runtime);
  o.train.overlap_grad_reduce = a.overlap_grad_reduce == "on";
  // Not given: on where it applies (Megatron-LM's GPT layers); the cost model refuses it elsewhere.
  o.train.overlap_tp_backward = a.overlap_tp_backward.empty()
                                    ? o.train.runtime == StepRuntime::MegatronLM && model.family != "llama"
                                    : a.overlap_tp_backward == "on";
  o.train.fp16_lm_cross_entropy = a.fp16_lm_cross_entropy;
  o.top_k = a.top;
  o.order = parse_mesh_order(a.order);
  auto given = [&](const char* flag) { return a.cmd->count(flag) > 0; };
  if (given("--tp")) o.pins.tp = a.tp;
  if (given("--pp")) o.pins.pp = a.pp;
  if (given("--dp")) o.pins.dp = a.dp;
  if (given("--mbs")) o.pins.micro_batch = a.mbs;
  if (given("--virtual-stages")) o.pins.virtual_stages = a.vstages;
  if (given("--schedule")) o.pins.schedule = pipeline::parse_schedule(a.schedule);
  if (given("--zero1")) o.pins.zero1 = a.zero1 == "on";
  if (given("--sequence-parallel")) o.pins.sequence_parallel = a.sp == "on";
  if (given("--recompute")) o.pins.recompute = parse_recompute(a.recompute);
  // --schedule pins the virtual stages: 1 for gpipe and 1f1b, > 1 (default 2) for interleaved.
  if (given("--schedule")) {
    const bool interleaved = a.schedule == "interleaved";
    TESSERA_ARG_CHECK(!given("--virtual-stages") || (a.vstages > 1) == interleaved, "--schedule ", a.schedule,
                      " with --virtual-stages ", a.vstages, ": ",
                      interleaved ? "interleaved needs --virtual-stages >= 2" : "only interleaved has virtual stages");
    TESSERA_ARG_CHECK(!given("--pp") || a.pp > 1, "--schedule ", a.schedule, " needs --pp > 1 (got --pp ", a.pp, ")");
    if (!given("--virtual-stages")) o.pins.virtual_stages = interleaved ? 2 : 1;
  }

  PlannerResult res = parallel::plan(model, topo, o);
  std::ostream& os = std::cout;
  os << "tessera plan: " << model.name << " (" << f(static_cast<double>(model.total_params()) / 1e9, 2)
     << " B parameters, " << model.layers << " layers, hidden " << model.hidden << ", " << model.heads << " heads";
  if (model.kv_heads != model.heads) os << " / " << model.kv_heads << " KV heads";
  os << ", ffn " << model.ffn_hidden << ", vocab " << model.vocab << ")\n";
  os << "topology " << topo.describe();
  os << "global batch " << o.train.global_batch << " x seq " << o.train.seq << ", "
     << (o.train.fp32 ? "fp32" : "bf16 mixed precision") << ", efficiency "
     << f(parallel::gemm_sustained_fraction(topo.device(), o.train), 2)
     << " of peak on GEMMs of ideal shape, usable memory " << gib(res.capacity_bytes) << " per core\n";
  os << "runtime " << runtime_name(o.train.runtime) << ", DP gradient reduction "
     << (o.train.overlap_grad_reduce ? "overlapped with the backward pass" : "after the backward pass");
  if (o.train.runtime == StepRuntime::MegatronLM && model.family != "llama")  // Llama layers: LlamaModel's
    os << ", TP collectives of the backward pass " << (o.train.overlap_tp_backward ? "beside" : "after")
       << " the layer's GEMMs, cross entropy on "
       << (o.train.fp16_lm_cross_entropy ? "the 16-bit logits" : "an fp32 copy of the logits");
  os << "\n";
  os << "searched " << res.evaluated << " choices in " << f(res.seconds, 3) << " s (" << res.over_memory
     << " over memory)\n\n";
  print_plan(os, topo, o, res.top[0]);
  os << "\nWhy this plan:\n";
  for (const auto& w : res.why) os << "  - " << w << "\n";
  os << "\nTop " << res.top.size() << " (memory in GiB per rank for its fullest stage, time in s per step):\n";
  os << "   #   tp   pp     dp  mbs   v    schedule zero1  sp  recompute |  weights    grads    optim      act    "
        "total GiB |"
        "  compute  tp_comm  pp_comm   bubble  dp_comm   step s\n";
  for (size_t i = 0; i < res.top.size(); ++i) {
    const auto& c = res.top[i].choice;
    const auto& k = res.top[i].cost;
    char buf[320];
    std::snprintf(
        buf, sizeof(buf),
        "%4zu %4d %4d %6d %4d %3d %11s %5s %3s %10s | %8.2f %8.2f %8.2f %8.2f %12.2f | %8.4f %8.4f %8.4f %8.4f "
        "%8.4f %8.4f%s\n",
        i + 1, c.tp, c.pp, c.dp, c.micro_batch, c.virtual_stages,
        c.pp == 1 ? "none" : pipeline::schedule_name(c.schedule), onoff(c.zero1).c_str(),
        onoff(c.sequence_parallel).c_str(), recompute_name(c.recompute), k.memory.params / kGiB, k.memory.grads / kGiB,
        k.memory.optimizer / kGiB, k.memory.activations / kGiB, k.memory.total / kGiB, k.time.compute, k.time.tp_comm,
        k.time.pp_comm, k.time.bubble, k.time.dp_comm, k.time.total, c.balanced ? "  balanced stages" : "");
    os << buf;
  }
  if (!a.json.empty()) {
    tessera::plan::Plan doc = make_plan_proto(model, topo, o, res.top[0]);
    write_plan_json(a.json, doc);
    os << "\nwrote " << a.json << "\n";
  }
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& root, tessera::launcher::cli::Action& action) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = root.add_subcommand("plan", "Plan TP x PP x DP sharding of a model over a topology");
  args->cmd = cmd;
  cmd->add_option("--model", args->model,
                  "Model preset (gpt2-124m ... llama2-70b), model JSON file, or Hugging Face directory")
      ->required();
  cmd->add_option("--topology", args->topology,
                  "Topology preset (trn1.32xlarge, trn1-cluster:N, trn2.48xlarge, trn2-cluster:N, trn2-ultraserver, "
                  "inf2.48xlarge, trn3-ultraserver[:144], torus4d:AxBxCxD, dgx-a100:N, emulated:N = the emulated "
                  "cores train_gpt runs on) or JSON file")
      ->required();
  cmd->add_option("--cores", args->cores, "Use the first N cores of the topology")->check(cli::positive(args->cores));
  // At most 2^24 sequences (about 10^4 times any published run's): the
  // micro-batch count times the virtual stages stays an int.
  cmd->add_option("--global-batch", args->global_batch, "Sequences per step (training; required without --inference)")
      ->check(cli::int_range<long long>(1, 1LL << 24));
  cmd->add_option("--seq", args->seq, "Tokens per sequence (training; required without --inference)")
      ->check(cli::positive(args->seq));
  cmd->add_flag("--inference", args->inference,
                "Plan serving instead of training: TP degree, HBM fit of weights and KV cache, time to first token "
                "and per output token (with --batch, --prompt-len, --gen-len)");
  cmd->add_option("--batch", args->batch, "--inference: sequences decoded together")
      ->check(cli::int_range<decltype(args->batch)>(1, 1 << 20));  // the prompts are listed one per sequence
  cmd->add_option("--prompt-len", args->prompt_len, "--inference: tokens per prompt")
      ->check(cli::positive(args->prompt_len));
  cmd->add_option("--gen-len", args->gen_len, "--inference: new tokens per sequence")
      ->check(cli::positive(args->gen_len));
  cmd->add_option("--tp", args->tp, "Pin tensor-parallel size")->check(cli::positive(args->tp));
  cmd->add_option("--pp", args->pp, "Pin pipeline-parallel size")->check(cli::positive(args->pp));
  cmd->add_option("--dp", args->dp, "Pin data-parallel size")->check(cli::positive(args->dp));
  cmd->add_option("--mbs", args->mbs, "Pin micro-batch size")->check(cli::positive(args->mbs));
  cmd->add_option("--virtual-stages", args->vstages, "Pin virtual stages per pipeline stage (interleaved 1F1B)")
      ->check(cli::positive(args->vstages));
  cmd->add_option("--zero1", args->zero1, "Pin ZeRO-1: on|off")->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--sequence-parallel", args->sp, "Pin sequence parallelism: on|off")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--recompute", args->recompute, "Pin recompute: none|selective|full")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  cmd->add_option("--top", args->top, "Plans to list")->capture_default_str()->check(cli::positive(args->top));
  cmd->add_option("--json", args->json, "Write the best plan as JSON (parallel/proto/plan.proto) to FILE")
      ->check(cli::not_a_flag());
  cmd->add_option("--precision", args->precision, "bf16 (mixed precision) or fp32")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "fp32"}));
  cmd->add_option("--efficiency", args->efficiency,
                  "Fraction of peak FLOP/s sustained (default: the device's, as the emulated cores charge)")
      ->check(cli::number_range(1e-6, 1.0));
  cmd->add_option("--schedule", args->schedule,
                  "Pin the pipeline schedule: gpipe|1f1b (virtual stages 1) or interleaved (virtual stages > 1)")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved"}));
  cmd->add_option("--runtime", args->runtime,
                  "Software that runs the step: tessera (its kernels and communicator, as the emulated cores charge) "
                  "or megatron-lm (unfused attention with dropout, 16-bit reductions, scatter-gather between stages, "
                  "sequence-parallel all-gathers redone in the backward pass, see --overlap-tp-backward)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tessera", "megatron-lm"}));
  cmd->add_option("--overlap-grad-reduce", args->overlap_grad_reduce,
                  "Overlap each DP gradient bucket's reduction with the backward pass: on|off (off: as the emulated "
                  "cores charge)")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--overlap-tp-backward", args->overlap_tp_backward,
                  "megatron-lm, GPT layers: run each column-parallel layer's TP collective of the backward pass "
                  "beside one of its GEMMs, as Megatron-LM does since late 2021: on|off (default on with megatron-lm)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_flag("--fp16-lm-cross-entropy", args->fp16_lm_cross_entropy,
                "megatron-lm, GPT models: the cross entropy on the 16-bit logits, as Megatron-LM's flag of that name "
                "(default: on an fp32 copy of them, as Megatron-LM does)");
  cmd->add_option("--memory-fraction", args->memory_fraction, "Fraction of HBM usable")
      ->capture_default_str()
      ->check(cli::number_range(1e-6, 1.0));
  cmd->add_option("--order", args->order, "Rank order, fastest axis first (tp-dp-pp as NxD/Megatron)")
      ->capture_default_str();
  cmd->add_option("--link-bandwidth", args->link_bw_gb_s, "torus4d: GB/s per link per direction")
      ->check(cli::number_range(1e-6, 1e6));
  cmd->add_option("--link-latency", args->link_latency_us, "torus4d: microseconds per hop")
      ->check(cli::number_range(1e-6, 1e6));
  cmd->add_option("--device", args->device, "Device of each core (trn1-core, trn2-core, a100-80gb, test-core)");
  cmd->footer(
      "Temporary files: --json is written through .NAME.tmp.<pid>.XXXXXX next to the file, renamed into place.");
  cmd->callback([&action, args] {
    // Which flags are required depends on the job (a ParseError: printed with the usage, exit 2).
    if (args->inference) {
      for (const char* f : {"--batch", "--prompt-len", "--gen-len"})
        if (args->cmd->count(f) == 0) throw CLI::RequiredError(std::string(f) + " (with --inference)");
      for (const char* f : {"--global-batch", "--seq", "--pp", "--dp", "--mbs", "--schedule", "--zero1",
                            "--virtual-stages", "--sequence-parallel", "--recompute", "--efficiency", "--order",
                            "--runtime", "--overlap-grad-reduce", "--overlap-tp-backward", "--fp16-lm-cross-entropy"})
        if (args->cmd->count(f) > 0) throw CLI::ValidationError(f, "is a training flag; not with --inference");
    } else {
      for (const char* f : {"--global-batch", "--seq"})
        if (args->cmd->count(f) == 0) throw CLI::RequiredError(f);
      for (const char* f : {"--batch", "--prompt-len", "--gen-len"})
        if (args->cmd->count(f) > 0) throw CLI::ValidationError(f, "needs --inference");
    }
    action = [args]() -> int {
      try {
        if (args->inference) return run_inference_plan(*args);
        return run_plan(*args);
      } catch (const FormatError& e) {  // a bad file is bad input: exit 2 like a bad flag
        std::cerr << "tessera plan: " << e.what() << "\n";
        return tessera::launcher::cli::kUsageExit;
      } catch (const InvalidArgument& e) {
        std::cerr << "tessera plan: " << e.what() << "\n";
        return tessera::launcher::cli::kUsageExit;
      }
    };
  });
}

}  // namespace tessera::launcher
