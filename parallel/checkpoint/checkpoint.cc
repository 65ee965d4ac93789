#include "parallel/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "parallel/checkpoint/background_writer.h"
#include "parallel/checkpoint/safetensors.h"
#include "parallel/pipeline/partition.h"
#include "runtime/error.h"
#include "runtime/files.h"
#include "runtime/library_text.h"

namespace tessera::parallel::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::concat;
using parallel::layers::Parameter;

namespace {

// The largest tp, dp or pp a checkpoint may have (written or read).
constexpr int kMaxDegree = 1 << 20;

constexpr int kMaxChunks = 64;
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;
constexpr int64_t kPieceBytes = int64_t{8} << 20;    // one read of the offline writer and of consolidate
constexpr size_t kOutBufferBytes = size_t{2} << 20;  // one O_DIRECT write each

// Runs of the TP shard `p` inside its flat range [b, e): fn(local, full, n),
// full = -1 for padding; ascending in both local and full index. Visits only
// the outer indices the range touches.
template <class Fn>
void shard_runs_in(const Parameter& p, int64_t b, int64_t e, Fn&& fn) {
  if (b >= e) return;
  if (p.split_dim < 0) {
    fn(b, b, e - b);
    return;
  }
  int64_t inner = 1;
  for (size_t d = p.split_dim + 1; d < p.shape.size(); ++d) inner *= p.shape[d];
  const int64_t local_dim = p.shape[p.split_dim], full_dim = p.full_shape[p.split_dim];
  const int64_t lb = p.local_block(), fb = p.full_block();
  const int64_t first = p.tp_part() * lb;
  const int64_t valid = std::clamp<int64_t>(fb - first, 0, lb);
  const int64_t row = local_dim * inner;
  auto emit = [&](int64_t local, int64_t full, int64_t n) {
    const int64_t s = std::max(local, b), t = std::min(local + n, e);
    if (s < t) fn(s, full < 0 ? -1 : full + (s - local), t - s);
  };
  for (int64_t o = b / row; o * row < e; ++o) {
    for (int k = 0; k < p.chunks; ++k) {
      const int64_t local = (o * local_dim + k * lb) * inner;
      if (valid > 0) emit(local, (o * full_dim + k * fb + first) * inner, valid * inner);
      if (valid < lb) emit(local + valid * inner, -1, (lb - valid) * inner);
    }
  }
}

// Files inside a temp directory: atomic and fsynced, the directory fsynced
// once by commit_directory (not once per file).
void write_in_temp_dir(const std::string& path, std::string_view bytes, FileOps* ops = nullptr) {
  AtomicWriteOptions o;
  o.sync = false;
  o.ops = ops;
  write_file_atomic(path, bytes, o);
  fsync_path(path, ops);
}

// Every rank's string, in rank order (alone: just ours).
std::vector<std::string> all_gather_strings(collectives::Communicator* world, const std::string& mine) {
  if (world == nullptr || world->size() == 1) return {mine};
  const int n = world->size();
  int64_t len = static_cast<int64_t>(mine.size());
  std::vector<int64_t> lens(static_cast<size_t>(n));
  world->all_gather(&len, lens.data(), 1, DType::I64);
  int64_t max = 4;
  for (int64_t l : lens) max = std::max(max, l);
  max = (max + 3) / 4 * 4;
  std::vector<char> send(static_cast<size_t>(max), 0), recv(static_cast<size_t>(max) * n);
  std::memcpy(send.data(), mine.data(), mine.size());
  world->all_gather(send.data(), recv.data(), static_cast<size_t>(max / 4), DType::I32);
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) out.emplace_back(recv.data() + static_cast<size_t>(r) * max, lens[r]);
  return out;
}

// Every rank learns whether any rank failed; all throw the first failing rank's message.
void agree(collectives::Communicator* world, const std::string& error, bool format_error) {
  std::vector<std::string> all = all_gather_strings(world, error);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    std::string msg = all.size() > 1 && all[r] != error ? concat(all[r], " (reported by rank ", r, ")") : all[r];
    if (format_error) throw FormatError(msg);
    throw Error(msg);
  }
}

bool parse_step_dir(const std::string& name, int64_t* step) {
  if (name.size() < 13 || name.compare(0, 5, "step_") != 0) return false;
  int64_t s = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || s > (int64_t{1} << 58)) return false;
    s = s * 10 + (name[i] - '0');
  }
  *step = s;
  return true;
}

json parse_json(const std::string& text, const std::string& path, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // syntax, or a number out of range (out_of_range.406)
    throw FormatError(concat(where, ": ", path, " is not valid JSON: ", json_library_text(e)));
  }
}

int64_t checked_numel(const Shape& s, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) throw FormatError(concat(what, ": negative dimension in ", shape_str(s)));
    if (d != 0 && n > (int64_t{1} << 50) / d)
      throw FormatError(concat(what, ": shape ", shape_str(s), " is too large"));
    n *= d;
  }
  return n;
}

Parameter descriptor(const std::string& name, const Shape& full, int split_dim, int chunks, int tp, int tp_rank,
                     int tp_parts) {
  return parallel::layers::make_parameter(name, full, split_dim, chunks, tp, tp_rank, parallel::layers::Init::Zeros,
                                          0.f, false, split_dim < 0 ? 0 : tp_parts);
}

// The whole tensor, unsharded (consolidate's and a full read's descriptor).
Parameter whole(const std::string& name, const Shape& full) { return descriptor(name, full, -1, 1, 1, 0, 1); }

bool float_dtype(DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; }

std::string model_sha(const std::string& model_json) { return sha256_hex(model_json); }

// One piece a rank file holds: elements [begin, end) of the TP shard `p` of `kind`, in `dtype`.
struct PieceOut {
  const Parameter* p;
  StateKind kind;
  int64_t begin, end;
  DType dtype;
  uint64_t bytes() const { return static_cast<uint64_t>(end - begin) * dtype_size(dtype); }
};

struct FileMeta {
  std::string run_id;
  int64_t step = 0;
  int world_rank = 0;
  std::string model_json;
};

// The safetensors header of one rank file and its manifest entry (without
// bytes and sha256): 1-D tensors "<kind>/<name>", metadata run id, step,
// rank and the model's SHA-256.
std::pair<std::string, json> rank_file_header(const std::string& name, const FileMeta& fm,
                                              const std::vector<PieceOut>& outs) {
  json header = json::object();
  header["__metadata__"] = {{"format", kFormat},
                            {"run_id", fm.run_id},
                            {"step", std::to_string(fm.step)},
                            {"rank", std::to_string(fm.world_rank)},
                            {"model_sha256", model_sha(fm.model_json)}};
  json pieces = json::array();
  uint64_t off = 0;
  for (const PieceOut& o : outs) {
    const Parameter& p = *o.p;
    const std::string key = concat(state_kind_name(o.kind), "/", p.name);
    header[key] = {{"dtype", dtype_safetensors_name(o.dtype)},
                   {"shape", {o.end - o.begin}},
                   {"data_offsets", {off, off + o.bytes()}}};
    off += o.bytes();
    const bool split = p.split_dim >= 0;
    pieces.push_back({{"tensor", p.name},
                      {"shape", p.full_shape},
                      {"dtype", dtype_safetensors_name(o.dtype)},
                      {"layer", p.layer},
                      {"kind", state_kind_name(o.kind)},
                      {"key", key},
                      {"split_dim", p.split_dim},
                      {"chunks", p.chunks},
                      {"tp", split ? p.tp_size : 1},
                      {"tp_rank", split ? p.tp_rank : 0},
                      {"tp_parts", split ? p.tp_parts : 1},
                      {"shard_shape", p.shape},
                      {"range", {o.begin, o.end}}});
  }
  std::string htext = header.dump();
  while ((8 + htext.size()) % 8 != 0) htext += ' ';
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(static_cast<uint64_t>(htext.size()) >> (8 * i));
  bytes += htext;
  return {bytes, {{"rank", fm.world_rank}, {"name", name}, {"pieces", pieces}}};
}

// Writes one rank's file `name` into the temp checkpoint directory `tmp`:
// the header, then each piece's bytes through `fill(i, sink)`, which must
// write exactly outs[i].bytes(). Hashes as it writes; one fsync of the
// file. Returns the manifest's file entry (rank, name, bytes, sha256,
// pieces with their tensor's full shape under "shape"). `in_memory`
// (optional): piece i's bytes are at in_memory[i] and stay unchanged until
// the call returns; they are then hashed on a second thread while `fill`
// writes them.
json write_rank_file(const std::string& tmp, const std::string& name, const FileMeta& fm,
                     const std::vector<PieceOut>& outs, const std::function<void(size_t, FileSink&)>& fill,
                     const std::vector<const void*>* in_memory = nullptr, FileOps* ops = nullptr) {
  // Not a structured binding: clang does not let lambdas capture those.
  std::pair<std::string, json> hdr = rank_file_header(name, fm, outs);
  const std::string& head = hdr.first;
  json& entry = hdr.second;
  std::string sha;
  uint64_t total = 0;
  AtomicWriteOptions wo;
  wo.sync = false;
  wo.ops = ops;
  wo.direct = true;  // past the page cache: filling new page-cache pages is what writing costs most here
  std::thread hasher;
  std::exception_ptr hash_error;
  if (in_memory) {
    hasher = std::thread([&, h = &head] {
      try {
        Sha256 s;
        s.update(h->data(), h->size());
        for (size_t i = 0; i < outs.size(); ++i) s.update((*in_memory)[i], outs[i].bytes());
        sha = s.hex_digest();
      } catch (...) {
        hash_error = std::current_exception();
      }
    });
  } else {
    wo.sha256_hex = &sha;
  }
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{hasher};
  const std::string path = (fs::path(tmp) / name).string();
  write_file_atomic(
      path,
      [&](FileSink& sink) {
        sink.write(head.data(), head.size());
        for (size_t i = 0; i < outs.size(); ++i) {
          const uint64_t before = sink.bytes_written();
          fill(i, sink);
          TESSERA_CHECK(sink.bytes_written() - before == outs[i].bytes(), "piece ", i, " of ", path,
                        " has the wrong size");
        }
        total = sink.bytes_written();
      },
      wo);
  if (hasher.joinable()) hasher.join();
  if (hash_error) std::rethrow_exception(hash_error);
  fsync_path(path, ops);
  entry["bytes"] = total;
  entry["sha256"] = sha;
  return entry;
}

