#include "parallel/plan_io.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/library_text.h"

namespace tessera::parallel {

namespace {
void set_hops(tessera::plan::HopStats* out, const HopStats& h) {
  out->set_max_hops(h.max_hops);
  out->set_mean_hops(h.mean_hops);
  out->set_one_hop_fraction(h.one_hop_fraction);
}
uint64_t u64(double bytes) { return static_cast<uint64_t>(std::round(bytes)); }

// protobuf's JSON mapping writes 64-bit integers as strings ("1024"), which
// jq and Python read as text. Turns them back into numbers, walking the
// message's descriptor so only 64-bit integer fields change (a string field
// that holds digits stays a string).
void int64_strings_to_numbers(nlohmann::ordered_json& j, const google::protobuf::Descriptor& d) {
  using google::protobuf::FieldDescriptor;
  for (int i = 0; i < d.field_count(); ++i) {
    const FieldDescriptor& f = *d.field(i);
    auto it = j.find(f.name());
    if (it == j.end()) continue;
    auto fix = [&](nlohmann::ordered_json& v) {
      if (f.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && v.is_object()) {
        int64_strings_to_numbers(v, *f.message_type());
      } else if (v.is_string() && f.cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
        v = std::stoll(v.get<std::string>());
      } else if (v.is_string() && f.cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
        v = std::stoull(v.get<std::string>());
      }
    };
    if (f.is_repeated() && it->is_array()) {
      for (auto& e : *it) fix(e);
    } else {
      fix(*it);
    }
  }
}
}  // namespace

std::optional<ModelConfig> plan_model(const tessera::plan::Plan& plan) {
  if (!plan.has_model_shape()) return std::nullopt;
  const auto& s = plan.model_shape();
  ModelConfig m;
  m.name = plan.model();
  m.family = s.family();
  m.layers = s.layers();
  m.hidden = s.hidden();
  m.heads = s.heads();
  m.kv_heads = s.kv_heads();
  m.ffn_hidden = s.ffn_hidden();
  m.vocab = s.vocab();
  m.max_seq = s.max_seq();
  m.head_dim = s.head_dim();
  if (s.norm_eps() > 0) m.norm_eps = s.norm_eps();
  if (s.rope_theta() > 0) m.rope_theta = s.rope_theta();
  if (s.has_tie_embeddings()) m.tie_embeddings = s.tie_embeddings();
  m.attention_bias = s.attention_bias();
  m.rope_scaling.type = s.rope_scaling_type();
  if (!m.rope_scaling.type.empty()) {
    m.rope_scaling.factor = s.rope_scaling_factor();
    m.rope_scaling.low_freq_factor = s.rope_scaling_low_freq_factor();
    m.rope_scaling.high_freq_factor = s.rope_scaling_high_freq_factor();
    m.rope_scaling.original_max_position_embeddings = s.rope_scaling_original_max_position_embeddings();
  }
  return m;
}

tessera::plan::Plan make_plan_proto(const ModelConfig& model, const Topology& topo, const PlannerOptions& opts,
                                    const RankedPlan& p, bool with_placement) {
  const PlanChoice& c = p.choice;
  const PlanCost& k = p.cost;
  tessera::plan::Plan out;
  out.set_model(model.name);
  auto* shape = out.mutable_model_shape();
  shape->set_family(model.family);
  shape->set_layers(model.layers);
  shape->set_hidden(model.hidden);
  shape->set_heads(model.heads);
  shape->set_kv_heads(model.kv_heads);
  shape->set_ffn_hidden(model.ffn_hidden);
  shape->set_vocab(model.vocab);
  shape->set_max_seq(model.max_seq);
  shape->set_head_dim(model.head_dim);
  shape->set_norm_eps(model.norm_eps);
  shape->set_rope_theta(model.rope_theta);
  if (model.tie_embeddings) shape->set_tie_embeddings(*model.tie_embeddings);
  shape->set_attention_bias(model.attention_bias);
  if (!model.rope_scaling.type.empty()) {
    shape->set_rope_scaling_type(model.rope_scaling.type);
    shape->set_rope_scaling_factor(model.rope_scaling.factor);
    shape->set_rope_scaling_low_freq_factor(model.rope_scaling.low_freq_factor);
    shape->set_rope_scaling_high_freq_factor(model.rope_scaling.high_freq_factor);
    shape->set_rope_scaling_original_max_position_embeddings(model.rope_scaling.original_max_position_embeddings);
  }
  out.set_device(topo.device().name);
  out.set_topology(topo.name());
  out.set_cores(topo.num_cores());
  out.set_global_batch(opts.train.global_batch);
  out.set_seq(opts.train.seq);
  out.set_precision(opts.train.fp32 ? "fp32" : "bf16");
  out.set_tp(c.tp);
  out.set_pp(c.pp);
  out.set_dp(c.dp);
  out.set_micro_batch(c.micro_batch);
  out.set_num_micro_batches(k.num_micro_batches);
  out.set_virtual_stages(c.virtual_stages);
  out.set_zero1(c.zero1);
  out.set_sequence_parallel(c.sequence_parallel);
  out.set_recompute(recompute_name(c.recompute));
  out.set_schedule(c.pp == 1                                  ? "none"
                   : c.schedule == pipeline::Schedule::kGpipe ? "gpipe"
                                                              : (c.virtual_stages > 1 ? "interleaved-1f1b" : "1f1b"));
  out.set_rank_order(mesh_order_name(opts.order));
  for (int l : c.stage_layers) out.add_stages(l);

  auto* m = out.mutable_memory_bytes_per_rank();
  m->set_params(u64(k.memory.params));
  m->set_grads(u64(k.memory.grads));
  m->set_optimizer(u64(k.memory.optimizer));
  m->set_activations(u64(k.memory.activations));
  m->set_total(u64(k.memory.total));
  out.set_memory_capacity_bytes(u64(static_cast<double>(topo.device().hbm_bytes) * opts.train.memory_fraction));
  auto* t = out.mutable_step_time_s();
  t->set_compute(k.time.compute);
  t->set_tp_comm(k.time.tp_comm);
  t->set_pp_comm(k.time.pp_comm);
  t->set_bubble(k.time.bubble);
  t->set_dp_comm(k.time.dp_comm);
  t->set_total(k.time.total);
  out.set_flops_per_step(k.flops_per_step);
  out.set_achieved_flops_per_device(k.achieved_flops_per_device);
  out.set_mfu(k.mfu);
  for (const StageBubble& b : k.stage_bubbles) out.add_stage_bubble_fraction(b.fraction());
  out.set_schedule_bubble_fraction(c.pp > 1 ? pipeline::bubble_fraction(c.pp, k.num_micro_batches, c.virtual_stages)
                                            : 0.0);

  for (const auto& d : topo.dims()) out.add_topology_dims(d.name);
  Mesh mesh({.tp = c.tp, .dp = c.dp, .pp = c.pp}, opts.order);
  Placement pl(topo, mesh);
  PlacementSummary s = summarize_placement(pl);
  set_hops(out.mutable_tp_hops(), s.tp);
  set_hops(out.mutable_pp_hops(), s.pp);
  set_hops(out.mutable_dp_hops(), s.dp);
  if (with_placement) {
    out.mutable_placement()->Reserve(mesh.world_size());
    for (int r = 0; r < mesh.world_size(); ++r) {
      auto* rp = out.add_placement();
      MeshCoord mc = mesh.coord(r);
      rp->set_rank(r);
      rp->set_tp(mc.tp);
      rp->set_dp(mc.dp);
      rp->set_pp(mc.pp);
      rp->set_node(pl.node(r));
      for (int x : pl.coords(r)) rp->add_coords(x);
    }
  }
  return out;
}

std::string plan_to_json(const tessera::plan::Plan& plan) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  // protobuf's printer builds a tree node per value when printing defaults,
  // which for 65,536 ranks takes seconds and hundreds of MB. The placement is
  // a flat list of small records, so it is printed here, one rank per line,
  // in the same proto3 JSON form (plan_from_json reads it back exactly).
  tessera::plan::Plan head;
  head.CopyFrom(plan);
  head.clear_placement();
  std::string proto_json;
  auto st = google::protobuf::util::MessageToJsonString(head, &proto_json, o);
  if (!st.ok()) throw InternalError("cannot print plan as JSON: " + st.ToString());
  // Field order kept (ordered_json); numbers as numbers.
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(proto_json);
  int64_strings_to_numbers(j, *head.GetDescriptor());
  j.erase("placement");  // printed as [] (always_print_primitive_fields); appended below
  std::string s = j.dump(1) + "\n";
  if (plan.placement_size() == 0) return s;
  size_t close = s.rfind('}');
  TESSERA_CHECK(close != std::string::npos);
  std::string p;
  p.reserve(static_cast<size_t>(plan.placement_size()) * 80);
  p += ",\n \"placement\": [";
  for (int i = 0; i < plan.placement_size(); ++i) {
    const auto& r = plan.placement(i);
    p += i ? ",\n  " : "\n  ";
    p += "{\"rank\": " + std::to_string(r.rank()) + ", \"tp\": " + std::to_string(r.tp()) +
         ", \"dp\": " + std::to_string(r.dp()) + ", \"pp\": " + std::to_string(r.pp()) +
         ", \"node\": " + std::to_string(r.node()) + ", \"coords\": [";
    for (int k = 0; k < r.coords_size(); ++k) p += (k ? ", " : "") + std::to_string(r.coords(k));
    p += "]}";
  }
  p += "\n ]\n";
  // Drop the whitespace before the closing brace, then append.
  size_t end = close;
  while (end > 0 && (s[end - 1] == '\n' || s[end - 1] == ' ')) --end;
  return s.substr(0, end) + p + "}\n";
}

