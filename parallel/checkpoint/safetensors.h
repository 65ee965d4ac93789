// safetensors files (Hugging Face's format) and their sharded layout.
//
// File layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON
// (an object; may be padded with trailing spaces), then the raw tensor bytes.
// docs/checkpoint.md states every rule the reader enforces.
//
// SafetensorsReader maps the file read-only (mmap) and validates the whole
// header and the data extent in its constructor, so a reader that exists is a
// valid file; get() then only copies. Readers are immutable after construction
// and safe to use from several threads at once. The mapping lives as long as
// the reader; tensors returned by get() own their bytes and outlive it.
//
// write_safetensors streams the file through write_file_atomic
// (runtime/files.h): temp file in the target's directory, fsync, rename over
// the target, fsync of the directory. A crash or an error leaves either the
// old file or the new one, never a torn file; I/O errors are IoError naming
// the path and the step that failed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace tessera::parallel::checkpoint {

// One tensor's header entry; begin/end are byte offsets relative to the data
// section (the first byte after the header).
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

// A tensor's name, dtype and shape without its data: what a streaming
// writer needs to lay out the header before the bytes exist.
struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t nbytes() const { return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype); }
};

// Largest header Hugging Face's reader accepts.
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Read-only access to named tensors, from one file or several (sharded).
// The GPT-2 helpers take this so `--init` accepts either form.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The file this source was opened from (the index for sharded sources).
  virtual const std::string& path() const = 0;
  // All tensor names (sorted for sharded sources, data-offset order for one file).
  virtual std::vector<std::string> names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  // Header entry of `name`; throws InvalidArgument naming the tensor and file when absent.
  virtual const SafetensorsEntry& entry(const std::string& name) const = 0;
  // File that holds `name` (for messages).
  virtual const std::string& file_of(const std::string& name) const = 0;
  // A new contiguous tensor with the file's dtype and shape, on `device` (host when nullptr).
  virtual Tensor get(const std::string& name, Device* device = nullptr) const = 0;
  // Copies `name` into `dst` (same shape; dtype converted; dst may be strided,
  // e.g. a slice of a fused parameter). Throws InvalidArgument on a shape mismatch.
  virtual void read_into(const std::string& name, Tensor& dst) const = 0;
  // The source's "__metadata__" (for sharded: the first shard's).
  virtual const std::map<std::string, std::string>& metadata() const = 0;
  // Copies bytes [offset, offset + bytes) of tensor `name`'s stored data into
  // `dst` with pread (no mapping is touched, so reading a large file in
  // pieces keeps the resident memory at the size of the pieces). Throws
  // InvalidArgument for a range outside the tensor, FormatError naming the
  // file when the read fails or the file shrank.
  virtual void read_bytes(const std::string& name, uint64_t offset, uint64_t bytes, void* dst) const = 0;
};