// The manifest of a checkpoint whose rank files' entries are `files`
// (write_rank_file's), with the trainer state (when not empty) written
// beside it in `tmp`, each fsynced; returns the manifest's text (its
// SHA-256 goes into the done marker) and adds the bytes to *bytes.
std::string write_state_and_manifest(const std::string& tmp, const FileMeta& fm, const Layout& L,
                                     const std::string& trainer_state, std::vector<json> files, uint64_t* bytes,
                                     FileOps* ops = nullptr) {
  json tensors = json::object(), jfiles = json::array();
  for (json& j : files) {
    for (json& pc : j["pieces"]) {
      const std::string t = pc["tensor"];
      json& info = tensors[t];
      if (info.is_null()) info = {{"shape", pc["shape"]}, {"layer", pc["layer"]}};
      TESSERA_CHECK(info["shape"] == pc["shape"], "ranks disagree on the shape of ", t);
      // The tensor's dtype is its parameter's; the optimizer's kinds are F32.
      if (pc["kind"] != state_kind_name(StateKind::Param)) {
        TESSERA_CHECK(pc["dtype"] == dtype_safetensors_name(DType::F32), "optimizer state of ", t, " is not F32");
      } else {
        if (!info.contains("dtype")) info["dtype"] = pc["dtype"];
        TESSERA_CHECK(info["dtype"] == pc["dtype"], "ranks disagree on the dtype of ", t);
      }
      pc.erase("shape");
      pc.erase("dtype");
      pc.erase("layer");
    }
    jfiles.push_back(j);
  }
  for (const auto& [t, info] : tensors.items())
    TESSERA_CHECK(info.contains("dtype"), "tensor ", t, " has optimizer state but no parameter piece");
  json manifest = {{"format", kFormat},
                   {"version", kVersion},
                   {"run_id", fm.run_id},
                   {"step", fm.step},
                   {"layout",
                    {{"tp", L.tp},
                     {"dp", L.dp},
                     {"pp", L.pp},
                     {"stages", L.stages},
                     {"zero1", L.zero1},
                     {"sequence_parallel", L.sequence_parallel}}},
                   {"model", json::parse(fm.model_json)},
                   {"tensors", tensors},
                   {"files", jfiles}};
  if (!trainer_state.empty()) {
    write_in_temp_dir((fs::path(tmp) / kTrainerStateName).string(), trainer_state, ops);
    *bytes += trainer_state.size();
    manifest["trainer_state"] = {
        {"name", kTrainerStateName}, {"bytes", trainer_state.size()}, {"sha256", sha256_hex(trainer_state)}};
  }
  std::string mtext = manifest.dump(1);
  write_in_temp_dir((fs::path(tmp) / kManifestName).string(), mtext, ops);
  *bytes += mtext.size();
  return mtext;
}

void write_marker(const std::string& dir, const std::string& mtext, int64_t step, FileOps* ops = nullptr) {
  const json marker = {{"manifest_sha256", sha256_hex(mtext)}, {"step", step}};
  AtomicWriteOptions o;
  o.ops = ops;
  write_file_atomic((fs::path(dir) / kDoneMarkerName).string(), marker.dump() + "\n", o);
}

bool has_marker(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::symlink_status(fs::path(dir) / kDoneMarkerName, ec));
}

// A save that failed after its commit (the marker could not be written:
// ENOSPC) or during it: the step directory without a marker can never be
// loaded, and on a full disk it holds the space the next save needs, so it
// goes; a complete checkpoint of the same step that the commit moved to
// `aside` goes back. A step directory with its marker is complete and stays.
// Best effort: the save's own error is what the caller reports.
void undo_failed_commit(const std::string& final_dir, const std::string& aside, const std::string& root, FileOps* ops) {
  std::error_code ec;
  if (has_marker(final_dir)) return;
  if (fs::exists(fs::symlink_status(final_dir, ec))) fs::remove_all(final_dir, ec);
  if (has_marker(aside)) {
    try {
      CommitOptions co;
      co.ops = ops;
      co.files_synced = true;
      commit_directory(aside, final_dir, co);
    } catch (const std::exception&) {
      // Left at `aside`: the next save of this step moves it again; the error raised is the save's.
    }
  }
  try {
    fsync_directory(root, ops);
  } catch (const std::exception&) {
  }
}

void remove_checkpoint_dir(const std::string& dir, const std::string& root, int world_rank, int64_t step) {
  // The marker first: a half-removed checkpoint is never taken for a complete one.
  std::error_code ec;
  fs::remove(fs::path(dir) / kDoneMarkerName, ec);
  fsync_directory(dir);
  fault_point("mid_keep", world_rank, step);
  fs::remove_all(dir, ec);
  fsync_directory(root);
}

// The canonical text of a model description (sorted keys, compact), so
// the manifest's and the files' hashes compare.
std::string canonical_model(const std::string& model_json, const std::string& where) {
  json j = parse_json(model_json, "the model description", where);
  if (!j.is_object()) throw FormatError(concat(where, ": the model description must be a JSON object"));
  return j.dump();
}

}  // namespace

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::Param:
      return "param";
    case StateKind::ExpAvg:
      return "exp_avg";
    case StateKind::ExpAvgSq:
      return "exp_avg_sq";
    case StateKind::Master:
      return "master";
  }
  return "?";
}

std::vector<StateKind> TensorReader::optimizer_kinds() const {
  std::vector<StateKind> kinds = {StateKind::ExpAvg, StateKind::ExpAvgSq};
  if (has_kind(StateKind::Master)) kinds.push_back(StateKind::Master);
  return kinds;
}

std::string step_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file_name(int dp_rank, int tp_rank, int pp_rank) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "dp_rank_%02d_tp_rank_%02d_pp_rank_%02d.safetensors", dp_rank, tp_rank, pp_rank);
  return buf;
}

int stage_of(const Parameter& p, const std::vector<int>& stages) {
  if (p.layer >= 0) return pipeline::stage_of_layer(stages, p.layer);
  return p.layer == parallel::layers::kHeadLayer ? static_cast<int>(stages.size()) - 1 : 0;
}

void fault_point(const char* point, int world_rank, int64_t step) {
  const char* want = std::getenv("TESSERA_CKPT_FAULT");
  if (want == nullptr || std::strcmp(want, point) != 0) return;
  const char* r = std::getenv("TESSERA_CKPT_FAULT_RANK");
  if ((r ? std::atoi(r) : 0) != world_rank) return;
  const char* s = std::getenv("TESSERA_CKPT_FAULT_STEP");
  if (s && std::atoll(s) != step) return;
  std::fprintf(stderr, "tessera: TESSERA_CKPT_FAULT=%s: rank %d kills itself at step %lld\n", point, world_rank,
               static_cast<long long>(step));
  std::fflush(stderr);
  ::raise(SIGKILL);
}

// ---- save ---------------------------------------------------------------------

