#include "parallel/checkpoint/ckpt_tool.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "parallel/checkpoint/gpt2_layout.h"
#include "parallel/pipeline/partition.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::parallel::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "tessera-gpt2-tp-pp-shards";
constexpr int kVersion = 1;

// A sibling temp directory of `target`, removed on destruction unless committed.
class TempSibling {
 public:
  explicit TempSibling(const std::string& target) : target_(fs::absolute(target).lexically_normal()) {
    if (target_.filename().empty()) target_ = target_.parent_path();
    TESSERA_ARG_CHECK(!target_.filename().empty(), "bad output path '", target, "'");
    path_ = target_.parent_path() / ("." + target_.filename().string() + ".tmp-" + std::to_string(::getpid()));
    std::error_code ec;
    fs::remove_all(path_, ec);
    if (!fs::create_directories(path_, ec) && ec)
      throw Error(detail::concat(path_.string(), ": cannot create directory: ", ec.message()));
  }
  ~TempSibling() {
    if (!committed_) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  TempSibling(const TempSibling&) = delete;
  TempSibling& operator=(const TempSibling&) = delete;
  const fs::path& path() const { return path_; }
  // Renames the temp dir onto the target (which may exist only as an empty dir).
  void commit() {
    std::error_code ec;
    if (fs::exists(target_)) fs::remove(target_, ec);  // empty dir (checked by the caller)
    fs::rename(path_, target_, ec);
    if (ec) throw Error(detail::concat(target_.string(), ": cannot rename ", path_.string(), ": ", ec.message()));
    committed_ = true;
  }

 private:
  fs::path target_, path_;
  bool committed_ = false;
};

void check_out_dir(const std::string& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  TESSERA_ARG_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), "--out ", out,
                    " exists and is not an empty directory (refusing to overwrite)");
}

json shape_json(const Shape& s) { return json(std::vector<int64_t>(s.begin(), s.end())); }

json config_json(const Gpt2Config& c) {
  return {{"vocab_size", c.vocab},
          {"n_positions", c.n_positions},
          {"n_embd", c.hidden},
          {"n_layer", c.layers},
          {"n_head", c.heads}};
}

// Full-index ranges [begin, end) along split_dim held by this rank, one per
// chunk (padding excluded).
json ranges_json(const parallel::layers::Parameter& p) {
  json r = json::array();
  if (p.split_dim < 0) return r;
  const int64_t lb = p.local_block(), fb = p.full_block();
  for (int k = 0; k < p.chunks; ++k) {
    int64_t b = std::min(fb, p.tp_rank * lb), e = std::min(fb, (p.tp_rank + 1) * lb);
    r.push_back({k * fb + b, k * fb + e});
  }
  return r;
}

