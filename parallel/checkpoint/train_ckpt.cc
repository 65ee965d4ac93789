#include "parallel/checkpoint/train_ckpt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "parallel/checkpoint/gpt2_layout.h"
#include "parallel/checkpoint/hf_gpt2.h"
#include "parallel/checkpoint/safetensors.h"
#include "runtime/error.h"
#include "runtime/files.h"

namespace tessera::parallel::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;
using detail::concat;
using parallel::layers::Parameter;

namespace {

constexpr int kMaxChunks = 64;
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

std::string rank_file_name(int dp_rank, int tp_rank, int pp_rank) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "dp_rank_%02d_tp_rank_%02d_pp_rank_%02d.safetensors", dp_rank, tp_rank, pp_rank);
  return buf;
}

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

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw Error(concat(dir, ": cannot open the directory to fsync it: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(concat(dir, ": cannot fsync the directory: ", std::strerror(err)));
}

void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(concat(path, ": cannot open to fsync: ", std::strerror(errno)));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(concat(path, ": cannot fsync: ", std::strerror(err)));
}

// Files inside the temp directory: atomic, then one fsync of the file; the
// directory is fsynced once before it is renamed (not once per file).
void write_in_temp_dir(const std::string& path, const std::function<void(FileSink&)>& fill) {
  AtomicWriteOptions o;
  o.sync = false;
  write_file_atomic(path, fill, o);
  fsync_file(path);
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

json read_json_file(const std::string& path, const std::string& where) {
  std::string text = read_regular_file(path, kMaxManifestBytes);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw FormatError(concat(where, ": ", path, " is not valid JSON (", e.what(), ")"));
  }
}

std::string shape_text(const Shape& s) { return shape_str(s); }

int64_t checked_numel(const Shape& s, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 0) throw FormatError(concat(what, ": negative dimension in ", shape_text(s)));
    if (d != 0 && n > (int64_t{1} << 50) / d)
      throw FormatError(concat(what, ": shape ", shape_text(s), " is too large"));
    n *= d;
  }
  return n;
}

Parameter descriptor(const std::string& name, const Shape& full, int split_dim, int chunks, int tp, int tp_rank) {
  return parallel::layers::make_parameter(name, full, split_dim, chunks, tp, tp_rank, parallel::layers::Init::Zeros,
                                          0.f, false);
}

// One piece a rank file holds: elements [begin, end) of the TP shard `p` of `kind`.
struct PieceOut {
  const Parameter* p;
  StateKind kind;
  int64_t begin, end;
};

