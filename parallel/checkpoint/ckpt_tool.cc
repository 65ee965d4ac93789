#include "parallel/checkpoint/ckpt_tool.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "parallel/checkpoint/background_writer.h"
#include "parallel/checkpoint/gpt2_layout.h"
#include "parallel/checkpoint/train_ckpt.h"
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
  const fs::path& target() const { return target_; }
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

// fsync of a directory (what a rename into it, or of it, needs to be durable).
void fsync_path(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(detail::concat(dir, ": cannot open the directory to fsync it: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(detail::concat(dir, ": cannot fsync the directory: ", std::strerror(err)));
}

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
    int64_t b = std::min(fb, p.tp_part() * lb), e = std::min(fb, (p.tp_part() + 1) * lb);
    r.push_back({k * fb + b, k * fb + e});
  }
  return r;
}

// ---- streaming -----------------------------------------------------------------
// Every command streams: a tensor is read in pieces of whole rows of at most
// kPieceBytes (one piece when it is smaller), each piece goes straight to the
// output files' buffers (BackgroundWriter), and nothing is held per model.
// Bytes are copied as stored: shards keep the source's dtype, so no
// conversion happens anywhere (bit for bit, NaN payloads included).
constexpr uint64_t kPieceBytes = uint64_t{8} << 20;
constexpr size_t kOutBufferBytes = size_t{2} << 20;  // one O_DIRECT write each

// Output files are written past the page cache (AtomicWriteOptions::direct):
// filling new page-cache pages is what writing costs most on these VMs.
AtomicWriteOptions direct_io() {
  AtomicWriteOptions o;
  o.direct = true;
  return o;
}

// Elements per piece of a tensor: whole rows (dim 0) up to kPieceBytes, at least one row.
int64_t piece_elems(const Shape& full, DType dtype) {
  const int64_t numel = shape_numel(full);
  const int64_t row = full.size() >= 2 && full[0] > 0 ? numel / full[0] : 1;
  const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes / (row * dtype_size(dtype))));
  return std::max<int64_t>(1, rows * row);
}

// Non-finite values found while streaming, by (file, tensor), reported as
// check_finite does once the pass is over (before anything is committed).
class NonFiniteLog {
 public:
  void scan(const std::string& file, const std::string& name, const void* data, DType dtype, int64_t n, int64_t base) {
    int64_t count = 0, first = -1;
    const char* kind = "";
    scan_nonfinite(data, dtype, n, &count, &first, &kind);
    if (!count) return;
    auto [it, fresh] = index_.emplace(std::make_pair(file, name), hits_.size());
    if (fresh) hits_.push_back({file, name, 0, base + first, kind});
    hits_[it->second].count += count;
  }
  void throw_if_any(const std::string& top) const {
    if (hits_.empty()) return;
    std::string msg = top + ": non-finite weights:";
    for (const Hit& h : hits_)
      msg += detail::concat("\n  ", h.file, ": tensor '", h.name, "' holds ", h.count, " non-finite value",
                            h.count == 1 ? "" : "s", " (first at flat index ", h.first, ": ", h.kind, ")");
    msg += "\n(pass --allow-nonfinite to load them anyway)";
    throw FormatError(msg);
  }

 private:
  struct Hit {
    std::string file, name;
    int64_t count, first;
    const char* kind;
  };
  std::vector<Hit> hits_;
  std::map<std::pair<std::string, std::string>, size_t> index_;
};

// Full GPT-2 tensors (the layout's order, gpt2_tp_parameters), read as flat
// element ranges of the row-major full tensor, in its stored dtype.
class FullReader {
 public:
  virtual ~FullReader() = default;
  virtual void read(size_t tensor, int64_t begin, int64_t count, uint8_t* dst) = 0;
};

// A Hugging Face file or sharded directory: one pread per piece.
class HfReader : public FullReader {
 public:
  HfReader(const TensorSource& src, const std::vector<parallel::layers::Parameter>& layout, NonFiniteLog* nf)
      : src_(src), nf_(nf) {
    for (const parallel::layers::Parameter& p : layout) {
      stored_.push_back(gpt2_stored_name(src, p.name));
      dtypes_.push_back(src.entry(stored_.back()).dtype);
    }
  }
  const std::vector<DType>& dtypes() const { return dtypes_; }
  void read(size_t i, int64_t begin, int64_t count, uint8_t* dst) override {
    const uint64_t es = dtype_size(dtypes_[i]);
    src_.read_bytes(stored_[i], static_cast<uint64_t>(begin) * es, static_cast<uint64_t>(count) * es, dst);
    if (nf_) nf_->scan(src_.file_of(stored_[i]), stored_[i], dst, dtypes_[i], count, begin);
  }

 private:
  const TensorSource& src_;
  NonFiniteLog* nf_;
  std::vector<std::string> stored_;
  std::vector<DType> dtypes_;
};