namespace {

// The plan's JSON checked against the message's descriptor before protobuf
// parses it, so a mistake is said in tessera's words ("field 'tp': expected
// an integer, found string \"two\"") instead of protobuf's ("invalid value
// "two" for type TYPE_INT32", "Root element must be a message.").
void check_plan_json(const nlohmann::json& j, const google::protobuf::Descriptor& d, const std::string& where,
                     const std::function<void(const std::string&)>& bad) {
  using google::protobuf::FieldDescriptor;
  if (!j.is_object())
    bad(detail::concat(where.empty() ? "the plan" : where, ": expected a JSON object, found ", j.type_name()));
  for (auto it = j.begin(); it != j.end(); ++it) {
    const FieldDescriptor* f = d.FindFieldByName(it.key());
    for (int i = 0; !f && i < d.field_count(); ++i)
      if (d.field(i)->json_name() == it.key()) f = d.field(i);  // lowerCamelCase, as proto3 JSON allows
    const std::string name = where.empty() ? it.key() : where + "." + it.key();
    if (!f) {
      std::string allowed;
      for (int i = 0; i < d.field_count(); ++i) allowed += (i ? ", " : "") + std::string(d.field(i)->name());
      bad(detail::concat("unknown field '", name, "' (allowed: ", allowed, ")"));
    }
    if (it.value().is_null()) continue;  // proto3 JSON: the default
    auto check_one = [&](const nlohmann::json& v, const std::string& n) {
      auto expected = [&](const char* what) {
        bad(detail::concat("field '", n, "': expected ", what, ", found ", v.type_name(), " ", v.dump()));
      };
      // proto3 JSON also takes numbers as strings ("1024", "NaN"): protobuf checks those below.
      const bool digits = v.is_string() && !v.get<std::string>().empty() &&
                          v.get<std::string>().find_first_not_of("-0123456789") == std::string::npos;
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          if (!digits && (!v.is_number_integer() ||
                          (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t{INT32_MAX}
                                                  : v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)))
            expected("an integer from -2147483648 to 2147483647");
          break;
        case FieldDescriptor::CPPTYPE_UINT32:
          if (!digits && (!v.is_number_unsigned() || v.get<uint64_t>() > uint64_t{UINT32_MAX}))
            expected("an integer from 0 to 4294967295");
          break;
        case FieldDescriptor::CPPTYPE_INT64:
          if (!digits && !v.is_number_integer()) expected("an integer");
          break;
        case FieldDescriptor::CPPTYPE_UINT64:
          if (!digits && !v.is_number_unsigned()) expected("a non-negative integer");
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
        case FieldDescriptor::CPPTYPE_FLOAT:
          if (!v.is_number() && !(v.is_string() && (v == "NaN" || v == "Infinity" || v == "-Infinity" || digits)))
            expected("a number");
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          if (!v.is_boolean()) expected("true or false");
          break;
        case FieldDescriptor::CPPTYPE_STRING:
          if (!v.is_string()) expected("a string");
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          check_plan_json(v, *f->message_type(), n, bad);
          break;
        default:
          break;  // enums: none in the plan; protobuf's own check below
      }
    };
    if (f->is_repeated()) {
      if (!it.value().is_array())
        bad(detail::concat("field '", name, "': expected an array, found ", it.value().type_name()));
      for (size_t i = 0; i < it.value().size(); ++i) check_one(it.value()[i], detail::concat(name, "[", i, "]"));
    } else {
      check_one(it.value(), name);
    }
  }
}

}  // namespace