// Writes one rank's file `name` into the temp checkpoint directory `tmp`:
// the header (F32 1-D tensors "<kind>/<name>", metadata run id, step and
// rank), then each piece's bytes through `fill(i, sink)`, which must write
// exactly (end - begin) x 4 bytes for piece i. Hashes as it writes; one
// fsync of the file. Returns the manifest's file entry (rank, name, bytes,
// sha256, pieces with their tensor's full shape under "shape").
// `in_memory` (optional): piece i's bytes are at in_memory[i] and stay
// unchanged until the call returns; they are then hashed on a second
// thread while `fill` writes them (the SHA-256 overlaps the copy into the
// page cache).
json write_rank_file(const std::string& tmp, const std::string& name, const std::string& run_id, int64_t step,
                     int world_rank, const std::vector<PieceOut>& outs,
                     const std::function<void(size_t, FileSink&)>& fill,
                     const std::vector<const float*>* in_memory = nullptr) {
  json header = json::object();
  header["__metadata__"] = {{"format", kTrainFormat},
                            {"run_id", run_id},
                            {"step", std::to_string(step)},
                            {"rank", std::to_string(world_rank)}};
  json pieces = json::array();
  uint64_t off = 0;
  for (const PieceOut& o : outs) {
    const Parameter& p = *o.p;
    const std::string key = concat(state_kind_name(o.kind), "/", p.name);
    const uint64_t bytes = static_cast<uint64_t>(o.end - o.begin) * 4;
    header[key] = {{"dtype", "F32"}, {"shape", {o.end - o.begin}}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
    pieces.push_back({{"tensor", p.name},
                      {"shape", p.full_shape},
                      {"kind", state_kind_name(o.kind)},
                      {"key", key},
                      {"split_dim", p.split_dim},
                      {"chunks", p.chunks},
                      {"tp", p.split_dim < 0 ? 1 : p.tp_size},
                      {"tp_rank", p.split_dim < 0 ? 0 : p.tp_rank},
                      {"shard_shape", p.shape},
                      {"range", {o.begin, o.end}}});
  }
  std::string htext = header.dump();
  while ((8 + htext.size()) % 8 != 0) htext += ' ';
  std::string sha;
  uint64_t total = 0;
  AtomicWriteOptions wo;
  wo.sync = false;
  wo.direct = true;  // past the page cache: filling new page-cache pages is what writing costs most here
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(htext.size()) >> (8 * i));
  std::thread hasher;
  std::exception_ptr hash_error;
  if (in_memory) {
    hasher = std::thread([&] {
      try {
        Sha256 h;
        h.update(len, 8);
        h.update(htext.data(), htext.size());
        for (size_t i = 0; i < outs.size(); ++i)
          h.update((*in_memory)[i], static_cast<size_t>(outs[i].end - outs[i].begin) * 4);
        sha = h.hex_digest();
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
        sink.write(len, 8);
        sink.write(htext.data(), htext.size());
        for (size_t i = 0; i < outs.size(); ++i) {
          const uint64_t before = sink.bytes_written();
          fill(i, sink);
          TESSERA_CHECK(sink.bytes_written() - before == static_cast<uint64_t>(outs[i].end - outs[i].begin) * 4,
                        "piece ", i, " of ", path, " has the wrong size");
        }
        total = sink.bytes_written();
      },
      wo);
  if (hasher.joinable()) hasher.join();
  if (hash_error) std::rethrow_exception(hash_error);
  fsync_file(path);
  return {{"rank", world_rank}, {"name", name}, {"bytes", total}, {"sha256", sha}, {"pieces", pieces}};
}

// World rank 0's part of a save after every rank's file is written:
// trainer_state.cereal and manifest.json in `tmp` (from the rank files'
// entries, write_rank_file's), each fsynced; returns the manifest's text
// (its SHA-256 goes into the done marker) and adds the bytes to *bytes.
std::string write_state_and_manifest(const std::string& tmp, const std::string& run_id, int64_t step,
                                     const TrainLayout& L, const std::map<std::string, int64_t>& model,
                                     const std::string& trainer_state, std::vector<json> files, uint64_t* bytes) {
  json tensors = json::object(), jfiles = json::array();
  for (json& j : files) {
    for (json& pc : j["pieces"]) {
      const std::string t = pc["tensor"];
      if (!tensors.contains(t)) tensors[t] = {{"shape", pc["shape"]}, {"dtype", "F32"}};
      TESSERA_CHECK(tensors[t]["shape"] == pc["shape"], "ranks disagree on the shape of ", t);
      pc.erase("shape");
    }
    jfiles.push_back(j);
  }
  write_in_temp_dir((fs::path(tmp) / kTrainerStateName).string(), [&](FileSink& sink) { sink.write(trainer_state); });
  *bytes += trainer_state.size();
  json manifest = {
      {"format", kTrainFormat},
      {"version", kTrainVersion},
      {"run_id", run_id},
      {"step", step},
      {"layout",
       {{"tp", L.tp}, {"dp", L.dp}, {"pp", L.pp}, {"zero1", L.zero1}, {"sequence_parallel", L.sequence_parallel}}},
      {"model", model},
      {"trainer_state",
       {{"name", kTrainerStateName}, {"bytes", trainer_state.size()}, {"sha256", sha256_hex(trainer_state)}}},
      {"tensors", tensors},
      {"files", jfiles}};
  std::string mtext = manifest.dump(1);
  write_in_temp_dir((fs::path(tmp) / kTrainManifestName).string(), [&](FileSink& sink) { sink.write(mtext); });
  *bytes += mtext.size();
  return mtext;
}

void remove_checkpoint_dir(const std::string& dir, const std::string& root, int world_rank, int64_t step) {
  // The marker first: a half-removed checkpoint is never taken for a complete one.
  std::error_code ec;
  fs::remove(fs::path(dir) / kDoneMarkerName, ec);
  fsync_dir(dir);
  fault_point("mid_keep", world_rank, step);
  fs::remove_all(dir, ec);
  fsync_dir(root);
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
  }
  return "?";
}

std::string step_dir_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

void fault_point(const char* point, int world_rank, int64_t step) {
  const char* want = std::getenv("TESSERA_CKPT_FAULT");
  if (want == nullptr || std::strcmp(want, point) != 0) return;
  const char* r = std::getenv("TESSERA_CKPT_FAULT_RANK");
  if ((r ? std::atoi(r) : 0) != world_rank) return;
  const char* s = std::getenv("TESSERA_CKPT_FAULT_STEP");
  if (s && std::atoll(s) != step) return;
  std::fprintf(stderr, "tessera: TESSERA_CKPT_FAULT=%s: rank %d kills itself saving step %lld\n", point, world_rank,
               static_cast<long long>(step));
  std::fflush(stderr);
  ::raise(SIGKILL);
}

// ---- save ---------------------------------------------------------------------

SaveResult save_train_checkpoint(collectives::Communicator* world, const std::vector<HeldTensor>& held,
                                 const SaveSpec& spec) {
  const TrainLayout& L = spec.layout;
  const bool lead = spec.world_rank == 0;
  const std::string root = fs::path(spec.root).lexically_normal().string();
  const std::string name = step_dir_name(spec.step);
  const std::string tmp = (fs::path(root) / ("." + name + ".tmp")).string();
  const std::string final_dir = (fs::path(root) / name).string();
  SaveResult result;
  result.dir = final_dir;

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
  // dp_rank-th part of its shard; tensors replicated over TP from TP rank 0.
  std::vector<PieceOut> outs;
  std::vector<const float*> data;
  const bool zero = L.zero1 && L.dp > 1;
  for (const HeldTensor& h : held) {
    const Parameter& p = *h.param;
    if (!h.save || (p.split_dim < 0 && spec.tp_rank != 0)) continue;
    const int64_t n = p.numel();
    int64_t b = zero ? h.moment_begin : n * spec.dp_rank / L.dp;
    int64_t e = zero ? h.moment_end : n * (spec.dp_rank + 1) / L.dp;
    if (b >= e) continue;
    TESSERA_CHECK(b >= h.moment_begin && e <= h.moment_end && h.m && h.v, "moments of ", p.name, " [", b, ", ", e,
                  ") not held by this rank");
    outs.push_back({&p, StateKind::Param, b, e});
    data.push_back(p.value + b);
    outs.push_back({&p, StateKind::ExpAvg, b, e});
    data.push_back(h.m + (b - h.moment_begin));
    outs.push_back({&p, StateKind::ExpAvgSq, b, e});
    data.push_back(h.v + (b - h.moment_begin));
  }

  json entry = {{"rank", spec.world_rank}};
  try {
    const std::string fname = rank_file_name(spec.dp_rank, spec.tp_rank, spec.pp_rank);
    entry = write_rank_file(
        tmp, fname, spec.run_id, spec.step, spec.world_rank, outs,
        [&](size_t i, FileSink& sink) {
          if (i == outs.size() / 2) fault_point("mid_file", spec.world_rank, spec.step);
          sink.write(data[i], static_cast<size_t>(outs[i].end - outs[i].begin) * 4);
        },
        &data);
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

  // 4. Rank 0: trainer state, manifest, rename, marker, --keep.
  err = first_error;
  if (lead && err.empty()) {
    try {
      std::vector<json> files;
      for (json& j : parsed)
        if (j.contains("name")) files.push_back(j);
      const std::string mtext = write_state_and_manifest(tmp, spec.run_id, spec.step, L, spec.model, spec.trainer_state,
                                                         files, &result.bytes);
      fsync_dir(tmp);  // every rank's file entry, before the rename makes them a checkpoint
      fault_point("before_rename", spec.world_rank, spec.step);
      const std::string old = (fs::path(root) / ("." + name + ".old")).string();
      std::error_code ec;
      fs::remove_all(old, ec);
      if (fs::exists(final_dir)) fs::rename(final_dir, old);  // a checkpoint of the same step being replaced
      fs::rename(tmp, final_dir);
      fsync_dir(root);
      fault_point("before_marker", spec.world_rank, spec.step);
      json marker = {{"manifest_sha256", sha256_hex(mtext)}, {"step", spec.step}};
      write_file_atomic((fs::path(final_dir) / kDoneMarkerName).string(), marker.dump() + "\n");
      fault_point("before_keep", spec.world_rank, spec.step);
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
      if (!fs::exists(fs::path(final_dir) / kDoneMarkerName)) fs::remove_all(tmp, ec);
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

bool is_train_checkpoint(const std::string& dir) {
  std::error_code ec;
  const fs::path m = fs::path(dir) / kTrainManifestName;
  if (!fs::is_regular_file(m, ec)) return false;
  try {
    json j = json::parse(read_regular_file(m.string(), kMaxManifestBytes));
    return j.is_object() && j.value("format", "") == kTrainFormat;
  } catch (const std::exception&) {
    return false;
  }
}

// ---- load ---------------------------------------------------------------------

TrainCheckpoint::~TrainCheckpoint() = default;

namespace {

template <class T>
T field(const json& j, const char* key, const std::string& ctx) {
  if (!j.is_object() || !j.contains(key)) throw FormatError(concat(ctx, ": field '", key, "' is missing"));
  const json& v = j.at(key);
  bool ok;
  if constexpr (std::is_same_v<T, bool>)
    ok = v.is_boolean();
  else if constexpr (std::is_integral_v<T>)
    ok = v.is_number_integer();
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

TrainCheckpoint::TrainCheckpoint(const std::string& dir_in) {
  try {
    open(dir_in);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    throw FormatError(concat("checkpoint ", dir_in, ": manifest or marker: ", e.what()));
  }
}

void TrainCheckpoint::open(const std::string& dir_in) {
  dir_ = fs::path(dir_in).lexically_normal().string();
  if (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  const std::string w = where();
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) throw FormatError(concat(w, ": not a directory"));
  const std::string marker_path = (fs::path(dir_) / kDoneMarkerName).string();
  if (!fs::exists(marker_path, ec))
    throw FormatError(
        concat(w, ": no done marker (", kDoneMarkerName, "): the save did not finish, so it is never loaded"));
  json marker = read_json_file(marker_path, w);
  const std::string mpath = (fs::path(dir_) / kTrainManifestName).string();
  const std::string mtext = read_regular_file(mpath, kMaxManifestBytes);
  const std::string mhash = sha256_hex(mtext);
  if (!marker.is_object() || marker.value("manifest_sha256", "") != mhash)
    throw FormatError(concat(w, ": ", mpath, " does not match the done marker (SHA-256 ", mhash, ", the marker says ",
                             marker.is_object() ? marker.value("manifest_sha256", "(none)") : "(not an object)",
                             "): the manifest was changed after the save"));
  json m;
  try {
    m = json::parse(mtext);
  } catch (const json::exception& e) {
    throw FormatError(concat(w, ": ", mpath, " is not valid JSON (", e.what(), ")"));
  }
  const std::string mc = concat(w, ": ", kTrainManifestName);
  if (!m.is_object() || m.value("format", "") != kTrainFormat)
    throw FormatError(concat(mc, ": not a ", kTrainFormat, " manifest"));
  if (field<int>(m, "version", mc) != kTrainVersion)
    throw FormatError(
        concat(mc, ": version ", m["version"].dump(), " is not supported (this build reads ", kTrainVersion, ")"));
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
  if (layout_.tp < 1 || layout_.dp < 1 || layout_.pp < 1 || layout_.tp > (1 << 20) || layout_.dp > (1 << 20) ||
      layout_.pp > (1 << 20))
    throw FormatError(concat(lc, ": tp, dp and pp must be in [1, 2^20]"));
  if (m.contains("model") && m["model"].is_object())
    for (auto it = m["model"].begin(); it != m["model"].end(); ++it)
      if (it->is_number_integer()) model_[it.key()] = it->get<int64_t>();

  const json& st = m.contains("trainer_state") ? m["trainer_state"] : json();
  state_file_.name = field<std::string>(st, "name", mc + " trainer_state");
  state_file_.bytes = field<uint64_t>(st, "bytes", mc + " trainer_state");
  state_file_.sha256 = field<std::string>(st, "sha256", mc + " trainer_state");
  if (!safe_file_name(state_file_.name) || !is_hex64(state_file_.sha256))
    throw FormatError(concat(mc, ": trainer_state has a bad name or sha256"));

  if (!m.contains("tensors") || !m["tensors"].is_object())
    throw FormatError(concat(mc, ": 'tensors' must be an object"));
  for (auto it = m["tensors"].begin(); it != m["tensors"].end(); ++it) {
    const std::string tc = concat(mc, ": tensor ", it.key());
    if (field<std::string>(*it, "dtype", tc) != "F32") throw FormatError(concat(tc, ": dtype must be F32"));
    TensorInfo ti;
    ti.shape = shape_field(*it, "shape", tc);
    checked_numel(ti.shape, tc);
    tensors_[it.key()] = ti;
  }

  if (!m.contains("files") || !m["files"].is_array()) throw FormatError(concat(mc, ": 'files' must be an array"));
  std::set<std::string> names{state_file_.name, kTrainManifestName, kDoneMarkerName};
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
                               real < fi.bytes ? " (truncated)" : ""));
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
      else
        throw FormatError(concat(pcx, ": unknown kind '", kind, "'"));
      pc.key = field<std::string>(pj, "key", pcx);
      if (!keys.insert(pc.key).second) throw FormatError(concat(pcx, ": key ", pc.key, " twice in the file"));
      pc.split_dim = field<int>(pj, "split_dim", pcx);
      pc.chunks = field<int>(pj, "chunks", pcx);
      pc.tp = field<int>(pj, "tp", pcx);
      pc.tp_rank = field<int>(pj, "tp_rank", pcx);
      pc.shard_shape = shape_field(pj, "shard_shape", pcx);
      const Shape& full = t->second.shape;
      if (pc.split_dim < -1 || pc.split_dim >= static_cast<int>(full.size()))
        throw FormatError(concat(pcx, ": split_dim ", pc.split_dim, " is not a dimension of ", shape_text(full)));
      if (pc.chunks < 1 || pc.chunks > kMaxChunks || (pc.split_dim >= 0 && full[pc.split_dim] % pc.chunks != 0))
        throw FormatError(
            concat(pcx, ": chunks ", pc.chunks, " does not divide dimension ", pc.split_dim, " of ", shape_text(full)));
      if (pc.tp < 1 || pc.tp > (1 << 20) || pc.tp_rank < 0 || pc.tp_rank >= pc.tp)
        throw FormatError(concat(pcx, ": tp_rank ", pc.tp_rank, " of tp ", pc.tp, " is impossible"));
      const Parameter d = descriptor(pc.tensor, full, pc.split_dim, pc.chunks, pc.tp, pc.tp_rank);
      if (d.shape != pc.shard_shape)
        throw FormatError(concat(pcx, ": shard_shape ", shape_text(pc.shard_shape), " is not TP rank ", pc.tp_rank,
                                 " of ", pc.tp, "'s shard of ", shape_text(full), " (", shape_text(d.shape), ")"));
      if (!pj.contains("range") || !pj["range"].is_array() || pj["range"].size() != 2 ||
          !pj["range"][0].is_number_integer() || !pj["range"][1].is_number_integer())
        throw FormatError(concat(pcx, ": 'range' must be [begin, end]"));
      pc.begin = pj["range"][0].get<int64_t>();
      pc.end = pj["range"][1].get<int64_t>();
      if (pc.begin < 0 || pc.end <= pc.begin || pc.end > d.numel())
        throw FormatError(
            concat(pcx, ": range [", pc.begin, ", ", pc.end, ") is not inside its shard of ", d.numel(), " elements"));
      piece_bytes += static_cast<uint64_t>(pc.end - pc.begin) * 4;
      if (piece_bytes > fi.bytes)
        throw FormatError(concat(pcx, ": the pieces need more than the file's ", fi.bytes, " bytes"));
      by_tensor_[{pc.tensor, static_cast<int>(pc.kind)}].push_back(pieces_.size());
      pieces_.push_back(pc);
    }
  }

  // Every element of every (tensor, kind) in exactly one piece.
  const bool moments = has_kind(StateKind::ExpAvg) || has_kind(StateKind::ExpAvgSq);
  for (const auto& [tname, ti] : tensors_) {
    const int64_t numel = checked_numel(ti.shape, mc);
    for (StateKind k : {StateKind::Param, StateKind::ExpAvg, StateKind::ExpAvgSq}) {
      if (k != StateKind::Param && !moments) continue;
      auto it = by_tensor_.find({tname, static_cast<int>(k)});
      const std::string tk = concat(w, ": tensor ", tname, " (", state_kind_name(k), ")");
      if (it == by_tensor_.end()) {
        if (numel == 0) continue;
        throw FormatError(concat(tk, " is in no file"));
      }
      int64_t held = 0;
      for (size_t pi : it->second) held += pieces_[pi].end - pieces_[pi].begin;
      if (held < numel)
        throw FormatError(
            concat(tk, ": its pieces hold ", held, " elements, the tensor has ", numel, " (elements are missing)"));
      struct Iv {
        int64_t begin, n;
        size_t piece;
      };
      std::vector<Iv> ivs;
      for (size_t pi : it->second) {
        const PieceInfo& pc = pieces_[pi];
        const Parameter d = descriptor(tname, ti.shape, pc.split_dim, pc.chunks, pc.tp, pc.tp_rank);
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
      if (next != numel) throw FormatError(concat(tk, ": elements [", next, ", ", numel, ") are in no file"));
    }
  }
}

bool TrainCheckpoint::has_kind(StateKind k) const {
  for (const PieceInfo& p : pieces_)
    if (p.kind == k) return true;
  return false;
}

std::string TrainCheckpoint::read_trainer_state() const {
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

const SafetensorsReader& TrainCheckpoint::reader(size_t i) const {
  auto it = readers_.find(i);
  if (it != readers_.end()) return *it->second;
  auto r = std::make_unique<SafetensorsReader>((fs::path(dir_) / files_[i].name).string());
  return *readers_.emplace(i, std::move(r)).first->second;
}

void TrainCheckpoint::verify_file(size_t i) const {
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
                             "; it holds tensors ", tensors_in()));
  }
  const SafetensorsReader* rp;
  try {
    rp = &reader(i);
  } catch (const FormatError& e) {
    throw FormatError(concat(w, ": ", e.what()));
  }
  const SafetensorsReader& r = *rp;
  const auto& md = r.metadata();
  auto meta = [&](const char* k) { return md.count(k) ? md.at(k) : std::string(); };
  if (meta("run_id") != run_id_ || meta("step") != std::to_string(step_))
    throw FormatError(concat(w, ": ", path, " is from run ", meta("run_id"), " step ", meta("step"),
                             ", this checkpoint is run ", run_id_, " step ", step_));
  size_t count = 0;
  for (const PieceInfo& p : pieces_) {
    if (p.file != i) continue;
    ++count;
    if (!r.contains(p.key))
      throw FormatError(concat(w, ": ", path, " lacks ", p.key, " (tensor ", p.tensor, ") that the manifest lists"));
    const SafetensorsEntry& e = r.entry(p.key);
    if (e.dtype != DType::F32 || e.shape != Shape{p.end - p.begin})
      throw FormatError(concat(w, ": ", path, ": ", p.key, " (tensor ", p.tensor, ") is ", dtype_name(e.dtype), " ",
                               shape_text(e.shape), ", the manifest says F32 [", p.end - p.begin, "]"));
  }
  if (r.entries().size() != count)
    throw FormatError(concat(w, ": ", path, " holds ", r.entries().size(), " tensors, the manifest lists ", count));
}

uint64_t TrainCheckpoint::verify_all() const {
  read_trainer_state();
  uint64_t bytes = state_file_.bytes;
  for (size_t i = 0; i < files_.size(); ++i) {
    verify_file(i);
    bytes += files_[i].bytes;
  }
  return bytes;
}

void TrainCheckpoint::verify_collective(collectives::Communicator* world) const {
  const int rank = world ? world->rank() : 0, size = world ? world->size() : 1;
  std::string err;
  try {
    for (size_t i = static_cast<size_t>(rank); i < files_.size(); i += static_cast<size_t>(size)) verify_file(i);
  } catch (const FormatError& e) {
    err = e.what();
  }
  agree(world, err, true);
}

void TrainCheckpoint::read(const Parameter& dest, StateKind kind, int64_t begin, int64_t end, float* dst) const {
  auto t = tensors_.find(dest.name);
  if (t == tensors_.end()) throw FormatError(concat(where(), " has no tensor ", dest.name));
  if (t->second.shape != dest.full_shape)
    throw InvalidArgument(concat(where(), ": tensor ", dest.name, " has shape ", shape_text(t->second.shape),
                                 " in the checkpoint, the model's is ", shape_text(dest.full_shape)));
  auto it = by_tensor_.find({dest.name, static_cast<int>(kind)});
  if (begin >= end) return;
  struct Run {
    int64_t full, off, n;
  };
  std::vector<Run> want;
  int64_t need = 0;
  shard_runs_in(dest, begin, end, [&](int64_t local, int64_t full, int64_t n) {
    if (full < 0) {
      std::fill_n(dst + (local - begin), n, 0.f);
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
    const Parameter src = descriptor(dest.name, dest.full_shape, pc.split_dim, pc.chunks, pc.tp, pc.tp_rank);
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
        r.read_bytes(ent, static_cast<uint64_t>(y.off + (s - y.full)) * 4, static_cast<uint64_t>(e - s) * 4,
                     dst + x.off + (s - x.full));
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

void consolidate_train_checkpoint(const std::string& dir, const std::string& out_file, bool with_optimizer) {
  TESSERA_ARG_CHECK(!fs::exists(out_file), "--out ", out_file, " exists (not overwritten)");
  TrainCheckpoint ck(dir);
  const Gpt2Config c = train_checkpoint_gpt2_config(ck);
  ck.verify_all();
  TESSERA_ARG_CHECK(!with_optimizer || ck.has_kind(StateKind::ExpAvg), "checkpoint ", ck.dir(),
                    " holds no optimizer state");
  // The weights in GPT-2's order, then (with_optimizer) each tensor's m and v.
  struct Item {
    Parameter full;  // the whole tensor, unsharded
    StateKind kind;
  };
  std::vector<TensorSpec> specs;
  std::vector<Item> items;
  const std::vector<std::string> names = gpt2_tensor_names(c);
  for (const std::string& n : names) {
    auto it = ck.tensors().find(n);
    if (it == ck.tensors().end()) throw FormatError(concat("checkpoint ", ck.dir(), " lacks tensor ", n));
    const Shape& shape = it->second.shape;
    const Shape want = gpt2_tensor_shape(c, n);
    if (shape != want)
      throw FormatError(concat("checkpoint ", ck.dir(), ": tensor ", n, " has shape ", shape_str(shape), ", ",
                               gpt2_config_str(c), " has ", shape_str(want)));
    specs.push_back({n, DType::F32, shape});
    items.push_back({descriptor(n, shape, -1, 1, 1, 0), StateKind::Param});
  }
  if (with_optimizer)
    for (size_t i = 0; i < names.size(); ++i)
      for (StateKind k : {StateKind::ExpAvg, StateKind::ExpAvgSq}) {
        specs.push_back({concat("optimizer.", state_kind_name(k), ".", names[i]), DType::F32, specs[i].shape});
        items.push_back({items[i].full, k});
      }
  // The metadata write_gpt2_safetensors gives a model file.
  const std::map<std::string, std::string> md{{"producer", "tessera ckpt consolidate"},
                                              {"step", std::to_string(ck.step())},
                                              {"run_id", ck.run_id()},
                                              {"format", "pt"},
                                              {"vocab_size", std::to_string(c.vocab)},
                                              {"n_positions", std::to_string(c.n_positions)},
                                              {"n_embd", std::to_string(c.hidden)},
                                              {"n_layer", std::to_string(c.layers)},
                                              {"n_head", std::to_string(c.heads)}};
  const std::string header = safetensors_header(specs, md);
  // Streamed through one reused buffer, so memory stays that buffer's size
  // whatever the model's (a whole-model copy was the model's size).
  constexpr int64_t kChunk = int64_t{4} << 20;  // elements: 16 MiB
  std::vector<float> buf;
  AtomicWriteOptions wo;
  wo.direct = true;  // past the page cache, as save and the shard tools write
  write_file_atomic(
      out_file,
      [&](FileSink& out) {
        out.write(header.data(), header.size());
        for (const Item& item : items) {
          const int64_t n = item.full.numel();
          if (buf.empty() && n > 0) buf.resize(static_cast<size_t>(std::min(n, kChunk)));
          for (int64_t b = 0; b < n; b += kChunk) {
            const int64_t e = std::min(n, b + kChunk);
            if (static_cast<int64_t>(buf.size()) < e - b) buf.resize(static_cast<size_t>(e - b));
            ck.read(item.full, item.kind, b, e, buf.data());
            out.write(buf.data(), sizeof(float) * static_cast<size_t>(e - b));
          }
        }
      },
      wo);
}

}  // namespace tessera::parallel::checkpoint

namespace tessera::parallel::checkpoint {

std::optional<std::string> resolve_train_checkpoint(const std::string& path) {
  if (is_train_checkpoint(path)) return path;
  std::error_code ec;
  if (!fs::is_directory(path, ec) || fs::exists(fs::path(path) / kTrainManifestName, ec)) return std::nullopt;
  return latest_checkpoint(path);
}

Gpt2Config train_checkpoint_gpt2_config(const TrainCheckpoint& ck) {
  const std::string w = concat("checkpoint ", ck.dir());
  auto cfg = [&](const char* k) {
    auto it = ck.model().find(k);
    if (it == ck.model().end()) throw FormatError(concat(w, ": manifest model lacks ", k));
    return it->second;
  };
  const Gpt2Config c{cfg("vocab_size"), cfg("n_positions"), cfg("n_embd"), cfg("n_layer"), cfg("n_head")};
  if (c.vocab <= 0 || c.n_positions <= 0 || c.hidden <= 0 || c.layers <= 0 || c.heads <= 0 || c.hidden % c.heads != 0)
    throw FormatError(concat(w, ": manifest model is not a GPT-2 config (", gpt2_config_str(c), ")"));
  const std::vector<std::string> names = gpt2_tensor_names(c);
  for (const auto& [n, t] : ck.tensors())
    if (std::find(names.begin(), names.end(), n) == names.end())
      throw FormatError(concat(w, ": tensor ", n, " is not a GPT-2 tensor of ", gpt2_config_str(c)));
  for (const Parameter& p : gpt2_tp_parameters(c, 1, 0)) {
    auto it = ck.tensors().find(p.name);
    if (it == ck.tensors().end()) throw FormatError(concat(w, " lacks tensor ", p.name));
    if (it->second.shape != p.full_shape)
      throw FormatError(concat(w, ": tensor ", p.name, " has shape ", shape_text(it->second.shape), ", GPT-2 ",
                               gpt2_config_str(c), " has ", shape_text(p.full_shape)));
  }
  return c;
}

uint64_t relayout_train_checkpoint(const std::string& src, const std::string& dir, const RelayoutOptions& o) {
  const TrainLayout& L = o.layout;
  TrainCheckpoint ck(src);
  const Gpt2Config c = train_checkpoint_gpt2_config(ck);
  TESSERA_ARG_CHECK(L.tp >= 1 && L.dp >= 1 && L.pp >= 1, "--tp, --pp and --dp must be >= 1");
  TESSERA_ARG_CHECK(c.heads % L.tp == 0, "--tp ", L.tp, " does not divide the ", c.heads, " attention heads of ",
                    ck.dir(), " (attention is split by heads)");
  TESSERA_ARG_CHECK(c.layers >= L.pp, "--pp ", L.pp, " exceeds the ", c.layers, " layers of ", ck.dir());
  const std::vector<int> part = gpt2_stages(c, L.pp, o.stages);
  TESSERA_ARG_CHECK(ck.has_kind(StateKind::ExpAvg) && ck.has_kind(StateKind::ExpAvgSq), "checkpoint ", ck.dir(),
                    " holds no optimizer state");
  // Every hash before a byte is used (as a resume does).
  const std::string state = ck.read_trainer_state();
  ck.verify_all();
  std::vector<std::vector<Parameter>> ranks;
  ranks.reserve(static_cast<size_t>(L.tp));
  for (int r = 0; r < L.tp; ++r) ranks.push_back(gpt2_tp_parameters(c, L.tp, r));

  constexpr int64_t kChunk = int64_t{1} << 21;  // elements per read (8 MiB)
  std::vector<float> buf(static_cast<size_t>(kChunk));
  std::vector<std::pair<std::string, std::string>> nonfinite;  // (tensor, detail)
  std::vector<json> files;
  uint64_t bytes = 0;
  for (int s = 0; s < L.pp; ++s) {
    for (int d = 0; d < L.dp; ++d) {
      for (int r = 0; r < L.tp; ++r) {
        // What save writes under plain DP: DP rank d the d-th of dp equal
        // ranges of its TP shard of every tensor of its stage (values, m, v);
        // tensors replicated over TP from TP rank 0 only.
        std::vector<PieceOut> outs;
        for (const Parameter& p : ranks[static_cast<size_t>(r)]) {
          if (gpt2_pp_stage(part, p.name) != s || (p.split_dim < 0 && r != 0)) continue;
          const int64_t n = p.numel(), b = n * d / L.dp, e = n * (d + 1) / L.dp;
          if (b >= e) continue;
          for (StateKind k : {StateKind::Param, StateKind::ExpAvg, StateKind::ExpAvgSq}) outs.push_back({&p, k, b, e});
        }
        const int world_rank = r + L.tp * (d + L.dp * s);
        json entry = write_rank_file(
            dir, rank_file_name(d, r, s), ck.run_id(), ck.step(), world_rank, outs, [&](size_t i, FileSink& sink) {
              const PieceOut& po = outs[i];
              for (int64_t b = po.begin; b < po.end; b += kChunk) {
                const int64_t e = std::min(po.end, b + kChunk);
                ck.read(*po.p, po.kind, b, e, buf.data());
                if (po.kind == StateKind::Param && !o.allow_nonfinite) {
                  int64_t count = 0, first = -1;
                  const char* kind = "";
                  scan_nonfinite(buf.data(), DType::F32, e - b, &count, &first, &kind);
                  if (count > 0)
                    nonfinite.emplace_back(po.p->name,
                                           concat(count, " non-finite value", count == 1 ? "" : "s", " (", kind,
                                                  ") in shard elements [", b, ", ", e, ") of tp rank ", r));
                }
                sink.write(buf.data(), static_cast<size_t>(e - b) * 4);
              }
            });
        bytes += entry["bytes"].get<uint64_t>();
        files.push_back(std::move(entry));
      }
    }
  }
  if (!nonfinite.empty()) {
    std::string msg = concat("checkpoint ", ck.dir(), ": non-finite weights:");
    for (const auto& [t, what] : nonfinite) msg += concat("\n  tensor '", t, "': ", what);
    throw FormatError(msg + "\n(pass --allow-nonfinite to load them anyway)");
  }
  const std::string mtext = write_state_and_manifest(dir, ck.run_id(), ck.step(), L, ck.model(),
                                                     o.trainer_state.empty() ? state : o.trainer_state, files, &bytes);
  fsync_dir(dir);
  const json marker = {{"manifest_sha256", sha256_hex(mtext)}, {"step", ck.step()}};
  write_file_atomic((fs::path(dir) / kDoneMarkerName).string(), marker.dump() + "\n");
  return bytes;
}

}  // namespace tessera::parallel::checkpoint
