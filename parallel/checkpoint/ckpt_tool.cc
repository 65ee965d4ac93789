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
constexpr int kVersion = 2;  // 2: every file entry carries its bytes and sha256
constexpr uint64_t kMaxManifestBytes = 256ull << 20;

// A sibling temp directory of `target`, removed on destruction unless committed.
class TempSibling {
 public:
  explicit TempSibling(const std::string& target) : target_(fs::absolute(target).lexically_normal()) {
    if (target_.filename().empty()) target_ = target_.parent_path();  // "out/" is "out"
    TESSERA_ARG_CHECK(!target_.filename().empty(), "bad output path '", target, "'");
    const std::string prefix = "." + target_.filename().string() + ".tmp-";
    path_ = target_.parent_path() / (prefix + std::to_string(::getpid()));
    // What killed runs of this command left (their pid is dead; runtime/files.h).
    remove_stale_temps(target_.parent_path().string(), prefix);
    std::error_code ec;
    fs::remove_all(path_, ec);
    // create_directory, not create_directories: a missing parent is an
    // error, and a failed command must not leave directories behind.
    if (!fs::create_directory(path_, ec) && ec)
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
  TESSERA_ARG_CHECK(!out.empty(), "--out is empty");
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
      const std::string fpath = (tmp.path() / file).string();
      jfiles.push_back({{"file", file},
                        {"tp_rank", r},
                        {"pp_rank", s},
                        {"bytes", fs::file_size(fpath)},
                        {"sha256", sha256_file_hex(fpath)},
                        {"tensors", file_tensors[f]}});
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
  if (j.at("version").get<int64_t>() == 1)
    return "version 1 (written before shard files carried SHA-256 hashes); re-create it with `tessera ckpt shard`";
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
  std::string text;
  try {
    text = read_regular_file(path, kMaxManifestBytes);
  } catch (const FormatError& e) {
    throw FormatError(detail::concat(e.what(), "; is ", dir, " a directory written by `tessera ckpt shard`?"));
  }
  json j;
  try {
    j = json::parse(text);
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

// The shard files of a manifest, checked before any tensor is read: one
// entry per (tp, pp) rank named as rank_stem says (so no path can leave the
// directory), each a regular file of the recorded size and SHA-256. The
// config must fit in the files' real bytes (>= 2 bytes per element), so a
// manifest that lies about the sizes fails here, before anything is allocated.
// Returns the paths in pp_rank * tp + tp_rank order, and each entry's json.
struct ManifestFiles {
  std::vector<std::string> paths;
  std::vector<const json*> entries;
};

ManifestFiles check_manifest_files(const json& m, const Gpt2Config& c, const std::string& dir,
                                   const std::string& mpath) {
  const int tp = m.at("tp").get<int>(), pp = m.at("pp").get<int>();
  auto bad = [&](const std::string& what) { throw FormatError(detail::concat(mpath, ": ", what)); };
  if (c.heads % tp != 0 || c.layers < pp)
    bad(detail::concat("tp ", tp, " / pp ", pp, " do not fit ", gpt2_config_str(c)));
  const json& files = m.at("files");
  const size_t n = static_cast<size_t>(tp) * pp;
  if (files.size() != n) bad(detail::concat("'files' lists ", files.size(), " files, tp ", tp, " x pp ", pp, " = ", n));
  ManifestFiles out;
  out.paths.resize(n);
  out.entries.resize(n, nullptr);
  std::vector<uint64_t> sizes(n);
  long double total = 0;
  for (size_t k = 0; k < n; ++k) {
    const json& e = files[k];
    auto field = [&](const char* key, bool (json::*is)() const noexcept) -> const json& {
      if (!e.is_object() || !e.contains(key) || !(e.at(key).*is)())
        bad(detail::concat("files[", k, "].", key, " is missing or has the wrong type"));
      return e.at(key);
    };
    const int64_t r = field("tp_rank", &json::is_number_integer).get<int64_t>();
    const int64_t s = field("pp_rank", &json::is_number_integer).get<int64_t>();
    if (r < 0 || r >= tp || s < 0 || s >= pp)
      bad(detail::concat("files[", k, "]: tp_rank ", r, " / pp_rank ", s, " outside tp ", tp, " / pp ", pp));
    const std::string want = rank_stem(0, static_cast<int>(r), static_cast<int>(s)) + ".safetensors";
    const std::string file = field("file", &json::is_string).get<std::string>();
    if (file != want)
      bad(detail::concat("files[", k, "].file is '", file, "'; the file of tp_rank ", r, " pp_rank ", s, " is '", want,
                         "' (file names may not name other paths)"));
    const size_t slot = static_cast<size_t>(s) * tp + static_cast<size_t>(r);
    if (out.entries[slot]) bad(detail::concat("files[", k, "]: '", file, "' is listed twice"));
    const std::string hash = field("sha256", &json::is_string).get<std::string>();
    if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos)
      bad(detail::concat("files[", k, "].sha256 is not 64 lowercase hex digits"));
    const uint64_t bytes = field("bytes", &json::is_number_unsigned).get<uint64_t>();
    const std::string path = (fs::path(dir) / file).string();
    uint64_t real = 0;
    ::close(open_regular_file(path, &real));  // refuses FIFOs and devices without blocking
    if (real != bytes)
      throw FormatError(detail::concat(path, ": ", real, " bytes, but ", mpath, " records ", bytes,
                                       real < bytes ? " (truncated)" : " (damaged or replaced)"));
    out.entries[slot] = &e;
    out.paths[slot] = path;
    sizes[slot] = real;
    total += static_cast<long double>(real);
  }
  // Elements the config implies; every stored element takes at least 2 bytes.
  const long double C = static_cast<long double>(c.hidden);
  const long double elems = static_cast<long double>(c.vocab) * C + static_cast<long double>(c.n_positions) * C +
                            static_cast<long double>(c.layers) * (12 * C * C + 13 * C) + 2 * C;
  if (2 * elems > total)
    bad(detail::concat("config ", gpt2_config_str(c), " needs at least ", static_cast<double>(2 * elems),
                       " bytes of tensor data, but the shard files hold ", static_cast<double>(total),
                       " bytes (config.n_layer, vocab_size, n_embd or n_positions is wrong)"));
  // Hashes last (they read every byte): a flipped byte, or two ranks' files swapped.
  for (size_t k = 0; k < n; ++k) {
    const std::string want = out.entries[k]->at("sha256").get<std::string>();
    const std::string got = sha256_file_hex(out.paths[k]);
    if (got != want)
      throw FormatError(detail::concat(out.paths[k], ": SHA-256 ", got, " differs from ", want, " recorded in ", mpath,
                                       " (the file is damaged, or is another rank's or another checkpoint's file)"));
  }
  return out;
}

// The manifest's entry for `p` in its file's "tensors" must say what the
// layout says: name, dtype (the file's), shapes, split dim, chunks, ranges.
void check_manifest_tensor(const json& file_entry, size_t idx, const parallel::layers::Parameter& p,
                           const SafetensorsEntry& e, const std::string& mpath) {
  const std::string where =
      detail::concat(mpath, ": ", file_entry.at("file").get<std::string>(), " tensor '", p.name, "'");
  if (!file_entry.contains("tensors") || !file_entry.at("tensors").is_array() || file_entry.at("tensors").size() <= idx)
    throw FormatError(detail::concat(where, ": not listed in the file's 'tensors'"));
  const json& t = file_entry.at("tensors")[idx];
  const json want = {{"name", p.name},
                     {"dtype", dtype_name(e.dtype)},
                     {"full_shape", shape_json(p.full_shape)},
                     {"shape", shape_json(p.shape)},
                     {"split_dim", p.split_dim},
                     {"chunks", p.chunks},
                     {"ranges", ranges_json(p)}};
  for (auto it = want.begin(); it != want.end(); ++it) {
    if (!t.is_object() || !t.contains(it.key()) || t.at(it.key()) != it.value())
      throw FormatError(detail::concat(where, ": '", it.key(), "' is ",
                                       t.is_object() && t.contains(it.key()) ? t.at(it.key()).dump() : "missing",
                                       ", the layout and the file say ", it.value().dump()));
  }
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
  if (!opt.allow_nonfinite) check_finite(*src);
  return shard_source(*src, c, out_dir, opt);
}

Gpt2Config read_manifest_config(const std::string& dir) {
  return manifest_config(read_manifest(dir), (fs::path(dir) / kManifestName).string());
}

Gpt2Config verify_shard_dir(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / kManifestName).string();
  const json m = read_manifest(dir);
  const Gpt2Config c = manifest_config(m, mpath);
  check_manifest_files(m, c, dir, mpath);
  return c;
}

void consolidate_gpt2(const std::string& dir, const std::string& out_file, bool allow_nonfinite) {
  std::error_code ec;
  TESSERA_ARG_CHECK(!fs::exists(out_file, ec) && !fs::is_symlink(out_file, ec), "--out ", out_file,
                    " exists (refusing to overwrite)");
  const std::string mpath = (fs::path(dir) / kManifestName).string();
  const json m = read_manifest(dir);
  const Gpt2Config c = manifest_config(m, mpath);
  const int tp = m.at("tp").get<int>(), pp = m.at("pp").get<int>();  // checked by read_manifest
  const ManifestFiles mf = check_manifest_files(m, c, dir, mpath);

  const std::vector<int> part = manifest_stages(m, c, pp, mpath);

  // Open every rank's file; each must hold exactly the tensors its rank holds.
  std::vector<std::vector<parallel::layers::Parameter>> ranks;
  for (int r = 0; r < tp; ++r) ranks.push_back(gpt2_tp_parameters(c, tp, r));
  std::vector<std::unique_ptr<SafetensorsReader>> readers(static_cast<size_t>(tp) * pp);
  std::vector<size_t> expected(readers.size(), 0);
  for (int s = 0; s < pp; ++s)
    for (int r = 0; r < tp; ++r)
      readers[static_cast<size_t>(s) * tp + r] =
          std::make_unique<SafetensorsReader>(mf.paths[static_cast<size_t>(s) * tp + r]);
  for (const parallel::layers::Parameter& p : ranks[0]) {
    const int s = gpt2_pp_stage(part, p.name);
    for (int r = 0; r < tp; ++r) ++expected[static_cast<size_t>(s) * tp + r];
  }
  for (size_t f = 0; f < readers.size(); ++f)
    if (readers[f]->entries().size() != expected[f])
      throw FormatError(detail::concat(readers[f]->path(), ": holds ", readers[f]->entries().size(), " tensors, ",
                                       expected[f], " expected for its rank under ", mpath));
  for (size_t f = 0; f < readers.size(); ++f)
    if (!allow_nonfinite) check_finite(*readers[f]);
  std::vector<size_t> in_file(readers.size(), 0);  // index of the next tensor in each file's manifest entry

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
      const size_t f = static_cast<size_t>(s) * tp + r;
      check_manifest_tensor(*mf.entries[f], in_file[f]++, p, e, mpath);
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
  // "out/" and "out" alike: the temp file goes beside out, never inside it.
  fs::path target = fs::absolute(out_dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();
  TempSibling tmp(target.string() + ".consolidated");
  const std::string file = (tmp.path() / "model.safetensors").string();
  consolidate_gpt2(dir, file, opt.allow_nonfinite);
  ShardOptions o = opt;
  o.heads = read_manifest_config(dir).heads;
  return shard_gpt2(file, out_dir, o);
}

}  // namespace tessera::parallel::checkpoint