SaveResult save_checkpoint(collectives::Communicator* world, const std::vector<HeldTensor>& held,
                           const SaveSpec& spec) {
  const Layout& L = spec.layout;
  const bool lead = spec.world_rank == 0;
  const std::string root = fs::path(spec.root).lexically_normal().string();
  const std::string name = step_dir_name(spec.step);
  const std::string tmp = (fs::path(root) / ("." + name + ".tmp")).string();
  const std::string final_dir = (fs::path(root) / name).string();
  SaveResult result;
  result.dir = final_dir;
  const FileMeta fm{spec.run_id, spec.step, spec.world_rank, canonical_model(spec.model_json, "save")};

  // 1. A fresh temp directory (rank 0), then everyone may write into it.
  std::string err;
  if (lead) {
    try {
      fs::create_directories(root);
      fs::remove_all(tmp);
      fs::create_directory(tmp);
    } catch (const std::exception& e) {
      err = concat("checkpoint ", final_dir, ": cannot create ", tmp, ": ", e.what());
    }
  }
  agree(world, err, false);

  // 2. This rank's pieces: under ZeRO-1 its slice, under plain DP the
  // dp_rank-th part of its shard; replica 0 of a shard only.
  std::vector<PieceOut> outs;
  std::vector<const void*> data;
  std::vector<std::vector<uint8_t>> packed;  // 16-bit parameters, converted from their fp32 containers
  const bool zero = L.zero1 && L.dp > 1;
  for (const HeldTensor& h : held) {
    const Parameter& p = *h.param;
    if (!h.save || p.tp_replica() != 0) continue;
    const int64_t n = p.numel();
    int64_t b = zero ? h.moment_begin : n * spec.dp_rank / L.dp;
    int64_t e = zero ? h.moment_end : n * (spec.dp_rank + 1) / L.dp;
    if (b >= e) continue;
    TESSERA_CHECK(b >= h.moment_begin && e <= h.moment_end && h.m && h.v, "moments of ", p.name, " [", b, ", ", e,
                  ") not held by this rank");
    TESSERA_CHECK(float_dtype(h.dtype), "parameter ", p.name, " stored as ", dtype_name(h.dtype));
    outs.push_back({&p, StateKind::Param, b, e, h.dtype});
    if (h.dtype == DType::F32) {
      data.push_back(p.value + b);
    } else {
      packed.emplace_back(outs.back().bytes());
      convert(p.value + b, DType::F32, packed.back().data(), h.dtype, static_cast<size_t>(e - b));
      data.push_back(packed.back().data());
    }
    outs.push_back({&p, StateKind::ExpAvg, b, e, DType::F32});
    data.push_back(h.m + (b - h.moment_begin));
    outs.push_back({&p, StateKind::ExpAvgSq, b, e, DType::F32});
    data.push_back(h.v + (b - h.moment_begin));
    if (h.master) {
      outs.push_back({&p, StateKind::Master, b, e, DType::F32});
      data.push_back(h.master + (b - h.moment_begin));
    }
  }

  json entry = {{"rank", spec.world_rank}};
  try {
    const std::string fname = rank_file_name(spec.dp_rank, spec.tp_rank, spec.pp_rank);
    entry = write_rank_file(
        tmp, fname, fm, outs,
        [&](size_t i, FileSink& sink) {
          if (i == outs.size() / 2) fault_point("mid_file", spec.world_rank, spec.step);
          sink.write(data[i], outs[i].bytes());
        },
        &data, spec.ops);
  } catch (const std::exception& e) {
    entry["error"] =
        concat("checkpoint ", final_dir, ": rank ", spec.world_rank, " could not write its file: ", e.what());
  }
  fault_point("file_written", spec.world_rank, spec.step);

  // 3. Every rank's entry to everyone (the barrier: all files are fsynced).
  std::vector<std::string> entries = all_gather_strings(world, entry.dump());
  std::string first_error;
  std::vector<json> parsed;
  for (const std::string& s : entries) {
    json j = json::parse(s);
    if (j.contains("error") && first_error.empty()) first_error = j["error"].get<std::string>();
    parsed.push_back(std::move(j));
  }
  for (const json& j : parsed)
    if (j.contains("bytes")) result.bytes += j["bytes"].get<uint64_t>();

  // 4. Rank 0: trainer state, manifest, commit, marker, --keep.
  err = first_error;
  if (lead && err.empty()) {
    const std::string old = (fs::path(root) / ("." + name + ".old")).string();
    bool committing = false;
    try {
      std::vector<json> files;
      for (json& j : parsed)
        if (j.contains("name")) files.push_back(j);
      const std::string mtext =
          write_state_and_manifest(tmp, fm, L, spec.trainer_state, files, &result.bytes, spec.ops);
      fault_point("before_rename", spec.world_rank, spec.step);
      CommitOptions co;
      co.ops = spec.ops;
      co.files_synced = true;
      co.aside = old;  // a checkpoint of the same step being replaced
      committing = true;
      commit_directory(tmp, final_dir, co);
      fault_point("before_marker", spec.world_rank, spec.step);
      write_marker(final_dir, mtext, spec.step, spec.ops);
      committing = false;
      fault_point("before_keep", spec.world_rank, spec.step);
      std::error_code ec;
      fs::remove_all(old, ec);
      if (spec.keep > 0) {
        auto done = complete_checkpoints(root);
        const size_t n = done.size();
        for (size_t i = 0; i + static_cast<size_t>(spec.keep) < n; ++i)
          if (done[i].first < spec.step) remove_checkpoint_dir(done[i].second, root, spec.world_rank, spec.step);
        // Incomplete leftovers of older saves (killed halfway) are never loadable: remove them too.
        for (const auto& de : fs::directory_iterator(root)) {
          int64_t s = 0;
          if (de.is_directory() && parse_step_dir(de.path().filename().string(), &s) && s < spec.step &&
              !fs::exists(de.path() / kDoneMarkerName))
            fs::remove_all(de.path(), ec);
        }
      }
    } catch (const std::exception& e) {
      err = concat("checkpoint ", final_dir, ": ", e.what());
      std::error_code ec;
      if (committing) undo_failed_commit(final_dir, old, root, spec.ops);
      if (!has_marker(final_dir)) fs::remove_all(tmp, ec);
    }
  }
  if (!first_error.empty() && lead) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  agree(world, lead ? err : (first_error.empty() ? "" : first_error), false);
  return result;
}

// ---- listing ------------------------------------------------------------------