class SafetensorsReader : public TensorSource {
 public:
  // Throws FormatError "<path>: <problem>" for any malformed file, and
  // FormatError for a missing/unreadable file (with the OS error).
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader() override;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const override { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data-offset order
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  uint64_t header_size() const { return header_size_; }  // N
  uint64_t data_size() const { return data_size_; }      // bytes after the header

  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  const SafetensorsEntry& entry(const std::string& name) const override;
  const std::string& file_of(const std::string&) const override { return path_; }
  Tensor get(const std::string& name, Device* device = nullptr) const override;
  void read_into(const std::string& name, Tensor& dst) const override;
  void read_bytes(const std::string& name, uint64_t offset, uint64_t bytes, void* dst) const override;
  void read_bytes(const SafetensorsEntry& e, uint64_t offset, uint64_t bytes, void* dst) const;

  // The tensor's raw bytes inside the mapping (valid while the reader lives;
  // not necessarily aligned to the element size).
  const uint8_t* bytes(const SafetensorsEntry& e) const { return data_ + e.begin; }

 private:
  std::string path_;
  int fd_ = -1;                   // kept open for read_bytes
  const uint8_t* map_ = nullptr;  // whole file
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // map_ + 8 + N
  uint64_t header_size_ = 0, data_size_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (dtype F32/BF16/F16/I32/I64, unique names, any strides;
// written row-major) in the order given, laid out contiguously from offset 0.
// The header is padded with spaces so the data starts 8-byte aligned.
// Throws InvalidArgument for duplicate/empty names or a name "__metadata__",
// and Error (with the OS error) for I/O failures; the target is untouched then.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The bytes write_safetensors puts before the data for these tensors (the
// 8-byte length and the padded JSON header), for writers that then stream
// each tensor's bytes in the order given. Throws InvalidArgument as
// write_safetensors does (names, metadata).
std::string safetensors_header(const std::vector<TensorSpec>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// ---- sharded layout ----------------------------------------------------------
// <dir>/<prefix>-0000K-of-0000N.safetensors plus <dir>/<prefix>.safetensors.index.json:
//   {"metadata": {"total_size": <sum of tensor bytes>}, "weight_map": {name: file}}
// Tensors are assigned in order to shards of at most max_shard_bytes of data
// (a single larger tensor gets a shard of its own). Returns the shard paths.
// Every shard and the index are written atomically; the index last.
std::vector<std::string> write_sharded_safetensors(const std::string& dir,
                                                   const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                   uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata = {},
                                                   const std::string& prefix = "model");

// "<prefix>-00002-of-00005.safetensors" (1-based k).
std::string shard_file_name(const std::string& prefix, int k, int n);

// Opens an index.json and every shard it names, validating all of them up
// front: file names are plain names in the index's directory (no '/', no
// '..'), each shard a regular file; each weight_map entry must exist in its
// shard, every shard tensor must be in the weight_map (with that shard), no
// name in two shards. Throws
// FormatError naming the index or shard file and the problem.
class ShardedSafetensorsReader : public TensorSource {
 public:
  explicit ShardedSafetensorsReader(const std::string& index_path);

  const std::string& index_path() const { return index_path_; }
  const std::string& path() const override { return index_path_; }
  uint64_t total_size() const { return total_size_; }  // as stated in the index
  const std::map<std::string, std::string>& index_metadata() const { return index_metadata_; }
  const std::vector<std::unique_ptr<SafetensorsReader>>& shards() const { return shards_; }

  std::vector<std::string> names() const override;
  bool contains(const std::string& name) const override;
  const SafetensorsEntry& entry(const std::string& name) const override;
  const std::string& file_of(const std::string& name) const override;
  Tensor get(const std::string& name, Device* device = nullptr) const override;
  void read_into(const std::string& name, Tensor& dst) const override;
  const std::map<std::string, std::string>& metadata() const override;
  void read_bytes(const std::string& name, uint64_t offset, uint64_t bytes, void* dst) const override;

 private:
  const SafetensorsReader& shard_of(const std::string& name) const;
  std::string index_path_;
  uint64_t total_size_ = 0;
  std::map<std::string, std::string> index_metadata_;  // "metadata" object, values as JSON text for non-strings
  std::vector<std::unique_ptr<SafetensorsReader>> shards_;
  std::map<std::string, size_t> weight_map_;  // name -> shard index
};

// Counts the non-finite values (NaN, +-Inf) among `n` elements of dtype
// `dtype` at `data` (F32, BF16, F16 by their exponent bits, no conversion;
// other dtypes have none). Adds to *count; sets *first (index relative to
// `data`) and *first_kind ("nan", "inf", "-inf") for the first one when
// *count was 0.
void scan_nonfinite(const void* data, DType dtype, int64_t n, int64_t* count, int64_t* first, const char** first_kind);

// Non-finite values (NaN, +-Inf) of every float tensor of `src`, one line per
// tensor that has any: "<file>: tensor '<name>' holds N non-finite values
// (first at flat index i: nan)". Empty when all are finite. Reads in pieces
// of a few MiB (read_bytes), so memory does not grow with the tensors.
std::vector<std::string> nonfinite_problems(const TensorSource& src);
// Throws FormatError listing nonfinite_problems when there are any (the
// message ends with the hint to pass --allow-nonfinite).
void check_finite(const TensorSource& src);

// Opens `path` as: an index .json (sharded), a directory holding
// model.safetensors.index.json or model.safetensors, or a single .safetensors file.
std::unique_ptr<TensorSource> open_safetensors(const std::string& path);

}  // namespace tessera::parallel::checkpoint