uint64_t shard_source(const TensorSource& src, const Gpt2Config& c, const std::string& out_dir,
                      const ShardOptions& opt) {
  TESSERA_ARG_CHECK(opt.tp >= 1 && opt.pp >= 1 && opt.dp >= 1, "--tp, --pp and --dp must be >= 1 (got tp ", opt.tp,
                    ", pp ", opt.pp, ", dp ", opt.dp, ")");
  TESSERA_ARG_CHECK(c.heads % opt.tp == 0, "--tp ", opt.tp, " does not divide the ", c.heads, " attention heads of ",
                    src.path(), " (attention is split by heads)");
  TESSERA_ARG_CHECK(c.layers >= opt.pp, "--pp ", opt.pp, " exceeds the ", c.layers, " layers of ", src.path(),
                    " (each stage needs a whole layer)");
  check_out_dir(out_dir);
  const int tp = opt.tp, pp = opt.pp;
  const std::vector<int> part = gpt2_stages(c, pp, opt.stages);
  std::vector<std::vector<parallel::layers::Parameter>> ranks;
  for (int r = 0; r < tp; ++r) ranks.push_back(gpt2_tp_parameters(c, tp, r));
  const size_t n = ranks[0].size();

  // files[pp_rank * tp + tp_rank]: the tensors of that rank, in HF order.
  std::vector<std::vector<std::pair<std::string, Tensor>>> files(static_cast<size_t>(tp) * pp);
  std::vector<json> file_tensors(files.size(), json::array());
  Tensor full;
  uint64_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = ranks[0][i].name;
    const DType dtype = src.entry(gpt2_stored_name(src, name)).dtype;
    if (!full.defined() || full.shape() != ranks[0][i].full_shape)
      full = Tensor::empty(ranks[0][i].full_shape, DType::F32);
    read_gpt2_tensor(src, name, full);
    const int stage = gpt2_pp_stage(part, name);
    for (int r = 0; r < tp; ++r) {
      parallel::layers::Parameter p = ranks[r][i];
      Tensor shard = Tensor::empty(p.shape, DType::F32);
      p.value = shard.data<float>();
      parallel::layers::load_shard(p, full.data<float>());
      if (dtype != DType::F32) shard = shard.to(dtype);
      bytes += shard.nbytes();
      const size_t f = static_cast<size_t>(stage) * tp + r;
      files[f].emplace_back(name, shard);
      file_tensors[f].push_back({{"name", name},
                                 {"dtype", dtype_name(dtype)},
                                 {"full_shape", shape_json(p.full_shape)},
                                 {"shape", shape_json(p.shape)},
                                 {"split_dim", p.split_dim},
                                 {"chunks", p.chunks},
                                 {"ranges", ranges_json(p)}});
    }
  }

  TempSibling tmp(out_dir);
  json manifest = {{"format", kFormat},
                   {"version", kVersion},
                   {"source", src.path()},
                   {"config", config_json(c)},
                   {"tp", tp},
                   {"pp", pp},
                   {"dp", opt.dp},
                   {"tied_lm_head",
                    "lm_head.weight is tied to transformer.wte.weight (vocab-parallel over tp, padded to a multiple "
                    "of tp rows; padding rows are zero); it lives on pp stage 0 only, so with pp > 1 the last stage "
                    "needs wte's shard too (NxD keeps a copy there and all-reduces its gradient)"},
                   {"dp_note", "DP replicas are identical: only dp_rank 00 files are written"}};
  json stages = json::array();
  for (int s = 0; s < pp; ++s)
    stages.push_back({{"pp_rank", s},
                      {"layers", {pipeline::stage_first_layer(part, s), pipeline::stage_first_layer(part, s + 1)}},
                      {"embeddings", s == 0},
                      {"ln_f", s == pp - 1}});
  manifest["stages"] = stages;
  json jfiles = json::array();
  for (int s = 0; s < pp; ++s) {
    for (int r = 0; r < tp; ++r) {
      const size_t f = static_cast<size_t>(s) * tp + r;
      const std::string file = rank_stem(0, r, s) + ".safetensors";
      write_safetensors((tmp.path() / file).string(), files[f],
                        {{"format", "pt"},
                         {"tp_rank", std::to_string(r)},
                         {"tp_size", std::to_string(tp)},
                         {"pp_rank", std::to_string(s)},
                         {"pp_size", std::to_string(pp)}});
      files[f].clear();  // release the memory as we go
      jfiles.push_back({{"file", file}, {"tp_rank", r}, {"pp_rank", s}, {"tensors", file_tensors[f]}});
    }
  }
  manifest["files"] = jfiles;
  write_file_atomic((tmp.path() / kManifestName).string(), manifest.dump(1) + "\n");
  tmp.commit();
  return bytes;
}