std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& de : fs::directory_iterator(root, ec)) {
    int64_t s = 0;
    if (!parse_step_dir(de.path().filename().string(), &s)) continue;
    // A marker that is there but not a file (a FIFO, a directory) is refused, not taken for a missing one:
    // skipping the checkpoint would silently throw away its progress (resume at an older step, or step 0).
    if (const auto st = fs::symlink_status(de.path() / kDoneMarkerName, ec);
        de.is_directory(ec) && fs::exists(st) && !fs::is_regular_file(st))
      throw FormatError(concat((de.path() / kDoneMarkerName).string(),
                               ": the done marker is not a regular file; remove it (or the step directory) by hand"));
    if (!de.is_directory(ec) || !fs::is_regular_file(de.path() / kDoneMarkerName, ec)) continue;
    out.emplace_back(s, de.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  auto all = complete_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

namespace {
// DIR/manifest.json's text, read once and checked against the done marker's
// SHA-256 before anything parses it (a manifest padded to 1 GiB was parsed,
// 4 GB and a minute, before the hash said it had been changed). `marker`
// receives the parsed marker. FormatError for a mismatch.
std::string manifest_text_matching_marker(const std::string& dir, const std::string& w, json* marker) {
  const std::string marker_path = (fs::path(dir) / kDoneMarkerName).string();
  *marker = parse_json(read_regular_file(marker_path, 1 << 20), marker_path, w);
  const std::string mpath = (fs::path(dir) / kManifestName).string();
  std::string mtext = read_regular_file(mpath, kMaxManifestBytes);
  const std::string mhash = sha256_hex(mtext);
  if (!marker->is_object() || marker->value("manifest_sha256", "") != mhash)
    throw FormatError(concat(w, ": ", mpath, " does not match the done marker (SHA-256 ", mhash, ", the marker says ",
                             marker->is_object() ? marker->value("manifest_sha256", "(none)") : "(not an object)",
                             "): the manifest was changed after the save"));
  return mtext;
}

// DIR/manifest.json parsed, or nullopt when there is none; FormatError for
// one that is not a JSON object, or that its done marker (when there is one)
// does not vouch for.
std::optional<json> read_manifest_json(const std::string& dir) {
  std::error_code ec;
  const fs::path m = fs::path(dir) / kManifestName;
  if (fs::symlink_status(m, ec).type() == fs::file_type::not_found) return std::nullopt;
  json marker;
  json j = fs::exists(fs::path(dir) / kDoneMarkerName, ec)
               ? parse_json(manifest_text_matching_marker(dir, dir, &marker), m.string(), dir)
               : parse_json(read_regular_file(m.string(), kMaxManifestBytes), m.string(), dir);
  if (!j.is_object()) throw FormatError(concat(m.string(), ": expected a JSON object, found ", j.type_name()));
  return j;
}
}  // namespace

namespace {
// Throws FormatError unless manifest `j` (of DIR, at `mpath`) is in this
// build's format; an earlier tessera's formats get the way to convert them.
void refuse_other_format(const json& j, const std::string& dir, const std::string& mpath) {
  const json& fj = j.is_object() && j.contains("format") ? j.at("format") : json();
  const std::string f = fj.is_string() ? fj.get<std::string>() : "";
  if (f == kFormat) return;
  if (f == kOldShardFormat)
    throw FormatError(
        concat(dir, " is a shard set of an earlier tessera (format ", kOldShardFormat,
               "), which this build no longer reads; regenerate it from the Hugging Face file it was cut from: "
               "`build/bin/tessera ckpt shard --tp T --pp P --out NEW_DIR MODEL.safetensors` (its tp and pp are in ",
               mpath, ")"));
  if (f == kOldTrainFormat)
    throw FormatError(concat(dir, " is a training checkpoint of an earlier tessera (format ", kOldTrainFormat,
                             "), which this build no longer reads; consolidate it with the build that wrote it "
                             "(`tessera ckpt consolidate --out MODEL.safetensors ",
                             dir,
                             "`), then `build/bin/tessera ckpt shard --tp T --out NEW_DIR MODEL.safetensors` "
                             "or `train_gpt --init MODEL.safetensors`"));
  throw FormatError(concat(mpath, ": not a ", kFormat, " manifest (field 'format' is ", fj.dump(), ")"));
}
}  // namespace

void refuse_old_format(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  if (const std::optional<json> j = read_manifest_json(dir))
    refuse_other_format(*j, dir, (fs::path(dir) / kManifestName).string());
}

std::optional<std::string> resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return std::nullopt;
  // One read of the manifest (it was read, hashed and parsed twice here).
  if (const std::optional<json> j = read_manifest_json(path)) {
    refuse_other_format(*j, path, (fs::path(path) / kManifestName).string());
    return path;
  }
  return latest_checkpoint(path);
}

// ---- load ---------------------------------------------------------------------

Checkpoint::~Checkpoint() = default;

namespace {

template <class T>
T field(const json& j, const char* key, const std::string& ctx) {
  if (!j.is_object() || !j.contains(key)) throw FormatError(concat(ctx, ": field '", key, "' is missing"));
  const json& v = j.at(key);
  bool ok;
  if constexpr (std::is_same_v<T, bool>)
    ok = v.is_boolean();
  else if constexpr (std::is_unsigned_v<T>)
    ok = v.is_number_unsigned();
  else if constexpr (std::is_integral_v<T>)
    ok = v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<T>::min() &&
         v.get<int64_t>() <= std::numeric_limits<T>::max();
  else if constexpr (std::is_same_v<T, std::string>)
    ok = v.is_string();
  else
    ok = true;
  if (!ok) throw FormatError(concat(ctx, ": field '", key, "' has the wrong type (", v.dump(), ")"));
  return v.get<T>();
}

Shape shape_field(const json& j, const char* key, const std::string& ctx) {
  if (!j.contains(key) || !j.at(key).is_array())
    throw FormatError(concat(ctx, ": field '", key, "' must be an array of non-negative integers"));
  Shape s;
  for (const json& d : j.at(key)) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw FormatError(concat(ctx, ": field '", key, "' must be an array of non-negative integers"));
    s.push_back(d.get<int64_t>());
  }
  if (s.size() > 8) throw FormatError(concat(ctx, ": field '", key, "' has more than 8 dimensions"));
  return s;
}

DType dtype_field(const json& j, const std::string& ctx) {
  const std::string d = field<std::string>(j, "dtype", ctx);
  if (d == "F32") return DType::F32;
  if (d == "BF16") return DType::BF16;
  if (d == "F16") return DType::F16;
  throw FormatError(concat(ctx, ": dtype '", d, "' must be F32, BF16 or F16"));
}

bool safe_file_name(const std::string& n) {
  if (n.empty() || n.size() > 200 || n[0] == '.') return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir_in) {
  try {
    open(dir_in);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    throw FormatError(
        concat("checkpoint ", dir_in, ": manifest or marker: a field has an unexpected type (", e.what(), ")"));
  }
}

void Checkpoint::open(const std::string& dir_in) {
  dir_ = fs::path(dir_in).lexically_normal().string();
  if (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  const std::string w = where();
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) throw FormatError(concat(w, ": not a directory"));
  const std::string marker_path = (fs::path(dir_) / kDoneMarkerName).string();
  if (!fs::exists(marker_path, ec)) {
    refuse_old_format(dir_);  // an earlier tessera's directory says so first
    throw FormatError(
        concat(w, ": no done marker (", kDoneMarkerName, "): the save did not finish, so it is never loaded"));
  }
  // Read, checked against the marker and parsed once.
  json marker;
  const std::string mpath = (fs::path(dir_) / kManifestName).string();
  json m = parse_json(manifest_text_matching_marker(dir_, w, &marker), mpath, w);
  refuse_other_format(m, dir_, mpath);
  const std::string mc = concat(w, ": ", kManifestName);
  if (field<int>(m, "version", mc) != kVersion)
    throw FormatError(
        concat(mc, ": version ", m["version"].dump(), " is not supported (this build reads ", kVersion, ")"));
  step_ = field<int64_t>(m, "step", mc);
  if (step_ < 0) throw FormatError(concat(mc, ": negative step"));
  if (marker.value("step", int64_t{-1}) != step_)
    throw FormatError(concat(w, ": the done marker is for step ", marker.value("step", int64_t{-1}),
                             ", the manifest for step ", step_));
  run_id_ = field<std::string>(m, "run_id", mc);
  const json& lj = m.contains("layout") ? m["layout"] : json();
  const std::string lc = mc + " layout";
  layout_.tp = field<int>(lj, "tp", lc);
  layout_.dp = field<int>(lj, "dp", lc);
  layout_.pp = field<int>(lj, "pp", lc);
  layout_.zero1 = field<bool>(lj, "zero1", lc);
  layout_.sequence_parallel = field<bool>(lj, "sequence_parallel", lc);
  if (layout_.tp < 1 || layout_.dp < 1 || layout_.pp < 1 || layout_.tp > kMaxDegree || layout_.dp > kMaxDegree ||
      layout_.pp > kMaxDegree)
    throw FormatError(concat(lc, ": tp, dp and pp must be in [1, 2^20]"));
  if (lj.contains("stages")) {
    if (!lj["stages"].is_array() || lj["stages"].size() > (1 << 20))
      throw FormatError(concat(lc, ": 'stages' must be an array of layer counts"));
    for (const json& s : lj["stages"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 1 || s.get<int64_t>() > (1 << 24))
        throw FormatError(concat(lc, ": 'stages' must hold positive layer counts"));
      layout_.stages.push_back(s.get<int>());
    }
  }
  if (!m.contains("model") || !m["model"].is_object())
    throw FormatError(concat(mc, ": 'model' (the model description) must be an object"));
  model_json_ = m["model"].dump();

  if (m.contains("trainer_state")) {
    const json& st = m["trainer_state"];
    state_file_.name = field<std::string>(st, "name", mc + " trainer_state");
    state_file_.bytes = field<uint64_t>(st, "bytes", mc + " trainer_state");
    state_file_.sha256 = field<std::string>(st, "sha256", mc + " trainer_state");
    if (!safe_file_name(state_file_.name) || !is_hex64(state_file_.sha256))
      throw FormatError(concat(mc, ": trainer_state has a bad name or sha256"));
  }

  if (!m.contains("tensors") || !m["tensors"].is_object())
    throw FormatError(concat(mc, ": 'tensors' must be an object"));
  for (auto it = m["tensors"].begin(); it != m["tensors"].end(); ++it) {
    const std::string tc = concat(mc, ": tensor ", it.key());
    TensorInfo ti;
    ti.dtype = dtype_field(*it, tc);
    ti.shape = shape_field(*it, "shape", tc);
    ti.layer = field<int>(*it, "layer", tc);
    if (ti.layer < parallel::layers::kHeadLayer) throw FormatError(concat(tc, ": bad layer ", ti.layer));
    checked_numel(ti.shape, tc);
    tensors_[it.key()] = ti;
  }
  // The layout against the model's layers: pp 3 with stages [5, 5] over a
  // 2-layer model verified OK, and reshard wrote it on.
  int64_t layers = 0;
  for (const auto& [name, ti] : tensors_) layers = std::max<int64_t>(layers, ti.layer + 1);
  if (layers > 0) {
    try {
      (void)pipeline::resolve_stages(layout_.stages, layers, layout_.pp);
    } catch (const InvalidArgument& e) {
      throw FormatError(concat(lc, ": ", e.what(), " (the tensors hold ", layers, " layers)"));
    }
  }

  if (!m.contains("files") || !m["files"].is_array()) throw FormatError(concat(mc, ": 'files' must be an array"));
  std::set<std::string> names{kManifestName, kDoneMarkerName};
  if (has_trainer_state()) names.insert(state_file_.name);
  for (const json& fj : m["files"]) {
    FileInfo fi;
    fi.name = field<std::string>(fj, "name", mc + " file");
    const std::string fc = concat(mc, ": file ", fi.name);
    if (!safe_file_name(fi.name)) throw FormatError(concat(fc, ": not a plain file name in the checkpoint directory"));
    if (!names.insert(fi.name).second) throw FormatError(concat(fc, ": listed twice"));
    fi.bytes = field<uint64_t>(fj, "bytes", fc);
    fi.sha256 = field<std::string>(fj, "sha256", fc);
    if (!is_hex64(fi.sha256)) throw FormatError(concat(fc, ": sha256 must be 64 lowercase hex digits"));
    fi.rank = field<int>(fj, "rank", fc);
    // The real size before any size in the manifest is trusted (no allocation from a lie).
    uint64_t real = 0;
    const std::string path = (fs::path(dir_) / fi.name).string();
    try {
      int fd = open_regular_file(path, &real);
      ::close(fd);
    } catch (const FormatError& e) {
      throw FormatError(concat(w, ": ", e.what()));
    }
    if (real != fi.bytes)
      throw FormatError(concat(w, ": ", path, " has ", real, " bytes, the manifest says ", fi.bytes,
                               real < fi.bytes ? " (truncated" : " (damaged",
                               ", or another rank's or another checkpoint's file)"));
    const size_t file_index = files_.size();
    files_.push_back(fi);
    if (!fj.contains("pieces") || !fj["pieces"].is_array())
      throw FormatError(concat(fc, ": 'pieces' must be an array"));
    uint64_t piece_bytes = 0;
    std::set<std::string> keys;
    for (const json& pj : fj["pieces"]) {
      PieceInfo pc;
      pc.file = file_index;
      pc.tensor = field<std::string>(pj, "tensor", fc + " piece");
      const std::string pcx = concat(fc, ": piece of tensor ", pc.tensor);
      auto t = tensors_.find(pc.tensor);
      if (t == tensors_.end()) throw FormatError(concat(pcx, ": the tensor is not in 'tensors'"));
      const std::string kind = field<std::string>(pj, "kind", pcx);
      if (kind == "param")
        pc.kind = StateKind::Param;
      else if (kind == "exp_avg")
        pc.kind = StateKind::ExpAvg;
      else if (kind == "exp_avg_sq")
        pc.kind = StateKind::ExpAvgSq;
      else if (kind == "master")
        pc.kind = StateKind::Master;
      else
        throw FormatError(concat(pcx, ": unknown kind '", kind, "'"));
      pc.key = field<std::string>(pj, "key", pcx);
      if (!keys.insert(pc.key).second) throw FormatError(concat(pcx, ": key ", pc.key, " twice in the file"));
      pc.split_dim = field<int>(pj, "split_dim", pcx);
      pc.chunks = field<int>(pj, "chunks", pcx);
      pc.tp = field<int>(pj, "tp", pcx);
      pc.tp_rank = field<int>(pj, "tp_rank", pcx);
      pc.tp_parts = field<int>(pj, "tp_parts", pcx);
      pc.shard_shape = shape_field(pj, "shard_shape", pcx);
      const Shape& full = t->second.shape;
      if (pc.split_dim < -1 || pc.split_dim >= static_cast<int>(full.size()))
        throw FormatError(concat(pcx, ": split_dim ", pc.split_dim, " is not a dimension of ", shape_str(full)));
      if (pc.chunks < 1 || pc.chunks > kMaxChunks || (pc.split_dim >= 0 && full[pc.split_dim] % pc.chunks != 0))
        throw FormatError(
            concat(pcx, ": chunks ", pc.chunks, " does not divide dimension ", pc.split_dim, " of ", shape_str(full)));
      if (pc.tp < 1 || pc.tp > (1 << 20) || pc.tp_rank < 0 || pc.tp_rank >= pc.tp)
        throw FormatError(concat(pcx, ": tp_rank ", pc.tp_rank, " of tp ", pc.tp, " is impossible"));
      if (pc.split_dim >= 0 && pc.tp != layout_.tp)
        throw FormatError(concat(pcx, ": tp ", pc.tp, " is not the layout's tp ", layout_.tp));
      if (pc.tp_parts < 1 || pc.tp_parts > pc.tp || pc.tp % pc.tp_parts != 0)
        throw FormatError(concat(pcx, ": tp_parts ", pc.tp_parts, " does not divide tp ", pc.tp));
      const Parameter d = descriptor(pc.tensor, full, pc.split_dim, pc.chunks, pc.tp, pc.tp_rank, pc.tp_parts);
      if (d.shape != pc.shard_shape)
        throw FormatError(concat(pcx, ": shard_shape ", shape_str(pc.shard_shape), " is not TP rank ", pc.tp_rank,
                                 " of ", pc.tp, "'s shard of ", shape_str(full), " (", shape_str(d.shape), ")"));
      if (!pj.contains("range") || !pj["range"].is_array() || pj["range"].size() != 2 ||
          !pj["range"][0].is_number_integer() || !pj["range"][1].is_number_integer())
        throw FormatError(concat(pcx, ": 'range' must be [begin, end]"));
      pc.begin = pj["range"][0].get<int64_t>();
      pc.end = pj["range"][1].get<int64_t>();
      if (pc.begin < 0 || pc.end <= pc.begin || pc.end > d.numel())
        throw FormatError(
            concat(pcx, ": range [", pc.begin, ", ", pc.end, ") is not inside its shard of ", d.numel(), " elements"));
      piece_bytes += static_cast<uint64_t>(pc.end - pc.begin) * dtype_size(kind_dtype(pc.tensor, pc.kind));
      if (piece_bytes > fi.bytes)
        throw FormatError(concat(pcx, ": the pieces need more than the file's ", fi.bytes, " bytes"));
      by_tensor_[{pc.tensor, static_cast<int>(pc.kind)}].push_back(pieces_.size());
      pieces_.push_back(pc);
    }
  }

  // Every element of every (tensor, kind) in exactly one piece.
  const bool moments = has_kind(StateKind::ExpAvg) || has_kind(StateKind::ExpAvgSq);
  const bool masters = has_kind(StateKind::Master);
  if (masters && !moments) throw FormatError(concat(w, ": master weights without the AdamW moments"));
  for (const auto& [tname, ti] : tensors_) {
    const int64_t numel = checked_numel(ti.shape, mc);
    for (StateKind k : {StateKind::Param, StateKind::ExpAvg, StateKind::ExpAvgSq, StateKind::Master}) {
      if (k != StateKind::Param && !moments) continue;
      if (k == StateKind::Master && !masters) continue;
      auto it = by_tensor_.find({tname, static_cast<int>(k)});
      const std::string tk = concat(w, ": tensor ", tname, " (", state_kind_name(k), ")");
      if (it == by_tensor_.end()) {
        if (numel == 0) continue;
        throw FormatError(concat(tk, " is in no file"));
      }
      int64_t held = 0;
      for (size_t pi : it->second) held += pieces_[pi].end - pieces_[pi].begin;
      struct Iv {
        int64_t begin, n;
        size_t piece;
      };
      std::vector<Iv> ivs;
      for (size_t pi : it->second) {
        const PieceInfo& pc = pieces_[pi];
        const Parameter d = descriptor(tname, ti.shape, pc.split_dim, pc.chunks, pc.tp, pc.tp_rank, pc.tp_parts);
        shard_runs_in(d, pc.begin, pc.end, [&](int64_t, int64_t full, int64_t n) {
          if (full < 0) return;
          if (!ivs.empty() && ivs.back().piece == pi && ivs.back().begin + ivs.back().n == full)
            ivs.back().n += n;
          else
            ivs.push_back({full, n, pi});
        });
      }
      std::sort(ivs.begin(), ivs.end(), [](const Iv& a, const Iv& b) { return a.begin < b.begin; });
      int64_t next = 0;
      size_t prev = 0;
      for (const Iv& iv : ivs) {
        if (iv.begin > next) throw FormatError(concat(tk, ": elements [", next, ", ", iv.begin, ") are in no file"));
        if (iv.begin < next)
          throw FormatError(concat(tk, ": element ", iv.begin, " is in two pieces (", files_[pieces_[prev].file].name,
                                   " and ", files_[pieces_[iv.piece].file].name, ")"));
        next = iv.begin + iv.n;
        prev = iv.piece;
      }
      if (next != numel)
        throw FormatError(concat(tk, ": elements [", next, ", ", numel, ") are in no file (its pieces hold ", held,
                                 " of ", numel, " elements)"));
    }
  }
}

bool Checkpoint::has_kind(StateKind k) const {
  for (const PieceInfo& p : pieces_)
    if (p.kind == k) return true;
  return false;
}

DType Checkpoint::dtype(const std::string& tensor) const {
  auto t = tensors_.find(tensor);
  if (t == tensors_.end()) throw FormatError(concat(where(), " has no tensor ", tensor));
  return t->second.dtype;
}

std::string Checkpoint::read_trainer_state() const {
  if (!has_trainer_state())
    throw FormatError(concat(where(),
                             " holds no trainer state (it holds parameters only: written by `tessera ckpt "
                             "shard`, or resharded from one)"));
  const std::string path = (fs::path(dir_) / state_file_.name).string();
  std::string bytes;
  try {
    bytes = read_regular_file(path, uint64_t{1} << 30);
  } catch (const FormatError& e) {
    throw FormatError(concat(where(), ": ", e.what()));
  }
  if (bytes.size() != state_file_.bytes)
    throw FormatError(
        concat(where(), ": ", path, " has ", bytes.size(), " bytes, the manifest says ", state_file_.bytes));
  const std::string h = sha256_hex(bytes);
  if (h != state_file_.sha256)
    throw FormatError(
        concat(where(), ": ", path, " is damaged: SHA-256 ", h, ", the manifest says ", state_file_.sha256));
  return bytes;
}

void Checkpoint::verify_model(const ModelLayout& model) const {
  const std::string w = concat(where(), ": the manifest's model (", model.describe(), ")");
  // The layers first (cheap; a model of 10^6 layers is not laid out to find it lies).
  int64_t layers = 0;
  for (const auto& [n, t] : tensors_) layers = std::max<int64_t>(layers, t.layer + 1);
  if (model.layers() != layers)
    throw FormatError(concat(w, " has ", model.layers(), " layers; the files hold layers 0..", layers - 1));
  std::vector<Parameter> expect;
  try {
    expect = model.tensors(1, 0);
  } catch (const InvalidArgument& e) {
    throw FormatError(concat(w, " is not a model: ", e.what()));
  }
  std::set<std::string> names;
  for (const Parameter& p : expect) {
    names.insert(p.name);
    auto t = tensors_.find(p.name);
    if (t == tensors_.end()) throw FormatError(concat(w, " has tensor ", p.name, ", which no file holds"));
    if (t->second.layer != p.layer)
      throw FormatError(
          concat(w, " puts tensor ", p.name, " in layer ", p.layer, "; the files record layer ", t->second.layer));
    if (t->second.shape != p.full_shape)
      throw FormatError(concat(w, " gives tensor ", p.name, " the shape ", shape_str(p.full_shape),
                               "; the files hold it as ", shape_str(t->second.shape)));
  }
  for (const auto& [n, t] : tensors_)
    if (!names.count(n)) throw FormatError(concat(w, " has no tensor ", n, ", which the files hold"));
  // Each piece's split as the model cuts it for its TP rank.
  std::map<std::pair<int, int>, std::map<std::string, Parameter>> cut;
  for (const PieceInfo& pc : pieces_) {
    auto& ranks = cut[{pc.tp, pc.tp_rank}];
    if (ranks.empty()) {
      std::vector<Parameter> ps;
      try {
        ps = model.tensors(pc.tp, pc.tp_rank);
      } catch (const InvalidArgument& e) {
        throw FormatError(
            concat(w, " cannot be split over tp ", pc.tp, " as ", files_[pc.file].name, " is: ", e.what()));
      }
      for (Parameter& p : ps) ranks.emplace(p.name, std::move(p));
    }
    auto it = ranks.find(pc.tensor);
    if (it == ranks.end()) continue;  // a replicated tensor of a tp-1 piece
    const Parameter& p = it->second;
    const bool split = p.split_dim >= 0;
    const int parts = split ? p.tp_parts : 1;
    if (pc.tp == 1 && !split && pc.split_dim < 0) continue;
    if (p.split_dim != pc.split_dim || (split && (p.chunks != pc.chunks || parts != pc.tp_parts)) ||
        p.shape != pc.shard_shape)
      throw FormatError(concat(w, " splits tensor ", pc.tensor, " for tp rank ", pc.tp_rank, " of ", pc.tp,
                               " as split_dim ", p.split_dim, ", chunks ", p.chunks, ", parts ", parts, ", shard ",
                               shape_str(p.shape), "; ", files_[pc.file].name, " holds split_dim ", pc.split_dim,
                               ", chunks ", pc.chunks, ", parts ", pc.tp_parts, ", shard ", shape_str(pc.shard_shape)));
  }
}

const SafetensorsReader& Checkpoint::reader(size_t i) const {
  auto it = readers_.find(i);
  if (it != readers_.end()) return *it->second;
  auto r = std::make_unique<SafetensorsReader>((fs::path(dir_) / files_[i].name).string());
  return *readers_.emplace(i, std::move(r)).first->second;
}

void Checkpoint::verify_file(size_t i) const {
  const FileInfo& fi = files_.at(i);
  const std::string path = (fs::path(dir_) / fi.name).string();
  const std::string w = where();
  uint64_t real = 0;
  try {
    int fd = open_regular_file(path, &real);
    ::close(fd);
  } catch (const FormatError& e) {
    throw FormatError(concat(w, ": ", e.what()));
  }
  // Which tensors a damaged file would have fed (for the message).
  auto tensors_in = [&]() {
    std::string s;
    int n = 0;
    for (const PieceInfo& p : pieces_) {
      if (p.file != i || p.kind != StateKind::Param) continue;
      if (n++ < 3) s += (s.empty() ? "" : ", ") + p.tensor;
    }
    if (n > 3) s += concat(" and ", n - 3, " more");
    return s;
  };
  if (real != fi.bytes)
    throw FormatError(concat(w, ": ", path, " has ", real, " bytes, the manifest says ", fi.bytes,
                             real < fi.bytes ? " (truncated)" : "", "; it holds tensors ", tensors_in()));
  const std::string h = sha256_file_hex(path);
  if (h != fi.sha256) {
    std::string from;
    try {
      SafetensorsReader r(path);
      const auto& md = r.metadata();
      auto get = [&](const char* k) { return md.count(k) ? md.at(k) : std::string("?"); };
      if (get("run_id") != run_id_ || get("step") != std::to_string(step_))
        from = concat(" (the file is from run ", get("run_id"), " step ", get("step"), ", this checkpoint is run ",
                      run_id_, " step ", step_, ")");
    } catch (const std::exception&) {
    }
    throw FormatError(concat(w, ": ", path, " is damaged: SHA-256 ", h, ", the manifest says ", fi.sha256, from,
                             " (the file is damaged, or is another rank's or another checkpoint's file)",
                             "; it holds tensors ", tensors_in()));
  }
  // A reader of its own (verify_all runs this on two threads; reader()'s cache is not shared).
  std::unique_ptr<SafetensorsReader> rp;
  try {
    rp = std::make_unique<SafetensorsReader>(path);
  } catch (const FormatError& e) {
    throw FormatError(concat(w, ": ", e.what()));
  }
  const SafetensorsReader& r = *rp;
  const auto& md = r.metadata();
  auto meta = [&](const char* k) { return md.count(k) ? md.at(k) : std::string(); };
  if (meta("run_id") != run_id_ || meta("step") != std::to_string(step_))
    throw FormatError(concat(w, ": ", path, " is from run ", meta("run_id"), " step ", meta("step"),
                             ", this checkpoint is run ", run_id_, " step ", step_));
  if (meta("model_sha256") != model_sha(model_json_))
    throw FormatError(concat(w, ": the manifest's model description is not the one ", path,
                             " was written for (its model_sha256 ", meta("model_sha256"), ", the manifest's model ",
                             model_sha(model_json_), "): the manifest's model was changed after the save"));
  size_t count = 0;
  for (const PieceInfo& p : pieces_) {
    if (p.file != i) continue;
    ++count;
    if (!r.contains(p.key))
      throw FormatError(concat(w, ": ", path, " lacks ", p.key, " (tensor ", p.tensor, ") that the manifest lists"));
    const SafetensorsEntry& e = r.entry(p.key);
    const DType want = kind_dtype(p.tensor, p.kind);
    if (e.dtype != want || e.shape != Shape{p.end - p.begin})
      throw FormatError(concat(w, ": ", path, ": ", p.key, " (tensor ", p.tensor, ") is ",
                               dtype_safetensors_name(e.dtype), " ", shape_str(e.shape), ", the manifest says ",
                               dtype_safetensors_name(want), " [", p.end - p.begin, "]"));
  }
  if (r.entries().size() != count)
    throw FormatError(concat(w, ": ", path, " holds ", r.entries().size(), " tensors, the manifest lists ", count));
}

uint64_t Checkpoint::verify_all() const {
  uint64_t bytes = 0;
  if (has_trainer_state()) {
    read_trainer_state();
    bytes += state_file_.bytes;
  }
  // Two threads: SHA-256 runs ~2 GB/s per core; the first failure (in file order) is raised.
  std::vector<std::exception_ptr> err(files_.size());
  auto work = [&](size_t first, size_t stride) {
    for (size_t k = first; k < files_.size(); k += stride) {
      try {
        verify_file(k);
      } catch (...) {
        err[k] = std::current_exception();
      }
    }
  };
  std::thread other;
  if (files_.size() > 1) other = std::thread(work, 1, 2);
  work(0, files_.size() > 1 ? 2 : 1);
  if (other.joinable()) other.join();
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
  for (const FileInfo& f : files_) bytes += f.bytes;
  return bytes;
}

void Checkpoint::verify_collective(collectives::Communicator* world) const {
  const int rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  std::string err;
  try {
    for (size_t i = static_cast<size_t>(rank); i < files_.size(); i += static_cast<size_t>(size)) verify_file(i);
  } catch (const FormatError& e) {
    err = e.what();
  }
  agree(world, err, true);
}

void Checkpoint::read(const Parameter& dest, StateKind kind, int64_t begin, int64_t end, void* dst_v) const {
  auto t = tensors_.find(dest.name);
  if (t == tensors_.end()) throw FormatError(concat(where(), " has no tensor ", dest.name));
  if (t->second.shape != dest.full_shape)
    throw InvalidArgument(concat(where(), ": tensor ", dest.name, " has shape ", shape_str(t->second.shape),
                                 " in the checkpoint, the model's is ", shape_str(dest.full_shape)));
  const uint64_t es = dtype_size(kind_dtype(dest.name, kind));
  uint8_t* dst = static_cast<uint8_t*>(dst_v);
  auto it = by_tensor_.find({dest.name, static_cast<int>(kind)});
  if (begin >= end) return;
  struct Run {
    int64_t full, off, n;
  };
  std::vector<Run> want;
  int64_t need = 0;
  shard_runs_in(dest, begin, end, [&](int64_t local, int64_t full, int64_t n) {
    if (full < 0) {
      std::memset(dst + static_cast<uint64_t>(local - begin) * es, 0, static_cast<size_t>(n) * es);
    } else {
      want.push_back({full, local - begin, n});
      need += n;
    }
  });
  if (it == by_tensor_.end()) {
    if (need == 0) return;
    throw FormatError(concat(where(), " has no ", state_kind_name(kind), " for tensor ", dest.name));
  }
  if (need == 0) return;
  int64_t got = 0;
  std::vector<Run> have;
  for (size_t pi : it->second) {
    const PieceInfo& pc = pieces_[pi];
    const Parameter src =
        descriptor(dest.name, dest.full_shape, pc.split_dim, pc.chunks, pc.tp, pc.tp_rank, pc.tp_parts);
    have.clear();
    shard_runs_in(src, pc.begin, pc.end, [&](int64_t local, int64_t full, int64_t n) {
      if (full >= 0) have.push_back({full, local - pc.begin, n});
    });
    if (have.empty() || have.back().full + have.back().n <= want.front().full ||
        want.back().full + want.back().n <= have.front().full)
      continue;
    // pread, not the mapping: a large checkpoint read piece by piece costs
    // only the pieces' memory (no mapped pages stay resident).
    const SafetensorsReader& r = reader(pc.file);
    const SafetensorsEntry& ent = r.entry(pc.key);
    size_t a = 0, b = 0;
    while (a < want.size() && b < have.size()) {
      const Run& x = want[a];
      const Run& y = have[b];
      const int64_t s = std::max(x.full, y.full), e = std::min(x.full + x.n, y.full + y.n);
      if (s < e) {
        r.read_bytes(ent, static_cast<uint64_t>(y.off + (s - y.full)) * es, static_cast<uint64_t>(e - s) * es,
                     dst + static_cast<uint64_t>(x.off + (s - x.full)) * es);
        got += e - s;
      }
      if (x.full + x.n <= y.full + y.n)
        ++a;
      else
        ++b;
    }
  }
  if (got != need)
    throw FormatError(concat(where(), ": tensor ", dest.name, " (", state_kind_name(kind), "): found ", got, " of the ",
                             need, " elements needed"));
}

void Checkpoint::read_f32(const Parameter& dest, StateKind kind, int64_t begin, int64_t end, float* dst) const {
  const DType dt = kind_dtype(dest.name, kind);
  if (dt == DType::F32) return read(dest, kind, begin, end, dst);
  constexpr int64_t kStep = int64_t{1} << 20;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(end - begin, kStep)) * dtype_size(dt));
  for (int64_t b = begin; b < end; b += kStep) {
    const int64_t e = std::min(end, b + kStep);
    read(dest, kind, b, e, buf.data());
    convert(buf.data(), dt, dst + (b - begin), DType::F32, static_cast<size_t>(e - b));
  }
}