tessera::plan::Plan plan_from_json(const std::string& text, const std::string& source) {
  auto bad = [&](const std::string& what) { throw FormatError("plan file '" + source + "': " + what); };
  {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {  // syntax, or a number out of range
      bad("malformed JSON: " + json_library_text(e));
    }
    check_plan_json(j, *tessera::plan::Plan::descriptor(), "", bad);
  }
  tessera::plan::Plan p;
  google::protobuf::util::JsonParseOptions o;
  o.ignore_unknown_fields = false;
  auto st = google::protobuf::util::JsonStringToMessage(text, &p, o);
  if (!st.ok()) bad("not a valid plan: " + std::string(st.message()));
  if (p.tp() < 1 || p.pp() < 1 || p.dp() < 1) bad("tp, pp and dp must be positive");
  if (p.cores() != 0 && static_cast<long>(p.tp()) * p.pp() * p.dp() != p.cores())
    bad("tp*pp*dp = " + std::to_string(static_cast<long>(p.tp()) * p.pp() * p.dp()) +
        " is not cores = " + std::to_string(p.cores()));
  if (p.stages_size() != p.pp())
    bad("'stages' has " + std::to_string(p.stages_size()) + " entries for pp = " + std::to_string(p.pp()));
  for (int l : p.stages())
    if (l < 1) bad("every stage needs at least one layer");
  if (p.recompute() != "none" && p.recompute() != "selective" && p.recompute() != "full")
    bad("recompute must be none, selective or full, not '" + p.recompute() + "'");
  if (p.schedule() != "none" && p.schedule() != "gpipe" && p.schedule() != "1f1b" && p.schedule() != "interleaved-1f1b")
    bad("schedule must be none, gpipe, 1f1b or interleaved-1f1b, not '" + p.schedule() + "'");
  if ((p.schedule() == "none") != (p.pp() == 1))
    bad("schedule '" + p.schedule() + "' with pp = " + std::to_string(p.pp()) + " (\"none\" is for pp = 1 only)");
  if ((p.schedule() == "interleaved-1f1b") != (p.virtual_stages() > 1))
    bad("schedule '" + p.schedule() + "' with virtual_stages = " + std::to_string(p.virtual_stages()) +
        " (interleaved-1f1b and virtual_stages > 1 go together)");
  if (p.micro_batch() < 1 || p.virtual_stages() < 1) bad("micro_batch and virtual_stages must be positive");
  if (p.stage_bubble_fraction_size() != 0 && p.stage_bubble_fraction_size() != p.pp())
    bad("'stage_bubble_fraction' has " + std::to_string(p.stage_bubble_fraction_size()) +
        " entries for pp = " + std::to_string(p.pp()));
  for (double b : p.stage_bubble_fraction())
    if (!(b >= 0 && b <= 1)) bad("a stage's bubble fraction must be in [0, 1], not " + std::to_string(b));
  if (p.placement_size() != 0 && p.placement_size() != p.tp() * p.pp() * p.dp())
    bad("'placement' lists " + std::to_string(p.placement_size()) + " ranks, not tp*pp*dp");
  try {
    parse_mesh_order(p.rank_order().empty() ? "tp-dp-pp" : p.rank_order());
  } catch (const InvalidArgument& e) {
    bad(e.what());
  }
  return p;
}

Mesh plan_mesh(const tessera::plan::Plan& plan) {
  return Mesh({.tp = plan.tp(), .dp = plan.dp(), .pp = plan.pp()},
              plan.rank_order().empty() ? kDefaultMeshOrder : parse_mesh_order(plan.rank_order()));
}

void write_plan_json(const std::string& path, const tessera::plan::Plan& plan) {
  try {
    write_file_atomic(path, plan_to_json(plan));
  } catch (const IoError& e) {
    // An output that cannot even be created (no such directory, no
    // permission) is the caller's bad path: exit 2, as before.
    if (e.step() == FileStep::CheckOutput || e.step() == FileStep::OpenOutput) throw InvalidArgument(e.what());
    if (e.step() == FileStep::CreateTemp)
      throw InvalidArgument(detail::concat("cannot write plan file '", path, "': ", std::strerror(e.os_error())));
    throw;
  }
}

tessera::plan::Plan read_plan_json(const std::string& path) {
  return plan_from_json(read_input_file(path, "plan file"), path);
}

}  // namespace tessera::parallel
