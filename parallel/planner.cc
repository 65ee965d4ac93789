#include "parallel/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "runtime/error.h"

namespace tessera::parallel {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> small, large;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d) continue;
    small.push_back(d);
    if (d != n / d) large.push_back(n / d);
  }
  small.insert(small.end(), large.rbegin(), large.rend());
  return small;
}

template <typename T>
bool pinned_out(const std::optional<T>& pin, const T& v) {
  return pin.has_value() && *pin != v;
}

std::string onoff(bool b) { return b ? "on" : "off"; }

std::string choice_text(const PlanChoice& c) {
  std::ostringstream os;
  os << "tp=" << c.tp << " pp=" << c.pp << " dp=" << c.dp << " mbs=" << c.micro_batch << " v=" << c.virtual_stages
     << (c.pp > 1 ? std::string(" schedule=") + pipeline::schedule_name(c.schedule) : std::string())
     << " zero1=" << onoff(c.zero1) << " sp=" << onoff(c.sequence_parallel)
     << " recompute=" << recompute_name(c.recompute);
  if (c.pp > 1 && c.balanced) os << " (balanced stages)";
  return os.str();
}

std::string fmt(double v, int prec = 3) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(prec);
  os << v;
  return os.str();
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

void validate_pins(const ModelConfig& m, const Topology& topo, const PlannerOptions& o) {
  const PlanPins& p = o.pins;
  const int n = topo.num_cores();
  const int64_t B = o.train.global_batch;
  if (p.tp) {
    TESSERA_ARG_CHECK(*p.tp >= 1, "--tp must be positive");
    TESSERA_ARG_CHECK(m.heads % *p.tp == 0, "--tp ", *p.tp, " does not divide the ", m.heads,
                      " attention heads of model '", m.name, "'");
    TESSERA_ARG_CHECK(m.kv_heads % *p.tp == 0 || *p.tp % m.kv_heads == 0, "--tp ", *p.tp,
                      " neither divides nor is a multiple of the ", m.kv_heads, " key/value heads of model '", m.name,
                      "' (with tp > kv_heads each K/V head is replicated onto tp / kv_heads ranks)");
    TESSERA_ARG_CHECK(m.ffn_hidden % *p.tp == 0, "--tp ", *p.tp, " does not divide the MLP size ", m.ffn_hidden,
                      " of model '", m.name, "'");
    TESSERA_ARG_CHECK(n % *p.tp == 0, "--tp ", *p.tp, " does not divide the ", n, " cores");
  }
  if (p.pp) {
    TESSERA_ARG_CHECK(*p.pp >= 1 && *p.pp <= m.layers, "--pp ", *p.pp, " must be in 1..", m.layers,
                      " (the model's layers)");
    TESSERA_ARG_CHECK(n % *p.pp == 0, "--pp ", *p.pp, " does not divide the ", n, " cores");
  }
  if (p.dp) {
    TESSERA_ARG_CHECK(*p.dp >= 1, "--dp must be positive");
    TESSERA_ARG_CHECK(n % *p.dp == 0, "--dp ", *p.dp, " does not divide the ", n, " cores");
    TESSERA_ARG_CHECK(B % *p.dp == 0, "--dp ", *p.dp, " does not divide the global batch ", B);
  }
  long prod = static_cast<long>(p.tp.value_or(1)) * p.pp.value_or(1) * p.dp.value_or(1);
  if (p.tp && p.pp && p.dp)
    TESSERA_ARG_CHECK(prod == n, "tp*pp*dp = ", *p.tp, "*", *p.pp, "*", *p.dp, " = ", prod, " is not the ", n,
                      " cores of topology '", topo.name(), "'");
  else
    TESSERA_ARG_CHECK(n % prod == 0, "the pinned sizes multiply to ", prod, ", which does not divide the ", n,
                      " cores of topology '", topo.name(), "'");
  if (p.micro_batch) {
    TESSERA_ARG_CHECK(*p.micro_batch >= 1 && B % *p.micro_batch == 0, "--mbs ", *p.micro_batch,
                      " must be positive and divide the global batch ", B);
  }
  // ZeRO-1 shards over DP and sequence parallelism over TP: with one rank there they are not there.
  if (p.zero1 && *p.zero1 && p.dp)
    TESSERA_ARG_CHECK(*p.dp > 1, "--zero1 on needs dp > 1 (it shards the optimizer state over DP), not --dp ", *p.dp);
  if (p.sequence_parallel && *p.sequence_parallel && p.tp)
    TESSERA_ARG_CHECK(*p.tp > 1, "--sequence-parallel on needs tp > 1 (it splits the sequence over TP), not --tp ",
                      *p.tp);
  if (p.schedule && p.virtual_stages)
    TESSERA_ARG_CHECK((*p.schedule == pipeline::Schedule::kInterleaved) == (*p.virtual_stages > 1), "--schedule ",
                      pipeline::schedule_name(*p.schedule), " and --virtual-stages ", *p.virtual_stages,
                      " disagree (interleaved needs virtual stages > 1, gpipe and 1f1b exactly 1)");
  if (p.virtual_stages) {
    TESSERA_ARG_CHECK(*p.virtual_stages >= 1, "--virtual-stages must be positive");
    if (*p.virtual_stages > 1 && p.pp)
      TESSERA_ARG_CHECK(*p.pp > 1 && m.layers % (*p.pp * *p.virtual_stages) == 0, "--virtual-stages ",
                        *p.virtual_stages, " needs pp > 1 and pp*v dividing the ", m.layers, " layers");
  }
}

}  // namespace