// ---- whole tensors (a Hugging Face file) -------------------------------------------

WholeTensors::WholeTensors(const TensorSource& src, std::map<std::string, std::string> stored)
    : src_(src), stored_(std::move(stored)) {}

std::string WholeTensors::where() const { return src_.path(); }

DType WholeTensors::dtype(const std::string& tensor) const {
  auto it = stored_.find(tensor);
  if (it == stored_.end()) throw FormatError(concat(src_.path(), " has no tensor ", tensor));
  return src_.entry(it->second).dtype;
}

void WholeTensors::read(const Parameter& dest, StateKind kind, int64_t begin, int64_t end, void* dst_v) const {
  if (kind != StateKind::Param)
    throw FormatError(concat(src_.path(), " holds weights only (no ", state_kind_name(kind), ")"));
  auto it = stored_.find(dest.name);
  if (it == stored_.end()) throw FormatError(concat(src_.path(), " has no tensor ", dest.name));
  const SafetensorsEntry& e = src_.entry(it->second);
  if (e.shape != dest.full_shape)
    throw InvalidArgument(concat(src_.path(), ": tensor ", it->second, " has shape ", shape_str(e.shape), ", expected ",
                                 shape_str(dest.full_shape)));
  const uint64_t es = dtype_size(e.dtype);
  uint8_t* dst = static_cast<uint8_t*>(dst_v);
  // Adjacent runs of the full tensor are read with one pread.
  int64_t run_local = -1, run_full = -1, run_n = 0;
  auto flush = [&] {
    if (run_n > 0)
      src_.read_bytes(it->second, static_cast<uint64_t>(run_full) * es, static_cast<uint64_t>(run_n) * es,
                      dst + static_cast<uint64_t>(run_local - begin) * es);
    run_n = 0;
  };
  shard_runs_in(dest, begin, end, [&](int64_t local, int64_t full, int64_t n) {
    if (full < 0) {
      flush();
      std::memset(dst + static_cast<uint64_t>(local - begin) * es, 0, static_cast<size_t>(n) * es);
      return;
    }
    if (run_n > 0 && run_local + run_n == local && run_full + run_n == full) {
      run_n += n;
      return;
    }
    flush();
    run_local = local;
    run_full = full;
    run_n = n;
  });
  flush();
}