// The manifest's problem in words a person reads (nlohmann's own messages
// name its internals: "[json.exception.type_error.304] cannot use at()..."),
// or "" when the fields every reader uses are there with the right types.
std::string manifest_problem(const json& j) {
  if (!j.is_object()) return std::string("expected a JSON object, found ") + j.type_name();
  auto has = [&](const json& o, const char* key, bool (json::*is)() const noexcept) {
    return o.contains(key) && (o.at(key).*is)();
  };
  if (!has(j, "format", &json::is_string) || j.at("format").get<std::string>() != kFormat)
    return detail::concat("not a ", kFormat, " manifest (field 'format' must be \"", kFormat, "\")");
  if (!has(j, "version", &json::is_number_integer)) return "field 'version' must be an integer";
  if (j.at("version").get<int64_t>() != kVersion) return "unsupported version " + j.at("version").dump();
  if (!has(j, "config", &json::is_object)) return "field 'config' must be an object";
  for (const char* k : {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head"})
    if (!has(j.at("config"), k, &json::is_number_integer))
      return detail::concat("field 'config.", k, "' must be an integer");
  for (const char* k : {"tp", "pp"})
    if (!has(j, k, &json::is_number_integer) || j.at(k).get<int64_t>() < 1 || j.at(k).get<int64_t>() > 1 << 20)
      return detail::concat("field '", k, "' must be a positive integer");
  if (!has(j, "files", &json::is_array)) return "field 'files' must be an array";
  return "";
}

json read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  std::ifstream f(path);
  if (!f)
    throw FormatError(detail::concat(path, ": cannot open (", std::strerror(errno), "); is ", dir,
                                     " a directory written by `tessera ckpt shard`?"));
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    throw FormatError(detail::concat(path, ": not valid JSON (at byte ", e.byte, ")"));
  }
  if (std::string problem = manifest_problem(j); !problem.empty())
    throw FormatError(detail::concat(path, ": ", problem));
  return j;
}

Gpt2Config manifest_config(const json& j, const std::string& path) {
  const json& c = j.at("config");  // types checked by read_manifest
  Gpt2Config cfg{c.at("vocab_size").get<int64_t>(), c.at("n_positions").get<int64_t>(), c.at("n_embd").get<int64_t>(),
                 c.at("n_layer").get<int64_t>(), c.at("n_head").get<int64_t>()};
  if (cfg.vocab <= 0 || cfg.n_positions <= 0 || cfg.hidden <= 0 || cfg.layers <= 0 || cfg.heads <= 0 ||
      cfg.hidden % cfg.heads != 0)
    throw FormatError(detail::concat(path, ": bad config ", gpt2_config_str(cfg)));
  return cfg;
}

// The manifest's stage partition (its "stages" layer ranges; the default
// partition when absent). Throws FormatError naming the manifest when the
// ranges are not pp contiguous, non-empty runs covering every layer.
std::vector<int> manifest_stages(const json& m, const Gpt2Config& c, int pp, const std::string& path) {
  if (!m.contains("stages")) return gpt2_stages(c, pp);
  std::vector<int> part;
  int64_t next = 0;
  const json& st = m.at("stages");
  for (size_t s = 0; st.is_array() && s < st.size(); ++s) {
    const json& l = st[s].is_object() && st[s].contains("layers") ? st[s].at("layers") : json();
    if (!l.is_array() || l.size() != 2 || !l[0].is_number_integer() || !l[1].is_number_integer() ||
        l[0].get<int64_t>() != next || l[1].get<int64_t>() <= next || l[1].get<int64_t>() > c.layers)
      throw FormatError(detail::concat(path, ": stages[", s, "].layers must be [", next, ", end) with end in (", next,
                                       ", ", c.layers, "]"));
    part.push_back(static_cast<int>(l[1].get<int64_t>() - next));
    next = l[1].get<int64_t>();
  }
  if (static_cast<int>(part.size()) != pp || next != c.layers)
    throw FormatError(
        detail::concat(path, ": field 'stages' must split the ", c.layers, " layers into pp ", pp, " stages"));
  return part;
}

}  // namespace

std::string rank_stem(int dp_rank, int tp_rank, int pp_rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "dp_rank_%02d_tp_rank_%02d_pp_rank_%02d", dp_rank, tp_rank, pp_rank);
  return buf;
}

uint64_t shard_gpt2(const std::string& src_path, const std::string& out_dir, const ShardOptions& opt) {
  std::unique_ptr<TensorSource> src = open_safetensors(src_path);
  Gpt2Config c = infer_gpt2_config(*src, opt.heads);
  check_gpt2(*src, c);
  return shard_source(*src, c, out_dir, opt);
}

Gpt2Config read_manifest_config(const std::string& dir) {
  return manifest_config(read_manifest(dir), (fs::path(dir) / kManifestName).string());
}