PlacementSummary summarize_placement(const Placement& pl) {
  PlacementSummary s;
  s.tp = pl.hop_stats(MeshAxis::TP);
  s.dp = pl.hop_stats(MeshAxis::DP);
  s.pp = pl.hop_stats(MeshAxis::PP);
  return s;
}

PlannerResult plan(const ModelConfig& model, const Topology& topo, const PlannerOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  model.validate();
  CostModel cm(model, topo.device(), opts.train);
  validate_pins(model, topo, opts);
  TESSERA_ARG_CHECK(opts.top_k >= 1, "--top must be positive");

  const PlanPins& pin = opts.pins;
  const int n = topo.num_cores();
  const int64_t B = opts.train.global_batch;
  const double cap = cm.memory_capacity();
  const double head = cm.head_layers();

  PlannerResult res;
  res.capacity_bytes = cap;
  std::vector<RankedPlan> fits;
  std::optional<RankedPlan> smallest;  // least memory among all, for the error message
  long meshes = 0;
  bool mbs_fits = false;              // some mesh had a --mbs that divides its share of the batch
  std::vector<int64_t> per_dp_tried;  // global batch / dp of every mesh tried

  for (int64_t tp64 : divisors(n)) {
    const int tp = static_cast<int>(tp64);
    if (pinned_out(pin.tp, tp)) continue;
    if (model.heads % tp || (model.kv_heads % tp && tp % model.kv_heads) || model.ffn_hidden % tp) continue;
    for (int64_t pp64 : divisors(n / tp)) {
      const int pp = static_cast<int>(pp64);
      if (pinned_out(pin.pp, pp) || pp > model.layers) continue;
      const int dp = n / (tp * pp);
      if (pinned_out(pin.dp, dp) || B % dp) continue;
      ++meshes;
      Placement pl(topo, Mesh({.tp = tp, .dp = dp, .pp = pp}, opts.order));
      const GroupNets nets = Topology::is_emulated(topo.name())
                                 ? emulated_group_nets(tp, pp, dp, kv_replicas_of(model, tp))
                                 : placement_group_nets(topo, pl, kv_replicas_of(model, tp));

      std::vector<std::pair<std::vector<int>, bool>> parts = {{partition_layers(model.layers, pp, false, head), false}};
      if (pp > 1) {
        auto bal = partition_layers(model.layers, pp, true, head);
        if (bal != parts[0].first) parts.push_back({bal, true});
      }
      const int64_t per_dp = B / dp;
      per_dp_tried.push_back(per_dp);
      for (int64_t mbs64 : divisors(per_dp)) {
        const int mbs = static_cast<int>(mbs64);
        if (pinned_out(pin.micro_batch, mbs)) continue;
        mbs_fits = true;
        const int m = static_cast<int>(per_dp / mbs);
        std::vector<int> vs = {1};
        if (pp > 1 && model.layers % pp == 0 && m % pp == 0)
          for (int64_t v : divisors(model.layers / pp))
            if (v > 1) vs.push_back(static_cast<int>(v));
        for (int v : vs) {
          if (pinned_out(pin.virtual_stages, v)) continue;
          using pipeline::Schedule;
          std::vector<Schedule> schedules = {Schedule::k1F1B};
          if (pp > 1 && v == 1) schedules.push_back(Schedule::kGpipe);
          if (v > 1) schedules = {Schedule::kInterleaved};
          for (const auto& [stages, balanced] : parts) {
            if (v > 1 && balanced) continue;  // interleaving needs equal chunks
            for (Schedule sched : schedules) {
              if (pp > 1 && pinned_out(pin.schedule, sched)) continue;
              for (int z = 0; z < 2; ++z) {
                const bool zero1 = z == 1;
                if (pinned_out(pin.zero1, zero1) || (zero1 && dp == 1)) continue;
                for (int sp_i = 0; sp_i < 2; ++sp_i) {
                  const bool sp = sp_i == 1;
                  if (pinned_out(pin.sequence_parallel, sp) || (sp && tp == 1)) continue;
                  for (Recompute r : {Recompute::None, Recompute::Selective, Recompute::Full}) {
                    if (pinned_out(pin.recompute, r)) continue;
                    RankedPlan rp;
                    rp.choice = PlanChoice{tp, pp, dp, mbs, v, sched, zero1, sp, r, stages, balanced};
                    rp.cost = cm.evaluate(rp.choice, nets);
                    ++res.evaluated;
                    if (!smallest || rp.cost.memory.total < smallest->cost.memory.total) smallest = rp;
                    if (rp.cost.memory.total > cap) {
                      ++res.over_memory;
                      if (!res.fastest_over_memory || rp.cost.time.total < res.fastest_over_memory->cost.time.total)
                        res.fastest_over_memory = rp;
                      continue;
                    }
                    fits.push_back(std::move(rp));
                  }
                }
              }
            }
          }
        }
      }
    }
  }

  if (meshes == 0)
    throw InvalidArgument(
        detail::concat("no tp*pp*dp = ", n, " fits the constraints: tp must divide the ", model.heads, " heads (",
                       model.kv_heads, " KV heads, MLP ", model.ffn_hidden, "), pp at most ", model.layers,
                       " layers, and dp must divide the global batch ", B, "; check the pins and --global-batch"));
  if (res.evaluated == 0 && pin.micro_batch && !mbs_fits) {
    std::string per;
    for (int64_t x : per_dp_tried) per += (per.empty() ? "" : ", ") + std::to_string(x);
    throw InvalidArgument(detail::concat("--mbs ", *pin.micro_batch,
                                         " divides no data-parallel rank's share of the global batch (global batch / "
                                         "dp = ",
                                         per, ")"));
  }
  if (res.evaluated == 0)
    throw InvalidArgument(
        "no choice satisfies the pins (interleaving needs pp*v dividing the layers and the "
        "micro-batches divisible by pp)");
  if (fits.empty())
    throw Error(detail::concat("no plan fits in ", fmt(cap / kGiB, 2), " GiB usable per core (", topo.device().name,
                               "): the smallest needs ", fmt(smallest->cost.memory.total / kGiB, 2), " GiB with ",
                               choice_text(smallest->choice), "; use more cores or fewer pins"));

  auto better = [](const RankedPlan& a, const RankedPlan& b) {
    if (a.cost.time.total != b.cost.time.total) return a.cost.time.total < b.cost.time.total;
    return a.cost.memory.total < b.cost.memory.total;
  };
  const size_t k = std::min(fits.size(), static_cast<size_t>(opts.top_k));
  std::partial_sort(fits.begin(), fits.begin() + static_cast<long>(k), fits.end(), better);
  // The best plan with a different (tp, pp) than the winner, for comparison.
  const RankedPlan& best = fits[0];
  const RankedPlan* other_mesh = nullptr;
  for (const auto& f : fits)
    if ((f.choice.tp != best.choice.tp || f.choice.pp != best.choice.pp) && (!other_mesh || better(f, *other_mesh)))
      other_mesh = &f;
  res.top.assign(fits.begin(), fits.begin() + static_cast<long>(k));

  // ---- why this plan wins ----
  const TimeBreakdown& bt = best.cost.time;
  auto pct = [&](double x) { return fmt(100.0 * x / bt.total, 1) + "%"; };
  res.why.push_back("step " + fmt(bt.total, 3) + " s: compute " + pct(bt.compute) + ", TP comm " + pct(bt.tp_comm) +
                    ", PP comm " + pct(bt.pp_comm) + ", bubble " + pct(bt.bubble) + ", DP comm " + pct(bt.dp_comm) +
                    "; MFU " + fmt(100 * best.cost.mfu, 1) + "%");
  res.why.push_back("memory " + fmt(best.cost.memory.total / kGiB, 2) + " of " + fmt(cap / kGiB, 2) +
                    " GiB usable per core; " + std::to_string(res.over_memory) + " of " +
                    std::to_string(res.evaluated) + " choices did not fit");
  if (res.fastest_over_memory && res.fastest_over_memory->cost.time.total < bt.total)
    res.why.push_back("the fastest choice overall (" + choice_text(res.fastest_over_memory->choice) + ", " +
                      fmt(res.fastest_over_memory->cost.time.total, 3) + " s) needs " +
                      fmt(res.fastest_over_memory->cost.memory.total / kGiB, 2) + " GiB");
  auto compare = [&](const RankedPlan& o, const std::string& label) {
    const TimeBreakdown& ot = o.cost.time;
    std::pair<double, const char*> d[] = {{ot.compute - bt.compute, "compute"},
                                          {ot.tp_comm - bt.tp_comm, "TP comm"},
                                          {ot.pp_comm - bt.pp_comm, "PP comm"},
                                          {ot.bubble - bt.bubble, "bubble"},
                                          {ot.dp_comm - bt.dp_comm, "DP comm"}};
    auto worst = *std::max_element(std::begin(d), std::end(d), [](auto& a, auto& b) { return a.first < b.first; });
    std::string line = label + " (" + choice_text(o.choice) + ")";
    if (ot.total - bt.total <= 1e-4 * bt.total) {
      line += " ties on step time; this plan needs " + fmt((o.cost.memory.total - best.cost.memory.total) / kGiB, 2) +
              " GiB less per core";
    } else {
      line += " is " + fmt(100.0 * (ot.total - bt.total) / bt.total, 1) + "% slower";
      if (worst.first > 0) line += std::string(", mostly ") + worst.second + " (+" + fmt(worst.first, 3) + " s)";
    }
    res.why.push_back(line);
  };
  if (fits.size() > 1) compare(fits[1], "the runner-up");
  if (other_mesh && fits.size() > 1 && other_mesh != &fits[1]) compare(*other_mesh, "the best with another tp x pp");

  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace tessera::parallel