// ---- offline writers ------------------------------------------------------------

namespace {

// A sibling temp directory of `target`, removed on destruction unless committed.
class TempSibling {
 public:
  explicit TempSibling(const std::string& target, const std::string& tag = "tmp")
      : target_(fs::absolute(target).lexically_normal()) {
    if (target_.filename().empty()) target_ = target_.parent_path();  // "out/" is "out"
    TESSERA_ARG_CHECK(!target_.filename().empty(), "bad output path '", target, "'");
    const std::string prefix = "." + target_.filename().string() + "." + tag + "-";
    path_ = target_.parent_path() / (prefix + std::to_string(::getpid()));
    // What killed runs of any ckpt command left there, for this --out or
    // another (their pid is dead; runtime/files.h).
    remove_dead_output_temps(target_.parent_path().string());
    std::error_code ec;
    fs::remove_all(path_, ec);
    // create_directory, not create_directories: a missing parent is an
    // error, and a failed command must not leave directories behind.
    if (!fs::create_directory(path_, ec) && ec)
      throw Error(concat(path_.string(), ": cannot create directory: ", ec.message()));
    // Held while it lives: a cleaner in another PID namespace, to which our
    // pid means nothing, leaves a locked directory alone.
    lock_ = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (lock_ >= 0) ::flock(lock_, LOCK_SH);
  }
  ~TempSibling() {
    if (!committed_) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
    if (lock_ >= 0) ::close(lock_);
  }
  TempSibling(const TempSibling&) = delete;
  TempSibling& operator=(const TempSibling&) = delete;
  const fs::path& path() const { return path_; }
  // The temp dir becomes the target (which may exist only as an empty dir).
  void commit(bool files_synced) {
    CommitOptions o;
    o.files_synced = files_synced;
    commit_directory(path_.string(), target_.string(), o);
    committed_ = true;
  }