// The weights of a training checkpoint (train_gpt --save), every file's
// hash checked first: pieces gathered from whichever rank files hold them
// (TrainCheckpoint::read, pread). Always F32.
class TrainReader : public FullReader {
 public:
  TrainReader(const TrainCheckpoint& ck, const std::vector<parallel::layers::Parameter>& layout, NonFiniteLog* nf)
      : ck_(ck), nf_(nf) {
    for (const parallel::layers::Parameter& p : layout)
      full_.push_back(parallel::layers::make_parameter(p.name, p.full_shape, -1, 1, 1, 0, parallel::layers::Init::Zeros,
                                                       0.f, false));
  }
  void read(size_t i, int64_t begin, int64_t count, uint8_t* dst) override {
    float* f = reinterpret_cast<float*>(dst);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast): F32 bytes
    ck_.read(full_[i], StateKind::Param, begin, begin + count, f);
    if (nf_) nf_->scan(ck_.dir(), full_[i].name, dst, DType::F32, count, begin);
  }

 private:
  const TrainCheckpoint& ck_;
  NonFiniteLog* nf_;
  std::vector<parallel::layers::Parameter> full_;
};

// Calls fn(local, full, count) for the parts of p's shard runs that fall in
// full elements [begin, end) (padding runs are skipped), in local order.
template <typename Fn>
void clipped_runs(const parallel::layers::Parameter& p, int64_t begin, int64_t end, Fn fn) {
  parallel::layers::for_each_shard_run(p, [&](int64_t local, int64_t full, int64_t count) {
    if (full < 0) return;
    const int64_t a = std::max(full, begin), b = std::min(full + count, end);
    if (a < b) fn(local + (a - full), a, b - a);
  });
}

// The SHA-256 of an input file, computed from the bytes a streaming pass
// reads anyway (saw()), so the input is read once: every pass reads each
// shard file front to back (tensors in file order, each in ascending
// pieces); bytes it skips (the header, vocabulary padding) are read here to
// fill the gap, and finish() reads whatever the pass did not reach. A read
// behind what is hashed already is not hashed again.
class StreamedHash {
 public:
  explicit StreamedHash(std::string path) : path_(std::move(path)), fd_(open_regular_file(path_, &size_)) {}
  ~StreamedHash() { ::close(fd_); }
  StreamedHash(const StreamedHash&) = delete;
  StreamedHash& operator=(const StreamedHash&) = delete;
  // Bytes [at, at + n) of the file, just read into p.
  void saw(uint64_t at, const void* p, uint64_t n) {
    if (at > done_) fill_to(at);
    if (at + n <= done_) return;
    const uint64_t skip = done_ - at;
    sha_.update(static_cast<const uint8_t*>(p) + skip, n - skip);
    done_ = at + n;
  }
  std::string finish() {
    fill_to(size_);
    return sha_.hex_digest();
  }

