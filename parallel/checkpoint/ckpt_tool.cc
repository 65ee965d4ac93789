#include "parallel/checkpoint/ckpt_tool.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>

#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::parallel::checkpoint {

namespace fs = std::filesystem;
using detail::concat;

const TensorReader& Input::reader() const {
  if (ck) return *ck;
  return *whole;
}

Input open_input(const std::string& path, const ModelFamilies& f, int64_t heads_hint, bool verify) {
  Input in;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw FormatError(concat(path, ": no such file or directory"));
  if (std::optional<std::string> dir = resolve_checkpoint(path)) {
    in.ck = std::make_unique<Checkpoint>(*dir);
    in.where = in.ck->where();
    in.model = f.layout(in.ck->model_json(), in.where);
    in.ck->verify_model(*in.model);
    if (verify) in.ck->verify_all();
    return in;
  }
  try {
    in.hf = open_safetensors(path);
  } catch (const FormatError& e) {
    if (fs::is_directory(path, ec))
      throw FormatError(concat(e.what(), "; nor is ", path, " a checkpoint directory (no ", kManifestName,
                               ") or a --save directory holding a complete checkpoint"));
    throw;
  }
  in.where = in.hf->path();
  HfModel m = f.from_hf(*in.hf, heads_hint);
  in.model = std::move(m.layout);
  in.whole = std::make_unique<WholeTensors>(*in.hf, std::move(m.stored));
  return in;
}

namespace {

Layout new_layout(Layout base, const ShardOptions& o) {
  base.tp = o.tp;
  base.pp = o.pp;
  base.dp = o.dp > 0 ? o.dp : std::max(1, base.dp);  // 0: the source's own
  base.stages = o.stages;
  return base;
}

}  // namespace

uint64_t shard(const std::string& src, const std::string& out_dir, const ShardOptions& o, const ModelFamilies& f) {
  const Input in = open_input(src, f, o.heads);
  TESSERA_ARG_CHECK(o.heads == 0 || !in.ck, "--heads ", o.heads, " is for Hugging Face sources without config.json; ",
                    in.where, " records its model");
  WriteOptions w;
  w.layout = new_layout({}, o);  // weights only: no run, step 0
  w.allow_nonfinite = o.allow_nonfinite;
  return write_checkpoint(in.reader(), *in.model, out_dir, w);
}

std::string reshard(const std::string& src, const std::string& out_dir, const ShardOptions& o, const ModelFamilies& f) {
  const Input in = open_input(src, f, o.heads);
  TESSERA_ARG_CHECK(o.heads == 0 || !in.ck, "--heads ", o.heads, " is for Hugging Face sources without config.json; ",
                    in.where, " records its model");
  WriteOptions w;
  w.allow_nonfinite = o.allow_nonfinite;
  if (!in.ck) {
    w.layout = new_layout({}, o);
    write_checkpoint(in.reader(), *in.model, out_dir, w);
    return out_dir;
  }
  const Checkpoint& ck = *in.ck;
  w.layout = new_layout(ck.layout(), o);
  w.optimizer = ck.has_kind(StateKind::ExpAvg);
  w.run_id = ck.run_id();
  w.step = ck.step();
  if (!ck.has_trainer_state()) {
    write_checkpoint(ck, *in.model, out_dir, w);
    return out_dir;
  }
  const std::string state = ck.read_trainer_state();
  w.trainer_state = f.relayout_state ? f.relayout_state(state, w.layout, ck.where()) : state;
  // OUT/step_NNNNNNNN, so that `--resume OUT` and `--resume latest --save OUT` find it.
  std::error_code ec;
  TESSERA_ARG_CHECK(!out_dir.empty(), "--out is empty");
  const bool existed = fs::exists(out_dir, ec);
  TESSERA_ARG_CHECK(!existed || (fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec)), "--out ", out_dir,
                    " exists and is not an empty directory (refusing to overwrite)");
  if (!existed) {
    TESSERA_ARG_CHECK(fs::create_directory(out_dir, ec), "--out ", out_dir,
                      ": cannot create the directory: ", ec.message());
  }
  std::string step_dir = (fs::path(out_dir) / step_dir_name(ck.step())).lexically_normal().string();
  try {
    write_checkpoint(ck, *in.model, step_dir, w);
  } catch (...) {
    if (!existed) fs::remove_all(out_dir, ec);
    throw;
  }
  const fs::path abs = fs::absolute(out_dir).lexically_normal();
  fsync_directory((abs.filename().empty() ? abs.parent_path().parent_path() : abs.parent_path()).string());
  return step_dir;
}

std::vector<std::string> consolidate_path(const std::string& src, const std::string& out, uint64_t max_shard_bytes,
                                          bool with_optimizer, bool allow_nonfinite, const ModelFamilies& f) {
  const Input in = open_input(src, f);
  std::map<std::string, std::string> extra;
  if (in.ck) {
    extra["tessera_consolidated_from"] = fs::path(in.ck->dir()).filename().string();
    if (in.ck->has_trainer_state()) {
      extra["step"] = std::to_string(in.ck->step());
      extra["run_id"] = in.ck->run_id();
    }
  }
  return consolidate(in.reader(), *in.model, out, max_shard_bytes, with_optimizer, allow_nonfinite, extra);
}

uint64_t parse_shard_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit = text.substr(i);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  static const std::map<std::string, uint64_t> kUnits = {{"", 1},
                                                         {"B", 1},
                                                         {"KB", 1000},
                                                         {"MB", 1000 * 1000},
                                                         {"GB", 1000ull * 1000 * 1000},
                                                         {"TB", 1000ull * 1000 * 1000 * 1000},
                                                         {"KIB", 1ull << 10},
                                                         {"MIB", 1ull << 20},
                                                         {"GIB", 1ull << 30},
                                                         {"TIB", 1ull << 40}};
  auto u = kUnits.find(unit);
  uint64_t n = 0, bytes = 0;
  bool ok = i > 0 && i <= 15 && u != kUnits.end();
  if (ok) {
    n = std::stoull(text.substr(0, i));
    ok = n > 0 && !__builtin_mul_overflow(n, u->second, &bytes);
  }
  TESSERA_ARG_CHECK(ok, "--max-shard-size '", text,
                    "' is not a positive size (an integer with an optional unit B, KB, MB, GB, TB, KiB, MiB, GiB, "
                    "TiB; e.g. 500MB or 2GB, as save_pretrained takes)");
  return bytes;
}

}  // namespace tessera::parallel::checkpoint