 private:
  fs::path target_, path_;
  bool committed_ = false;
  int lock_ = -1;
};

// --out of a command that writes a directory: a new path in an existing
// directory, or an empty directory; never a symbolic link (whose target
// the write would replace, not the link).
void check_out_dir(const std::string& out) {
  std::error_code ec;
  TESSERA_ARG_CHECK(!out.empty(), "--out is empty");
  TESSERA_ARG_CHECK(!fs::is_symlink(out, ec), "--out ", out,
                    " is a symbolic link (give the directory it points to, or a new path)");
  if (!fs::exists(out, ec)) {
    fs::path p(out);
    if (!p.has_filename()) p = p.parent_path();  // "dir/": its parent is the one to exist
    const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
    TESSERA_ARG_CHECK(fs::is_directory(parent, ec), "--out ", out, ": directory '", parent.string(),
                      "' does not exist");
    return;
  }
  TESSERA_ARG_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec), "--out ", out,
                    " exists and is not an empty directory (refusing to overwrite)");
}

// Non-finite values found while streaming, by tensor, reported once the
// pass is over (before anything is committed).
class NonFiniteLog {
 public:
  void scan(const std::string& where, const std::string& name, const void* data, DType dtype, int64_t n, int64_t base) {
    int64_t count = 0, first = -1;
    const char* kind = "";
    scan_nonfinite(data, dtype, n, &count, &first, &kind);
    if (!count) return;
    auto [it, fresh] = index_.emplace(name, hits_.size());
    if (fresh) hits_.push_back({where, name, 0, base + first, kind});
    hits_[it->second].count += count;
  }
  void throw_if_any(const std::string& top) const {
    if (hits_.empty()) return;
    std::string msg = top + ": non-finite weights:";
    for (const Hit& h : hits_)
      msg += concat("\n  ", h.where, ": tensor '", h.name, "' holds ", h.count, " non-finite value",
                    h.count == 1 ? "" : "s", " (first at element ", h.first, " of its shard: ", h.kind, ")");
    msg += "\n(pass --allow-nonfinite to load them anyway)";
    throw FormatError(msg);
  }

 private:
  struct Hit {
    std::string where, name;
    int64_t count, first;
    const char* kind;
  };
  std::vector<Hit> hits_;
  std::map<std::string, size_t> index_;
};

// Elements per read of a piece: up to kPieceBytes.
int64_t step_elems(DType dt) { return std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(dtype_size(dt))); }

// Streams the pieces `outs` from `src` into `sink` through a background
// writer (hash and write on their own threads) in reads of at most 8 MiB.
void stream_pieces(const TensorReader& src, const std::vector<PieceOut>& outs, const std::string& head, FileSink& sink,
                   std::vector<uint8_t>& buf, NonFiniteLog* nf, std::string* sha) {
  BackgroundWriter bw(4, kOutBufferBytes);
  const size_t out = bw.add(&sink, sha != nullptr);
  bw.write(out, head.data(), head.size());
  for (const PieceOut& po : outs) {
    const uint64_t es = dtype_size(po.dtype);
    const int64_t step = step_elems(po.dtype);
    for (int64_t b = po.begin; b < po.end; b += step) {
      const int64_t e = std::min(po.end, b + step);
      const size_t n = static_cast<size_t>(e - b) * es;
      if (buf.size() < n) buf.resize(n);
      src.read(*po.p, po.kind, b, e, buf.data());
      if (nf && po.kind == StateKind::Param) nf->scan(src.where(), po.p->name, buf.data(), po.dtype, e - b, b);
      bw.write(out, buf.data(), n);
    }
  }
  bw.drain();
  if (sha) *sha = bw.digest(out);
}

// Streams several rank files at once: file i gets heads[i], then the pieces
// outs[i] in order. The files hold pieces of the same tensors in the same
// order (each a subset), so the pieces of one (tensor, kind) are written
// together: the source ranges they need are read once, ascending, in
// reads of at most 8 MiB (ranges less than 64 KiB apart in one read), and
// each file takes its runs from them. A TP shard's runs ascend in both its
// own and the full tensor's index, so each file is written in its order.
// (Reading each file's pieces on their own took a pread per row of a
// row-parallel weight and file: 262,000 for a 2 GB Llama at tp 8.)
void stream_ranks(const TensorReader& src, const std::vector<std::vector<PieceOut>>& outs,
                  const std::vector<std::string>& heads, const std::vector<FileSink*>& sinks, std::vector<uint8_t>& buf,
                  NonFiniteLog* nf, std::vector<std::string>* shas) {
  struct Run {
    int64_t local, full, n;
  };
  struct Member {
    size_t file;
    const PieceOut* po;
    std::vector<Run> runs;
    size_t next = 0;
    int64_t done = 0;  // elements of runs[next] already written
  };
  const size_t nfiles = outs.size();
  // Each file holds at most one partly filled buffer: one per file and a few to queue.
  BackgroundWriter bw(nfiles + 4, kOutBufferBytes);
  for (size_t i = 0; i < nfiles; ++i) {
    bw.add(sinks[i], true);
    bw.write(i, heads[i].data(), heads[i].size());
  }
  constexpr int64_t kGapBytes = int64_t{64} << 10;
  std::vector<size_t> cursor(nfiles, 0);
  std::vector<Member> group;
  std::vector<std::pair<int64_t, int64_t>> spans;  // full-index ranges to read
  for (;;) {
    // The next (tensor, kind): the first unwritten piece of the lowest file that has one.
    const PieceOut* lead = nullptr;
    for (size_t i = 0; i < nfiles && !lead; ++i)
      if (cursor[i] < outs[i].size()) lead = &outs[i][cursor[i]];
    if (!lead) break;
    group.clear();
    spans.clear();
    for (size_t i = 0; i < nfiles; ++i) {
      if (cursor[i] >= outs[i].size()) continue;
      const PieceOut& po = outs[i][cursor[i]];
      if (po.p->name != lead->p->name || po.kind != lead->kind) continue;
      ++cursor[i];
      Member m{i, &po, {}};
      shard_runs_in(*po.p, po.begin, po.end, [&](int64_t local, int64_t full, int64_t n) {
        m.runs.push_back({local, full, n});
        if (full >= 0) spans.emplace_back(full, full + n);
      });
      group.push_back(std::move(m));
    }
    const DType dt = lead->dtype;
    const int64_t es = static_cast<int64_t>(dtype_size(dt));
    const int64_t step = step_elems(dt), gap = std::max<int64_t>(1, kGapBytes / es);
    std::sort(spans.begin(), spans.end());
    const Parameter full = whole(lead->p->name, lead->p->full_shape);
    // Writes what each member's runs take from source elements [cb, ce)
    // (read into buf), and the padding runs before them.
    auto emit = [&](int64_t cb, int64_t ce) {
      for (Member& m : group) {
        while (m.next < m.runs.size()) {
          const Run& r = m.runs[m.next];
          if (r.full < 0) {
            bw.zeros(m.file, static_cast<size_t>(r.n * es));
            ++m.next;
            continue;
          }
          const int64_t from = r.full + m.done;
          if (from >= ce) break;
          const int64_t upto = std::min(r.full + r.n, ce);
          const uint8_t* p = buf.data() + (from - cb) * es;
          if (nf && m.po->kind == StateKind::Param)
            nf->scan(src.where(), m.po->p->name, p, dt, upto - from, r.local + m.done);
          bw.write(m.file, p, static_cast<size_t>((upto - from) * es));
          m.done += upto - from;
          if (m.done < r.n) break;
          ++m.next;
          m.done = 0;
        }
      }
    };
    for (size_t k = 0; k < spans.size();) {
      // One coalesced span, read in steps.
      int64_t sb = spans[k].first, se = spans[k].second;
      for (++k; k < spans.size() && spans[k].first <= se + gap; ++k) se = std::max(se, spans[k].second);
      for (int64_t cb = sb; cb < se; cb += step) {
        const int64_t ce = std::min(se, cb + step);
        const size_t n = static_cast<size_t>((ce - cb) * es);
        if (buf.size() < n) buf.resize(n);
        src.read(full, lead->kind, cb, ce, buf.data());
        emit(cb, ce);
      }
    }
    emit(0, 0);  // trailing padding
    for (const Member& m : group)
      TESSERA_CHECK(m.next == m.runs.size(), src.where(), ": ", m.po->p->name, " not written whole");
  }
  bw.drain();
  shas->resize(nfiles);
  for (size_t i = 0; i < nfiles; ++i) (*shas)[i] = bw.digest(i);
}

}  // namespace