 private:
  void fill_to(uint64_t to) {
    std::vector<uint8_t> buf(static_cast<size_t>(std::min<uint64_t>(to - done_, uint64_t{1} << 20)));
    while (done_ < to) {
      const ssize_t n = ::pread(fd_, buf.data(), std::min<uint64_t>(buf.size(), to - done_), static_cast<off_t>(done_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw FormatError(detail::concat(path_, ": cannot read: ", std::strerror(errno)));
      if (n == 0) throw FormatError(detail::concat(path_, ": file ended at byte ", done_, " (it shrank)"));
      sha_.update(buf.data(), static_cast<size_t>(n));
      done_ += static_cast<uint64_t>(n);
    }
  }
  std::string path_;
  uint64_t size_ = 0, done_ = 0;
  int fd_;
  Sha256 sha_;
};

// A shard directory whose manifest, sizes and headers were checked
// (open_shard_dir) before any tensor byte is read, and whose hashes were
// checked too, or are checked by `hashes` while the bytes are streamed
// (then finish_hashes before anything is committed). The manifest itself is
// not kept: nlohmann::json's destructor allocates (std::bad_alloc could
// escape this struct's noexcept destructor).
struct ShardDir {
  std::string dir, mpath;
  std::vector<std::string> paths, sha256;             // [pp_rank * tp + tp_rank]: the manifest's hashes
  std::vector<std::unique_ptr<StreamedHash>> hashes;  // empty when checked up front
  Gpt2Config config;
  int tp = 1, pp = 1;
  std::vector<int> part;
  std::vector<std::vector<parallel::layers::Parameter>> ranks;  // [tp_rank][tensor]
  std::vector<std::unique_ptr<SafetensorsReader>> readers;      // [pp_rank * tp + tp_rank]
  std::vector<DType> dtypes;                                    // per tensor
  std::vector<int> stage;                                       // per tensor
};

// Gathers full pieces from the TP ranks' files of the tensor's stage: per
// rank one pread of the local span the piece needs, then the runs copied
// into place. Replicated tensors are read from tp rank 0 and compared with
// every other rank's bytes.
class ShardDirReader : public FullReader {
 public:
  ShardDirReader(const ShardDir& sd, NonFiniteLog* nf) : sd_(sd), nf_(nf), scratch_(kPieceBytes) {}
  void read(size_t i, int64_t begin, int64_t count, uint8_t* dst) override {
    const DType dt = sd_.dtypes[i];
    const uint64_t es = dtype_size(dt);
    const int64_t end = begin + count;
    for (int r = 0; r < sd_.tp; ++r) {
      const parallel::layers::Parameter& p = sd_.ranks[static_cast<size_t>(r)][i];
      const SafetensorsReader& rd = *sd_.readers[static_cast<size_t>(sd_.stage[i]) * sd_.tp + r];  // file f below
      const SafetensorsEntry& e = rd.entry(p.name);
      const size_t f = static_cast<size_t>(sd_.stage[i]) * sd_.tp + r;
      if (p.split_dim < 0) {
        uint8_t* to = r == 0 ? dst : buffer(static_cast<uint64_t>(count) * es);
        rd.read_bytes(e, static_cast<uint64_t>(begin) * es, static_cast<uint64_t>(count) * es, to);
        saw(f, rd, e, static_cast<uint64_t>(begin) * es, to, static_cast<uint64_t>(count) * es);
        if (r == 0 && nf_) nf_->scan(rd.path(), p.name, dst, dt, count, begin);
        if (r > 0 && std::memcmp(to, dst, static_cast<size_t>(count) * es) != 0)
          throw FormatError(detail::concat(rd.path(), ": replicated tensor ", p.name, " differs from tp rank 0's"));
        continue;
      }
      int64_t lo = INT64_MAX, hi = -1;
      clipped_runs(p, begin, end, [&](int64_t local, int64_t, int64_t n) {
        lo = std::min(lo, local);
        hi = std::max(hi, local + n);
      });
      if (hi < 0) continue;
      uint8_t* span = buffer(static_cast<uint64_t>(hi - lo) * es);
      rd.read_bytes(e, static_cast<uint64_t>(lo) * es, static_cast<uint64_t>(hi - lo) * es, span);
      saw(f, rd, e, static_cast<uint64_t>(lo) * es, span, static_cast<uint64_t>(hi - lo) * es);
      if (nf_) nf_->scan(rd.path(), p.name, span, dt, hi - lo, lo);
      clipped_runs(p, begin, end, [&](int64_t local, int64_t full, int64_t n) {
        std::memcpy(dst + static_cast<uint64_t>(full - begin) * es, span + static_cast<uint64_t>(local - lo) * es,
                    static_cast<size_t>(n) * es);
      });
    }
  }

 private:
  void saw(size_t f, const SafetensorsReader& rd, const SafetensorsEntry& e, uint64_t off, const uint8_t* p,
           uint64_t n) {
    if (!sd_.hashes.empty()) sd_.hashes[f]->saw(8 + rd.header_size() + e.begin + off, p, n);
  }
  uint8_t* buffer(uint64_t bytes) {
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return scratch_.data();
  }
  const ShardDir& sd_;
  NonFiniteLog* nf_;
  std::vector<uint8_t> scratch_;
};

// Appends the piece [begin, begin + count) of a full tensor to each TP
// rank's output: the rank's runs inside the piece, and its padding as soon
// as everything before it is written. emitted[r]: local elements written.
void scatter_piece(const std::vector<const parallel::layers::Parameter*>& ps, int64_t begin, int64_t count,
                   const uint8_t* piece, uint64_t es, BackgroundWriter& bw, const std::vector<size_t>& outs,
                   std::vector<int64_t>& emitted) {
  const int64_t end = begin + count;
  for (size_t r = 0; r < ps.size(); ++r) {
    parallel::layers::for_each_shard_run(*ps[r], [&](int64_t local, int64_t full, int64_t n) {
      if (full < 0) {
        if (local == emitted[r]) {
          bw.zeros(outs[r], static_cast<size_t>(n) * es);
          emitted[r] += n;
        }
        return;
      }
      const int64_t a = std::max(full, begin), b = std::min(full + n, end);
      if (a >= b) return;
      TESSERA_CHECK(local + (a - full) == emitted[r], "shard stream out of order for ", ps[r]->name);
      bw.write(outs[r], piece + static_cast<uint64_t>(a - begin) * es, static_cast<size_t>(b - a) * es);
      emitted[r] += b - a;
    });
  }
}

// Writes every (tp, pp) rank's file of the layout into `tmp`, stage by
// stage; the tp files of a stage are written at once (each sequentially),
// so every source piece is read once. Returns the manifest's "files".
json write_rank_files(FullReader& in, const std::vector<DType>& dtypes, int tp, int pp, const std::vector<int>& part,
                      const std::vector<std::vector<parallel::layers::Parameter>>& ranks, const fs::path& tmp,
                      uint64_t* bytes) {
  const size_t n = ranks[0].size();
  std::vector<uint8_t> piece(kPieceBytes);
  json jfiles = json::array();
  for (int s = 0; s < pp; ++s) {
    std::vector<size_t> tensors;
    for (size_t i = 0; i < n; ++i)
      if (gpt2_pp_stage(part, ranks[0][i].name) == s) tensors.push_back(i);
    std::vector<std::string> paths, files, headers;
    std::vector<json> file_tensors;
    for (int r = 0; r < tp; ++r) {
      std::vector<TensorSpec> specs;
      json jt = json::array();
      for (size_t i : tensors) {
        const parallel::layers::Parameter& p = ranks[static_cast<size_t>(r)][i];
        specs.push_back({p.name, dtypes[i], p.shape});
        *bytes += specs.back().nbytes();
        jt.push_back({{"name", p.name},
                      {"dtype", dtype_name(dtypes[i])},
                      {"full_shape", shape_json(p.full_shape)},
                      {"shape", shape_json(p.shape)},
                      {"split_dim", p.split_dim},
                      {"chunks", p.chunks},
                      {"ranges", ranges_json(p)}});
      }
      files.push_back(rank_stem(0, r, s) + ".safetensors");
      paths.push_back((tmp / files.back()).string());
      headers.push_back(safetensors_header(specs, {{"format", "pt"},
                                                   {"tp_rank", std::to_string(r)},
                                                   {"tp_size", std::to_string(tp)},
                                                   {"pp_rank", std::to_string(s)},
                                                   {"pp_size", std::to_string(pp)}}));
      file_tensors.push_back(std::move(jt));
    }
    std::vector<std::string> shas;
    write_files_atomic(
        paths,
        [&](const std::vector<FileSink*>& sinks) {
          BackgroundWriter bw(
              static_cast<size_t>(tp) + 3,
              std::clamp<size_t>((size_t{64} << 20) / static_cast<size_t>(tp), size_t{1} << 20, kOutBufferBytes));
          std::vector<size_t> outs;
          for (int r = 0; r < tp; ++r) {
            outs.push_back(bw.add(sinks[static_cast<size_t>(r)], true));
            bw.write(outs.back(), headers[static_cast<size_t>(r)].data(), headers[static_cast<size_t>(r)].size());
          }
          for (size_t i : tensors) {
            std::vector<const parallel::layers::Parameter*> ps;
            ps.reserve(static_cast<size_t>(tp));
            for (int r = 0; r < tp; ++r) ps.push_back(&ranks[static_cast<size_t>(r)][i]);
            const Shape& full = ranks[0][i].full_shape;
            const uint64_t es = dtype_size(dtypes[i]);
            const int64_t numel = shape_numel(full), step = piece_elems(full, dtypes[i]);
            std::vector<int64_t> emitted(static_cast<size_t>(tp), 0);
            for (int64_t b = 0; b < numel; b += step) {
              const int64_t c = std::min(step, numel - b);
              if (piece.size() < static_cast<uint64_t>(c) * es) piece.resize(static_cast<uint64_t>(c) * es);
              in.read(i, b, c, piece.data());
              scatter_piece(ps, b, c, piece.data(), es, bw, outs, emitted);
            }
            // Padding after the last run (or a shard of padding only).
            scatter_piece(ps, numel, 0, piece.data(), es, bw, outs, emitted);
            for (int r = 0; r < tp; ++r)
              TESSERA_CHECK(emitted[static_cast<size_t>(r)] == ps[static_cast<size_t>(r)]->numel(), "shard stream of ",
                            ps[static_cast<size_t>(r)]->name, " wrote ", emitted[static_cast<size_t>(r)], " of ",
                            ps[static_cast<size_t>(r)]->numel(), " elements");
          }
          bw.drain();
          for (int r = 0; r < tp; ++r) shas.push_back(bw.digest(outs[static_cast<size_t>(r)]));
        },
        nullptr, direct_io());
    for (int r = 0; r < tp; ++r)
      jfiles.push_back({{"file", files[static_cast<size_t>(r)]},
                        {"tp_rank", r},
                        {"pp_rank", s},
                        {"bytes", fs::file_size(paths[static_cast<size_t>(r)])},
                        {"sha256", shas[static_cast<size_t>(r)]},
                        {"tensors", file_tensors[static_cast<size_t>(r)]}});
  }
  return jfiles;
}

void check_shard_options(const Gpt2Config& c, const ShardOptions& opt, const std::string& what) {
  TESSERA_ARG_CHECK(opt.tp >= 1 && opt.pp >= 1 && opt.dp >= 1, "--tp, --pp and --dp must be >= 1 (got tp ", opt.tp,
                    ", pp ", opt.pp, ", dp ", opt.dp, ")");
  TESSERA_ARG_CHECK(c.heads % opt.tp == 0, "--tp ", opt.tp, " does not divide the ", c.heads, " attention heads of ",
                    what, " (attention is split by heads)");
  TESSERA_ARG_CHECK(c.layers >= opt.pp, "--pp ", opt.pp, " exceeds the ", c.layers, " layers of ", what,
                    " (each stage needs a whole layer)");
  gpt2_stages(c, opt.pp, opt.stages);  // throws InvalidArgument for a bad --stages
}

// Shards what `in` reads (config c, per-tensor dtypes) into out_dir. `nf`
// (may be null) is checked after the pass, before the output is committed.
// `before_commit` (optional) runs after the pass, before the non-finite check.
uint64_t shard_stream(FullReader& in, const std::vector<DType>& dtypes, const Gpt2Config& c, const std::string& source,
                      const std::string& out_dir, const ShardOptions& opt, const NonFiniteLog* nf,
                      const std::string& nf_top, const std::function<void()>& before_commit = {}) {
  check_shard_options(c, opt, source);
  check_out_dir(out_dir);
  const int tp = opt.tp, pp = opt.pp;
  const std::vector<int> part = gpt2_stages(c, pp, opt.stages);
  std::vector<std::vector<parallel::layers::Parameter>> ranks;
  ranks.reserve(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) ranks.push_back(gpt2_tp_parameters(c, tp, r));

  TempSibling tmp(out_dir);
  uint64_t bytes = 0;
  json jfiles = write_rank_files(in, dtypes, tp, pp, part, ranks, tmp.path(), &bytes);
  if (before_commit) before_commit();
  if (nf) nf->throw_if_any(nf_top);
  json manifest = {{"format", kFormat},
                   {"version", kVersion},
                   {"source", source},
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
// SHA-256 of each file, on up to two threads (the checks before a
// consolidate or reshard read every byte once; libcrypto runs ~2 GB/s per
// core). An error names the file (sha256_file_hex's FormatError).
std::vector<std::string> sha256_files(const std::vector<std::string>& paths) {
  std::vector<std::string> out(paths.size());
  std::vector<std::exception_ptr> err(paths.size());
  auto work = [&](size_t first, size_t stride) {
    for (size_t k = first; k < paths.size(); k += stride) {
      try {
        out[k] = sha256_file_hex(paths[k]);
      } catch (...) {
        err[k] = std::current_exception();
      }
    }
  };
  const size_t threads = std::min<size_t>({2, paths.size(), std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t, threads);
  work(0, std::max<size_t>(threads, 1));
  for (std::thread& t : pool) t.join();
  for (const std::exception_ptr& e : err)
    if (e) std::rethrow_exception(e);
  return out;
}

struct ManifestFiles {
  std::vector<std::string> paths;
  std::vector<const json*> entries;
};

// The manifest's SHA-256 of file k must equal `got`; else the FormatError naming the file.
void check_hash(const ManifestFiles& mf, size_t k, const std::string& got, const std::string& mpath) {
  const std::string want = mf.entries[k]->at("sha256").get<std::string>();
  if (got != want)
    throw FormatError(detail::concat(mf.paths[k], ": SHA-256 ", got, " differs from ", want, " recorded in ", mpath,
                                     " (the file is damaged, or is another rank's or another checkpoint's file)"));
}

// hash == false leaves the SHA-256 checks to the caller (StreamedHash).
ManifestFiles check_manifest_files(const json& m, const Gpt2Config& c, const std::string& dir, const std::string& mpath,
                                   bool hash = true) {
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
  if (hash) {
    const std::vector<std::string> hashes = sha256_files(out.paths);
    for (size_t k = 0; k < n; ++k) check_hash(out, k, hashes[k], mpath);
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

// Everything consolidate and reshard check before reading a tensor byte:
// the manifest, every file's size and SHA-256 (check_manifest_files), the
// stage partition, each file's header (SafetensorsReader), that each file
// holds exactly its rank's tensors with the shapes, dtypes and manifest
// entries the layout gives.
// Every file's SHA-256 against the manifest's (FormatError naming the first
// damaged file); returns when all match.
void check_all_hashes(const ShardDir& sd) {
  const std::vector<std::string> got = sha256_files(sd.paths);
  for (size_t k = 0; k < got.size(); ++k)
    if (got[k] != sd.sha256[k])
      throw FormatError(detail::concat(sd.paths[k], ": SHA-256 ", got[k], " differs from ", sd.sha256[k],
                                       " recorded in ", sd.mpath,
                                       " (the file is damaged, or is another rank's or another checkpoint's file)"));
}

// After a streaming pass: the hashes StreamedHash computed (reading what the pass skipped).
void finish_hashes(const ShardDir& sd) {
  for (size_t k = 0; k < sd.hashes.size(); ++k) {
    const std::string got = sd.hashes[k]->finish();
    if (got != sd.sha256[k])
      throw FormatError(detail::concat(sd.paths[k], ": SHA-256 ", got, " differs from ", sd.sha256[k], " recorded in ",
                                       sd.mpath,
                                       " (the file is damaged, or is another rank's or another checkpoint's file)"));
  }
}

// Runs fn; when it fails with a FormatError while the hashes were not all
// checked yet, a damaged file is what is reported (a flipped byte must be
// named as such, not as whatever check it happened to break first).
template <typename Fn>
auto damage_first(const ShardDir& sd, Fn fn) {
  try {
    return fn();
  } catch (const FormatError&) {
    if (!sd.hashes.empty()) check_all_hashes(sd);
    throw;
  }
}

void open_shard_files(ShardDir& sd, const json& m, const ManifestFiles& mf);

// stream_hashes: the files' SHA-256 are checked while a pass reads them
// (sd.hashes; the caller runs finish_hashes before committing anything),
// else here, up front.
ShardDir open_shard_dir(const std::string& dir, bool stream_hashes) {
  ShardDir sd;
  sd.dir = dir;
  sd.mpath = (fs::path(dir) / kManifestName).string();
  const json m = read_manifest(dir);
  sd.config = manifest_config(m, sd.mpath);
  sd.tp = m.at("tp").get<int>();  // checked by read_manifest
  sd.pp = m.at("pp").get<int>();
  const ManifestFiles mf = check_manifest_files(m, sd.config, dir, sd.mpath, !stream_hashes);
  sd.paths = mf.paths;
  for (const json* e : mf.entries) sd.sha256.push_back(e->at("sha256").get<std::string>());
  if (stream_hashes)
    for (const std::string& p : sd.paths) sd.hashes.push_back(std::make_unique<StreamedHash>(p));
  damage_first(sd, [&] { open_shard_files(sd, m, mf); });
  return sd;
}

// The checks of open_shard_dir after the manifest's file list.
void open_shard_files(ShardDir& sd, const json& m, const ManifestFiles& mf) {
  const Gpt2Config& c = sd.config;
  const int tp = sd.tp, pp = sd.pp;
  sd.part = manifest_stages(m, c, pp, sd.mpath);
  for (int r = 0; r < tp; ++r) sd.ranks.push_back(gpt2_tp_parameters(c, tp, r));
  sd.readers.resize(static_cast<size_t>(tp) * pp);
  for (size_t f = 0; f < sd.readers.size(); ++f) sd.readers[f] = std::make_unique<SafetensorsReader>(mf.paths[f]);
  std::vector<size_t> expected(sd.readers.size(), 0), in_file(sd.readers.size(), 0);
  for (const parallel::layers::Parameter& p : sd.ranks[0]) {
    const int s = gpt2_pp_stage(sd.part, p.name);
    for (int r = 0; r < tp; ++r) ++expected[static_cast<size_t>(s) * tp + r];
  }
  for (size_t f = 0; f < sd.readers.size(); ++f)
    if (sd.readers[f]->entries().size() != expected[f])
      throw FormatError(detail::concat(sd.readers[f]->path(), ": holds ", sd.readers[f]->entries().size(), " tensors, ",
                                       expected[f], " expected for its rank under ", sd.mpath));
  for (size_t i = 0; i < sd.ranks[0].size(); ++i) {
    const std::string& name = sd.ranks[0][i].name;
    const int s = gpt2_pp_stage(sd.part, name);
    sd.stage.push_back(s);
    DType dtype = DType::F32;
    for (int r = 0; r < tp; ++r) {
      const size_t f = static_cast<size_t>(s) * tp + r;
      const SafetensorsReader& rd = *sd.readers[f];
      const parallel::layers::Parameter& p = sd.ranks[static_cast<size_t>(r)][i];
      if (!rd.contains(name)) throw FormatError(detail::concat(rd.path(), ": ", name, " missing"));
      const SafetensorsEntry& e = rd.entry(name);
      check_manifest_tensor(*mf.entries[f], in_file[f]++, p, e, sd.mpath);
      if (e.shape != p.shape)
        throw FormatError(detail::concat(rd.path(), ": ", name, " has shape ", shape_str(e.shape), ", expected ",
                                         shape_str(p.shape), " for tp rank ", r, " of ", tp));
      if (!is_floating(e.dtype))
        throw FormatError(
            detail::concat(rd.path(), ": ", name, " has dtype ", dtype_name(e.dtype), ", expected F32, BF16 or F16"));
      if (r == 0) dtype = e.dtype;
      if (e.dtype != dtype)
        throw FormatError(
            detail::concat(rd.path(), ": ", name, " is ", dtype_name(e.dtype), ", tp rank 0 has ", dtype_name(dtype)));
    }
    sd.dtypes.push_back(dtype);
  }
}

// The Hugging Face metadata consolidate writes (write_gpt2_safetensors's).
std::map<std::string, std::string> hf_metadata(const Gpt2Config& c, const std::string& dir) {
  return {{"tessera_consolidated_from", fs::path(dir).filename().string()},
          {"format", "pt"},
          {"n_embd", std::to_string(c.hidden)},
          {"n_head", std::to_string(c.heads)},
          {"n_layer", std::to_string(c.layers)},
          {"n_positions", std::to_string(c.n_positions)},
          {"vocab_size", std::to_string(c.vocab)}};
}

// Streams the tensors `idx` (indices into the layout) from `in` into one
// Hugging Face safetensors file at `path`, in the order given.
// `before_commit` runs after the last byte, before the file is renamed into place.
void write_hf_file(FullReader& in, const ShardDir& sd, const std::vector<size_t>& idx,
                   const std::map<std::string, std::string>& md, const std::string& path,
                   const std::function<void()>& before_commit) {
  std::vector<TensorSpec> specs;
  specs.reserve(idx.size());
  for (size_t i : idx) specs.push_back({sd.ranks[0][i].name, sd.dtypes[i], sd.ranks[0][i].full_shape});
  const std::string header = safetensors_header(specs, md);
  write_file_atomic(
      path,
      [&](FileSink& sink) {
        BackgroundWriter bw(3, kOutBufferBytes);
        const size_t out = bw.add(&sink);
        bw.write(out, header.data(), header.size());
        std::vector<uint8_t> piece(kPieceBytes);
        for (size_t k = 0; k < idx.size(); ++k) {
          const size_t i = idx[k];
          const uint64_t es = dtype_size(sd.dtypes[i]);
          const int64_t numel = shape_numel(specs[k].shape), step = piece_elems(specs[k].shape, sd.dtypes[i]);
          for (int64_t b = 0; b < numel; b += step) {
            const int64_t c = std::min(step, numel - b);
            if (piece.size() < static_cast<uint64_t>(c) * es) piece.resize(static_cast<uint64_t>(c) * es);
            in.read(i, b, c, piece.data());
            bw.write(out, piece.data(), static_cast<size_t>(c) * es);
          }
        }
        bw.drain();
        before_commit();
      },
      direct_io());
}

// Layout indices in Hugging Face order (gpt2_tensor_names), as consolidate writes them.
std::vector<size_t> hf_order(const ShardDir& sd) {
  std::map<std::string, size_t> at;
  for (size_t i = 0; i < sd.ranks[0].size(); ++i) at[sd.ranks[0][i].name] = i;
  std::vector<size_t> out;
  for (const std::string& n : gpt2_tensor_names(sd.config)) {
    auto it = at.find(n);
    TESSERA_CHECK(it != at.end(), "layout lacks ", n);
    out.push_back(it->second);
  }
  return out;
}

}  // namespace

std::string rank_stem(int dp_rank, int tp_rank, int pp_rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "dp_rank_%02d_tp_rank_%02d_pp_rank_%02d", dp_rank, tp_rank, pp_rank);
  return buf;
}

uint64_t shard_gpt2(const std::string& src_path, const std::string& out_dir, const ShardOptions& opt) {
  if (std::optional<std::string> train = resolve_train_checkpoint(src_path)) {
    // A training checkpoint: its weights (all hashes checked first), sharded as an HF file would be.
    const TrainCheckpoint ck(*train);
    const Gpt2Config c = train_checkpoint_gpt2_config(ck);
    TESSERA_ARG_CHECK(opt.heads == 0 || opt.heads == c.heads, "--heads ", opt.heads, " does not match checkpoint ",
                      ck.dir(), ", which has ", c.heads);
    ShardOptions o = opt;
    o.heads = c.heads;
    check_shard_options(c, o, ck.dir());
    check_out_dir(out_dir);
    ck.verify_all();
    NonFiniteLog nf;
    const std::vector<parallel::layers::Parameter> layout = gpt2_tp_parameters(c, 1, 0);
    TrainReader in(ck, layout, opt.allow_nonfinite ? nullptr : &nf);
    const std::vector<DType> dtypes(layout.size(), DType::F32);
    return shard_stream(in, dtypes, c, ck.dir(), out_dir, o, &nf, ck.dir());
  }
  std::unique_ptr<TensorSource> src = open_safetensors(src_path);
  Gpt2Config c = infer_gpt2_config(*src, opt.heads);
  check_gpt2(*src, c);
  NonFiniteLog nf;
  HfReader in(*src, gpt2_tp_parameters(c, 1, 0), opt.allow_nonfinite ? nullptr : &nf);
  return shard_stream(in, in.dtypes(), c, src->path(), out_dir, opt, &nf, src->path());
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
  const ShardDir sd = open_shard_dir(dir, true);
  NonFiniteLog nf;
  ShardDirReader in(sd, allow_nonfinite ? nullptr : &nf);
  damage_first(sd, [&] {
    write_hf_file(in, sd, hf_order(sd), hf_metadata(sd.config, dir), out_file, [&] {
      finish_hashes(sd);
      nf.throw_if_any(dir);
    });
  });
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

namespace {
std::vector<std::string> consolidate_sharded_pass(const ShardDir& sd, FullReader& in, const NonFiniteLog& nf,
                                                  const std::string& dir, const std::string& out_dir,
                                                  uint64_t max_shard_bytes);
}  // namespace

std::vector<std::string> consolidate_gpt2_sharded(const std::string& dir, const std::string& out_dir,
                                                  uint64_t max_shard_bytes, bool allow_nonfinite) {
  TESSERA_ARG_CHECK(max_shard_bytes > 0, "--max-shard-size must be positive");
  check_out_dir(out_dir);
  const ShardDir sd = open_shard_dir(dir, true);
  NonFiniteLog nf;
  ShardDirReader in(sd, allow_nonfinite ? nullptr : &nf);
  return damage_first(sd, [&] { return consolidate_sharded_pass(sd, in, nf, dir, out_dir, max_shard_bytes); });
}

namespace {

std::vector<std::string> consolidate_sharded_pass(const ShardDir& sd, FullReader& in, const NonFiniteLog& nf,
                                                  const std::string& dir, const std::string& out_dir,
                                                  uint64_t max_shard_bytes) {
  // Hugging Face's rule (save_pretrained): tensors in order, a new shard
  // when the next would take this one past the limit; a larger tensor gets
  // a shard of its own.
  std::vector<std::vector<size_t>> groups(1);
  uint64_t in_group = 0, total = 0;
  for (size_t i : hf_order(sd)) {
    const uint64_t b = static_cast<uint64_t>(shape_numel(sd.ranks[0][i].full_shape)) * dtype_size(sd.dtypes[i]);
    if (!groups.back().empty() && in_group + b > max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += b;
    total += b;
  }
  TempSibling tmp(out_dir);
  const std::map<std::string, std::string> md = hf_metadata(sd.config, dir);
  const int n = static_cast<int>(groups.size());
  std::vector<std::string> files;
  json weight_map = json::object();
  for (int k = 0; k < n; ++k) {
    // One shard: model.safetensors alone, as save_pretrained writes it.
    files.push_back(n == 1 ? std::string("model.safetensors") : shard_file_name("model", k + 1, n));
    write_hf_file(in, sd, groups[static_cast<size_t>(k)], md, (tmp.path() / files.back()).string(), [] {});
    for (size_t i : groups[static_cast<size_t>(k)]) weight_map[sd.ranks[0][i].name] = files.back();
  }
  finish_hashes(sd);
  nf.throw_if_any(dir);
  if (n > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic((tmp.path() / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }
  tmp.commit();
  return files;
}

}  // namespace

std::string reshard_train_checkpoint(const std::string& src, const std::string& out_dir, const RelayoutOptions& ro) {
  const std::optional<std::string> train = resolve_train_checkpoint(src);
  TESSERA_ARG_CHECK(train.has_value(), src, " is not a training checkpoint, nor a directory holding a complete one");
  check_out_dir(out_dir);
  int64_t step = 0;
  {
    const TrainCheckpoint ck(*train);  // the marker and manifest, before anything is created
    step = ck.step();
  }
  TempSibling tmp(out_dir);
  const fs::path step_dir = tmp.path() / step_dir_name(step);
  fs::create_directory(step_dir);
  relayout_train_checkpoint(*train, step_dir.string(), ro);
  fsync_path(tmp.path().string());
  tmp.commit();
  fsync_path(tmp.target().parent_path().string());
  return (fs::path(out_dir) / step_dir_name(step)).lexically_normal().string();
}

uint64_t reshard_gpt2(const std::string& dir, const std::string& out_dir, const ShardOptions& opt) {
  std::error_code ec;
  if (std::optional<std::string> train = resolve_train_checkpoint(dir)) {
    RelayoutOptions ro;
    {
      const TrainCheckpoint ck(*train);
      ro.layout = ck.layout();
    }
    ro.layout.tp = opt.tp;
    ro.layout.pp = opt.pp;
    ro.layout.dp = opt.dp;
    ro.stages = opt.stages;
    ro.allow_nonfinite = opt.allow_nonfinite;
    const std::string step_dir = reshard_train_checkpoint(*train, out_dir, ro);
    uint64_t bytes = 0;
    for (const auto& e : fs::directory_iterator(step_dir)) bytes += e.is_regular_file() ? e.file_size() : 0;
    return bytes;
  }
  if (!fs::exists(fs::path(dir) / kManifestName, ec)) {
    // Not a shard directory: a Hugging Face file or sharded directory is sharded directly.
    try {
      open_safetensors(dir);
    } catch (const FormatError& e) {
      throw FormatError(
          detail::concat(e.what(), "; nor is there a ", kManifestName, " (a `tessera ckpt shard` directory)"));
    }
    return shard_gpt2(dir, out_dir, opt);
  }
  // The cheap checks first (a bad --tp must not wait for every hash).
  const Gpt2Config c = read_manifest_config(dir);
  ShardOptions o = opt;
  o.heads = c.heads;
  check_shard_options(c, o, dir);
  check_out_dir(out_dir);
  const ShardDir sd = open_shard_dir(dir, true);
  NonFiniteLog nf;
  ShardDirReader in(sd, opt.allow_nonfinite ? nullptr : &nf);
  return damage_first(sd, [&] {
    return shard_stream(in, sd.dtypes, sd.config, dir, out_dir, o, &nf, dir, [&] { finish_hashes(sd); });
  });
}

}  // namespace tessera::parallel::checkpoint