void consolidate_gpt2(const std::string& dir, const std::string& out_file) {
  const std::string mpath = (fs::path(dir) / kManifestName).string();
  const json m = read_manifest(dir);
  const Gpt2Config c = manifest_config(m, mpath);
  const int tp = m.at("tp").get<int>(), pp = m.at("pp").get<int>();  // checked by read_manifest
  if (tp < 1 || pp < 1 || c.heads % tp != 0 || c.layers < pp)
    throw FormatError(detail::concat(mpath, ": tp ", tp, " / pp ", pp, " do not fit ", gpt2_config_str(c)));

  const std::vector<int> part = manifest_stages(m, c, pp, mpath);

  // Open every rank's file; each must hold exactly the tensors its rank holds.
  std::vector<std::vector<parallel::layers::Parameter>> ranks;
  for (int r = 0; r < tp; ++r) ranks.push_back(gpt2_tp_parameters(c, tp, r));
  std::vector<std::unique_ptr<SafetensorsReader>> readers(static_cast<size_t>(tp) * pp);
  std::vector<size_t> expected(readers.size(), 0);
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < tp; ++r)
      readers[static_cast<size_t>(s) * tp + r] =
          std::make_unique<SafetensorsReader>((fs::path(dir) / (rank_stem(0, r, s) + ".safetensors")).string());
  for (const parallel::layers::Parameter& p : ranks[0]) {
    const int s = gpt2_pp_stage(part, p.name);
    for (int r = 0; r < tp; ++r) ++expected[static_cast<size_t>(s) * tp + r];
  }
  for (size_t f = 0; f < readers.size(); ++f)
    if (readers[f]->entries().size() != expected[f])
      throw FormatError(detail::concat(readers[f]->path(), ": holds ", readers[f]->entries().size(), " tensors, ",
                                       expected[f], " expected for its rank under ", mpath));

  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < ranks[0].size(); ++i) {
    const std::string& name = ranks[0][i].name;
    const int s = gpt2_pp_stage(part, name);
    Tensor full = Tensor::empty(ranks[0][i].full_shape, DType::F32);
    DType dtype = DType::F32;
    Tensor first;
    for (int r = 0; r < tp; ++r) {
      const SafetensorsReader& rd = *readers[static_cast<size_t>(s) * tp + r];
      parallel::layers::Parameter p = ranks[r][i];
      if (!rd.contains(name)) throw FormatError(detail::concat(rd.path(), ": ", name, " missing"));
      const SafetensorsEntry& e = rd.entry(name);
      if (e.shape != p.shape)
        throw FormatError(detail::concat(rd.path(), ": ", name, " has shape ", shape_str(e.shape), ", expected ",
                                         shape_str(p.shape), " for tp rank ", r, " of ", tp));
      if (r == 0) dtype = e.dtype;
      if (e.dtype != dtype)
        throw FormatError(
            detail::concat(rd.path(), ": ", name, " is ", dtype_name(e.dtype), ", tp rank 0 has ", dtype_name(dtype)));
      Tensor shard = rd.get(name);
      if (p.split_dim < 0) {  // replicated: every rank must hold the same bytes
        if (r == 0) {
          first = shard;
        } else if (std::memcmp(first.raw_data(), shard.raw_data(), shard.nbytes()) != 0) {
          throw FormatError(detail::concat(rd.path(), ": replicated tensor ", name, " differs from tp rank 0's"));
        }
        if (r > 0) continue;
      }
      Tensor f32 = shard.to(DType::F32);
      p.value = f32.data<float>();
      parallel::layers::store_shard(p, full.data<float>());
    }
    out.emplace_back(name, dtype == DType::F32 ? full : full.to(dtype));
  }
  write_gpt2_safetensors(out_file, c, out, {{"tessera_consolidated_from", fs::path(dir).filename().string()}});
}

uint64_t reshard_gpt2(const std::string& dir, const std::string& out_dir, const ShardOptions& opt) {
  check_out_dir(out_dir);
  TempSibling tmp(out_dir + ".consolidated");
  const std::string file = (tmp.path() / "model.safetensors").string();
  consolidate_gpt2(dir, file);
  ShardOptions o = opt;
  o.heads = read_manifest_config(dir).heads;
  return shard_gpt2(file, out_dir, o);
}

}  // namespace tessera::parallel::checkpoint