uint64_t write_checkpoint(const TensorReader& src, const ModelLayout& model, const std::string& out_dir,
                          const WriteOptions& o) {
  const Layout& L = o.layout;
  // At most what a manifest may say (Checkpoint::open refuses more): --tp 2^30 reserved a vector per rank
  // (std::bad_alloc) before the heads were checked, and --dp 2^31 wrote files for ever.
  TESSERA_ARG_CHECK(
      L.tp >= 1 && L.dp >= 1 && L.pp >= 1 && L.tp <= kMaxDegree && L.dp <= kMaxDegree && L.pp <= kMaxDegree,
      "--tp, --pp and --dp must be in [1, 2^20] (got tp ", L.tp, ", pp ", L.pp, ", dp ", L.dp, ")");
  TESSERA_ARG_CHECK(model.layers() >= L.pp, "--pp ", L.pp, " exceeds the ", model.layers(), " layers of ", src.where(),
                    " (each stage needs a whole layer)");
  const std::vector<int> part = pipeline::resolve_stages(L.stages, model.layers(), L.pp);
  std::vector<std::vector<Parameter>> ranks;
  ranks.reserve(static_cast<size_t>(L.tp));
  try {
    for (int r = 0; r < L.tp; ++r) ranks.push_back(model.tensors(L.tp, r));
  } catch (const InvalidArgument& e) {  // tp does not fit the model: say whose
    throw InvalidArgument(concat(src.where(), ": ", e.what()));
  }
  TESSERA_ARG_CHECK(!o.optimizer || (src.has_kind(StateKind::ExpAvg) && src.has_kind(StateKind::ExpAvgSq)), src.where(),
                    " holds no optimizer state");
  check_out_dir(out_dir);
  const std::vector<StateKind> kinds = o.optimizer ? src.optimizer_kinds() : std::vector<StateKind>{};
  const FileMeta base{o.run_id, o.step, 0, canonical_model(model.model_json(), src.where())};
  Layout recorded = L;
  recorded.stages = part;

  TempSibling tmp(out_dir);
  NonFiniteLog nf;
  std::vector<uint8_t> buf;
  std::vector<json> files;
  uint64_t bytes = 0;
  const size_t nfiles = static_cast<size_t>(L.pp) * L.dp * L.tp;
  size_t written = 0;
  for (int s = 0; s < L.pp; ++s) {
    for (int d = 0; d < L.dp; ++d) {
      // The TP ranks' files of (stage s, dp slice d) are written together,
      // so each source range is read once for all of them (stream_ranks).
      std::vector<std::vector<PieceOut>> outs;
      std::vector<std::string> names, paths, heads;
      std::vector<json> entries;
      for (int r = 0; r < L.tp; ++r) {
        std::vector<PieceOut> mine;
        for (const Parameter& p : ranks[static_cast<size_t>(r)]) {
          if (stage_of(p, part) != s || p.tp_replica() != 0) continue;
          const int64_t n = p.numel(), b = n * d / L.dp, e = n * (d + 1) / L.dp;
          if (b >= e) continue;
          const DType dt = src.dtype(p.name);
          TESSERA_ARG_CHECK(float_dtype(dt), src.where(), ": tensor ", p.name, " is ", dtype_name(dt),
                            ", expected F32, BF16 or F16");
          mine.push_back({&p, StateKind::Param, b, e, dt});
          if (o.optimizer)
            for (StateKind k : kinds) mine.push_back({&p, k, b, e, DType::F32});
        }
        if (mine.empty()) continue;
        FileMeta fm = base;
        fm.world_rank = r + L.tp * (d + L.dp * s);
        names.push_back(rank_file_name(d, r, s));
        std::pair<std::string, json> hdr = rank_file_header(names.back(), fm, mine);
        heads.push_back(std::move(hdr.first));
        entries.push_back(std::move(hdr.second));
        paths.push_back((tmp.path() / names.back()).string());
        outs.push_back(std::move(mine));
      }
      if (outs.empty()) continue;
      std::vector<std::string> shas;
      AtomicWriteOptions wo;
      wo.direct = true;
      wo.sync = false;
      write_files_atomic(
          paths,
          [&](const std::vector<FileSink*>& sinks) {
            stream_ranks(src, outs, heads, sinks, buf, o.allow_nonfinite ? nullptr : &nf, &shas);
          },
          nullptr, wo);
      for (size_t i = 0; i < paths.size(); ++i) {
        fsync_path(paths[i]);
        entries[i]["bytes"] = fs::file_size(paths[i]);
        entries[i]["sha256"] = shas[i];
        bytes += entries[i]["bytes"].get<uint64_t>();
        files.push_back(std::move(entries[i]));
        if (++written == (nfiles + 1) / 2) fault_point("mid_output", 0, o.step);
      }
    }
  }
  nf.throw_if_any(src.where());
  const std::string mtext =
      write_state_and_manifest(tmp.path().string(), base, recorded, o.trainer_state, files, &bytes);
  write_marker(tmp.path().string(), mtext, o.step);
  fault_point("before_commit", 0, o.step);
  tmp.commit(true);
  return bytes;
}

std::vector<std::string> consolidate(const TensorReader& src, const ModelLayout& model, const std::string& out,
                                     uint64_t max_shard_bytes, bool with_optimizer, bool allow_nonfinite,
                                     const std::map<std::string, std::string>& extra) {
  std::error_code ec;
  const bool single = max_shard_bytes == 0;
  if (single)
    TESSERA_ARG_CHECK(!fs::exists(out, ec) && !fs::is_symlink(out, ec), "--out ", out,
                      " exists (refusing to overwrite)");
  else
    check_out_dir(out);
  TESSERA_ARG_CHECK(!with_optimizer || (src.has_kind(StateKind::ExpAvg) && src.has_kind(StateKind::ExpAvgSq)),
                    src.where(), " holds no optimizer state");
  std::vector<Parameter> tensors = model.tensors(1, 0);
  struct Item {
    const Parameter* p;
    StateKind kind;
    std::string name;
    DType dtype;
  };
  std::vector<Item> items;
  for (const Parameter& p : tensors) {
    const DType dt = src.dtype(p.name);
    TESSERA_ARG_CHECK(float_dtype(dt), src.where(), ": tensor ", p.name, " is ", dtype_name(dt),
                      ", expected F32, BF16 or F16");
    items.push_back({&p, StateKind::Param, p.name, dt});
  }
  // The weights' dtype as config.json's torch_dtype gives it (the first tensor's).
  const DType weights = items.empty() ? DType::F32 : items.front().dtype;
  if (with_optimizer)
    for (size_t i = 0, n = tensors.size(); i < n; ++i)
      for (StateKind k : src.optimizer_kinds())
        items.push_back({items[i].p, k, concat("optimizer.", state_kind_name(k), ".", items[i].name), DType::F32});
  std::map<std::string, std::string> md = model.file_metadata(weights);
  for (const auto& [k, v] : extra) md[k] = v;
  // Hugging Face's rule (save_pretrained): tensors in order, a new file when
  // the next would take this one past the limit; a larger tensor gets a file
  // of its own.
  std::vector<std::vector<size_t>> groups(1);
  uint64_t in_group = 0, total = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t b = static_cast<uint64_t>(items[i].p->numel()) * dtype_size(items[i].dtype);
    if (!single && !groups.back().empty() && in_group + b > max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += b;
    total += b;
  }
  NonFiniteLog nf;
  std::vector<uint8_t> buf;
  auto write_file = [&](const std::string& path, const std::vector<size_t>& idx, bool last) {
    std::vector<TensorSpec> specs;
    std::vector<PieceOut> outs;
    for (size_t i : idx) {
      specs.push_back({items[i].name, items[i].dtype, items[i].p->full_shape});
      outs.push_back({items[i].p, items[i].kind, 0, items[i].p->numel(), items[i].dtype});
    }
    const std::string header = safetensors_header(specs, md);
    AtomicWriteOptions wo;
    wo.direct = true;
    write_file_atomic(
        path,
        [&](FileSink& sink) {
          std::vector<Parameter> full;
          full.reserve(outs.size());
          for (PieceOut& po : outs) {
            full.push_back(whole(po.p->name, po.p->full_shape));
          }
          for (size_t k = 0; k < outs.size(); ++k) outs[k].p = &full[k];
          stream_pieces(src, outs, header, sink, buf, allow_nonfinite ? nullptr : &nf, nullptr);
          if (last) {
            nf.throw_if_any(src.where());
            fault_point("before_commit", 0, 0);
          }
        },
        wo);
  };
  std::vector<std::string> names;
  if (single) {
    write_file(out, groups[0], true);
    names.push_back(fs::path(out).filename().string());
    return names;
  }
  TempSibling tmp(out);
  const int n = static_cast<int>(groups.size());
  json weight_map = json::object();
  for (int k = 0; k < n; ++k) {
    // One file: model.safetensors alone, as save_pretrained writes it.
    names.push_back(n == 1 ? std::string("model.safetensors") : shard_file_name("model", k + 1, n));
    write_file((tmp.path() / names.back()).string(), groups[static_cast<size_t>(k)], k + 1 == n);
    for (size_t i : groups[static_cast<size_t>(k)]) weight_map[items[i].name] = names.back();
  }
  if (n > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((tmp.path() / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  for (const auto& [fname, bytes] : model.hf_files(weights)) write_file_atomic((tmp.path() / fname).string(), bytes);
  tmp.commit(true);
  return names;
}

}  // namespace tessera::parallel::checkpoint
