#include "parallel/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "runtime/device.h"
#include "runtime/files.h"

namespace tessera::parallel::checkpoint {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so is every target here");

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxIndexBytes = 64ull << 20;  // a 100k-tensor index is a few MiB

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw FormatError(path + ": " + what); }

std::string os_error(const std::string& what, const std::string& path, int err) {
  return detail::concat(what, " '", path, "': ", std::strerror(err));
}

// safetensors dtypes tessera does not hold in memory, so a file with them gets
// a "not supported" message rather than "unknown".
bool is_known_foreign_dtype(const std::string& s) {
  static const std::set<std::string> kForeign = {"BOOL",    "U8",  "I8",      "I16",     "U16",
                                                 "U32",     "U64", "F64",     "F8_E5M2", "F8_E4M3",
                                                 "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2", "C64"};
  return kForeign.count(s) > 0;
}

// Finds the first name that appears twice in one object, in one pass. (A
// parse callback could do this, but nlohmann 3.11's callback parser walks the
// parent object again after each child object: quadratic in the tensors, 30 s
// for a header of 80k of them.)
class DuplicateNameFinder final : public json::json_sax_t {
 public:
  std::string duplicate;  // empty: none
  bool null() override { return true; }
  bool boolean(bool /*val*/) override { return true; }
  bool number_integer(number_integer_t /*val*/) override { return true; }
  bool number_unsigned(number_unsigned_t /*val*/) override { return true; }
  bool number_float(number_float_t /*val*/, const string_t& /*s*/) override { return true; }
  bool string(string_t& /*val*/) override { return true; }
  bool binary(binary_t& /*val*/) override { return true; }
  bool start_object(std::size_t /*elements*/) override {
    names_.emplace_back();
    return true;
  }
  bool key(string_t& val) override {
    if (!names_.back().insert(val).second) {
      duplicate = val;
      return false;  // stop: the first one is reported
    }
    return true;
  }
  bool end_object() override {
    names_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const json::exception& /*ex*/) override {
    return false;  // json::parse, which ran first, reports syntax errors
  }

 private:
  std::vector<std::unordered_set<std::string>> names_;
};

// Parses JSON rejecting duplicate keys in any object (nlohmann would keep the
// last silently; Hugging Face's reader refuses a header with a name twice).
// Two linear passes: the parse, then the duplicate search.
json parse_json_strict(const std::string& path, const char* begin, const char* end, const char* what) {
  json j;
  try {
    j = json::parse(begin, end, nullptr, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    fail(path, detail::concat(what, " is not valid JSON: ", e.what()));
  }
  DuplicateNameFinder names;
  json::sax_parse(begin, end, &names);
  if (!names.duplicate.empty())
    fail(path, detail::concat(what, " has the name '", names.duplicate, "' twice (duplicate names are rejected)"));
  return j;
}

bool valid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

uint64_t get_u64(const std::string& path, const std::string& tensor, const char* field, const json& v) {
  if (!v.is_number_unsigned()) {
    fail(path, detail::concat("tensor '", tensor, "': ", field, " must hold non-negative integers, got ", v.dump()));
  }
  return v.get<uint64_t>();
}

// Host storage without the zero fill Storage::host does: every byte is about
// to be overwritten, and touching 512 MiB twice costs as much as the copy.
std::shared_ptr<Storage> uninitialised_storage(size_t bytes, Device* device) {
  if (device) return std::make_shared<Storage>(device->allocate(bytes), bytes, device);
  // Large buffers on 2 MiB boundaries with transparent huge pages: filling
  // fresh 4 KiB pages one fault at a time costs several times the copy itself.
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = bytes >= 2 * kHuge ? kHuge : 64;
  size_t rounded = (bytes + align - 1) & ~(align - 1);
  void* p = std::aligned_alloc(align, rounded ? rounded : align);
  if (!p) throw std::bad_alloc();
  if (align == kHuge) ::madvise(p, rounded, MADV_HUGEPAGE);  // advisory: failure only costs speed
  return std::make_shared<Storage>(p, bytes, nullptr);
}

// ---- POSIX file helpers ----

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string header_json(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata) {
  // Built by hand (not through json objects) to keep the caller's tensor order
  // in the header, which makes the files byte-for-byte predictable.
  std::string h = "{";
  bool first = true;
  if (!metadata.empty()) {
    h += "\"__metadata__\":";
    h += json(metadata).dump();
    first = false;
  }
  uint64_t at = 0;
  for (const TensorSpec& t : tensors) {
    if (!first) h += ",";
    first = false;
    h += json(t.name).dump();
    h += ":{\"dtype\":\"";
    h += dtype_safetensors_name(t.dtype);
    h += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) h += ",";
      h += std::to_string(t.shape[i]);
    }
    uint64_t n = t.nbytes();
    h += detail::concat("],\"data_offsets\":[", at, ",", at + n, "]}");
    at += n;
  }
  h += "}";
  // Pad with spaces so the data section starts 8-byte aligned, as Hugging
  // Face's writer does; readers treat trailing spaces as JSON whitespace.
  while ((8 + h.size()) % 8 != 0) h += ' ';
  return h;
}

void check_names(const std::vector<TensorSpec>& tensors, const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const TensorSpec& t : tensors) {
    const std::string& name = t.name;
    TESSERA_ARG_CHECK(!name.empty(), "write_safetensors: empty tensor name");
    TESSERA_ARG_CHECK(valid_utf8(reinterpret_cast<const uint8_t*>(name.data()), name.size()),
                      "write_safetensors: tensor name is not valid UTF-8");
    TESSERA_ARG_CHECK(name != "__metadata__", "write_safetensors: '__metadata__' is reserved, not a tensor name");
    TESSERA_ARG_CHECK(seen.insert(name).second, "write_safetensors: tensor name '", name, "' given twice");
  }
  for (const auto& [k, v] : metadata) {
    TESSERA_ARG_CHECK(valid_utf8(reinterpret_cast<const uint8_t*>(k.data()), k.size()) &&
                          valid_utf8(reinterpret_cast<const uint8_t*>(v.data()), v.size()),
                      "write_safetensors: metadata '", k, "' is not valid UTF-8");
  }
}

std::vector<TensorSpec> specs_of(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<TensorSpec> out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    TESSERA_ARG_CHECK(t.defined(), "write_safetensors: tensor '", name, "' is undefined");
    out.push_back({name, t.dtype(), t.shape()});
  }
  return out;
}

}  // namespace

// ---- reader -------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  uint64_t size = 0;
  Fd fd(open_regular_file(path, &size));        // refuses FIFOs and devices without blocking
  fd_ = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);  // for read_bytes; the Fd closes the original
  if (fd_ < 0) throw FormatError(os_error("cannot dup the descriptor of", path, errno));
  if (size < 8) {
    ::close(fd_);
    fail(path, detail::concat("file is ", size, " bytes, too short for the 8-byte header length (truncated)"));
  }
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (m == MAP_FAILED) {
    const int err = errno;
    ::close(fd_);
    throw FormatError(os_error("cannot mmap", path, err));
  }
  map_ = static_cast<const uint8_t*>(m);
  map_size_ = size;
  try {
    uint64_t n;
    std::memcpy(&n, map_, 8);
    if (n > kMaxSafetensorsHeader) {
      fail(path, detail::concat("header length ", n, " exceeds the limit of ", kMaxSafetensorsHeader, " bytes"));
    }
    if (8 + n > size) {
      fail(path, detail::concat("header length ", n, " runs past the end of the ", size, "-byte file (truncated)"));
    }
    header_size_ = n;
    data_ = map_ + 8 + n;
    data_size_ = size - 8 - n;
    const char* hb = reinterpret_cast<const char*>(map_ + 8);
    if (!valid_utf8(map_ + 8, n)) fail(path, "header is not valid UTF-8");
    if (n == 0 || hb[0] != '{') fail(path, "header does not start with '{'");
    json h = parse_json_strict(path, hb, hb + n, "header");
    if (!h.is_object()) fail(path, "header is not a JSON object");

    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const json& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) fail(path, "__metadata__ must be an object of strings");
        for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
          if (!m2.value().is_string()) {
            fail(path,
                 detail::concat("__metadata__ value of '", m2.key(), "' must be a string, got ", m2.value().dump()));
          }
          metadata_[m2.key()] = m2.value().get<std::string>();
        }
        continue;
      }
      if (!v.is_object()) fail(path, detail::concat("tensor '", name, "': entry is not an object"));
      for (const char* field : {"dtype", "shape", "data_offsets"}) {
        if (!v.contains(field)) fail(path, detail::concat("tensor '", name, "': missing \"", field, "\""));
      }
      SafetensorsEntry e;
      e.name = name;
      const json& dt = v["dtype"];
      if (!dt.is_string()) fail(path, detail::concat("tensor '", name, "': dtype must be a string"));
      const std::string ds = dt.get<std::string>();
      if (ds == "F32" || ds == "BF16" || ds == "F16" || ds == "I32" || ds == "I64") {
        e.dtype = parse_safetensors_dtype(ds);
      } else if (is_known_foreign_dtype(ds)) {
        fail(path, detail::concat("tensor '", name, "': dtype ", ds,
                                  " is not supported by tessera (supported: F32, BF16, F16, I32, I64)"));
      } else {
        fail(path, detail::concat("tensor '", name, "': unknown dtype '", ds, "'"));
      }
      const json& shp = v["shape"];
      if (!shp.is_array()) fail(path, detail::concat("tensor '", name, "': shape must be an array"));
      uint64_t numel = 1;
      bool overflow = false;
      for (const json& d : shp) {
        uint64_t x = get_u64(path, name, "shape", d);
        if (x > static_cast<uint64_t>(INT64_MAX)) overflow = true;
        e.shape.push_back(static_cast<int64_t>(x));
        overflow |= __builtin_mul_overflow(numel, x, &numel);
      }
      const json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2) {
        fail(path, detail::concat("tensor '", name, "': data_offsets must be [begin, end]"));
      }
      e.begin = get_u64(path, name, "data_offsets", off[0]);
      e.end = get_u64(path, name, "data_offsets", off[1]);
      if (e.end < e.begin) {
        fail(path, detail::concat("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] end before begin"));
      }
      uint64_t nbytes = 0;
      overflow |= __builtin_mul_overflow(numel, dtype_size(e.dtype), &nbytes);
      if (overflow) fail(path, detail::concat("tensor '", name, "': shape ", shp.dump(), " overflows"));
      if (e.end - e.begin != nbytes) {
        fail(path, detail::concat("tensor '", name, "': data_offsets [", e.begin, ", ", e.end, "] hold ",
                                  e.end - e.begin, " bytes but shape ", shape_str(e.shape), " of ", ds, " needs ",
                                  nbytes, " (end - begin must equal numel x dtype size)"));
      }
      entries_.push_back(std::move(e));
    }
    std::sort(entries_.begin(), entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
      return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
    });
    uint64_t at = 0;
    for (const SafetensorsEntry& e : entries_) {
      if (e.begin != at) {
        fail(path, detail::concat("tensor '", e.name, "': data_offsets [", e.begin, ", ", e.end, "] ",
                                  e.begin > at ? "leave a gap" : "overlap the previous tensor", " (expected begin ", at,
                                  "; offsets must be contiguous from 0)"));
      }
      at = e.end;
    }
    if (at != data_size_) {
      fail(path,
           detail::concat("tensors cover ", at, " data bytes but the file holds ", data_size_, " after the header (",
                          at > data_size_ ? "truncated" : "data must cover the rest of the file exactly", ")"));
    }
    for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_size_);
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
  if (fd_ >= 0) ::close(fd_);
}

void SafetensorsReader::read_bytes(const SafetensorsEntry& e, uint64_t offset, uint64_t bytes, void* dst) const {
  TESSERA_ARG_CHECK(offset <= e.end - e.begin && bytes <= e.end - e.begin - offset, "read_bytes: [", offset, ", ",
                    offset + bytes, ") is outside tensor '", e.name, "' (", e.end - e.begin, " bytes) of ", path_);
  uint64_t at = 8 + header_size_ + e.begin + offset;
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd_, p, std::min<uint64_t>(bytes, uint64_t{1} << 30), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw FormatError(os_error("cannot read", path_, errno));
    if (n == 0)
      fail(path_, detail::concat("file ended at byte ", at, " while tensor '", e.name, "' was read (it shrank)"));
    p += n;
    at += static_cast<uint64_t>(n);
    bytes -= static_cast<uint64_t>(n);
  }
}

void SafetensorsReader::read_bytes(const std::string& name, uint64_t offset, uint64_t bytes, void* dst) const {
  read_bytes(entry(name), offset, bytes, dst);
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

bool SafetensorsReader::contains(const std::string& name) const { return index_.count(name) > 0; }

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  TESSERA_ARG_CHECK(it != index_.end(), "tensor '", name, "' is not in ", path_);
  return entries_[it->second];
}

Tensor SafetensorsReader::get(const std::string& name, Device* device) const {
  const SafetensorsEntry& e = entry(name);
  const size_t n = e.end - e.begin;
  auto storage = uninitialised_storage(n, device);
  if (n) std::memcpy(storage->data(), bytes(e), n);
  return Tensor(std::move(storage), e.dtype, e.shape, contiguous_strides(e.shape), 0);
}

void SafetensorsReader::read_into(const std::string& name, Tensor& dst) const {
  const SafetensorsEntry& e = entry(name);
  TESSERA_ARG_CHECK(dst.defined() && dst.shape() == e.shape, "read_into: tensor '", name, "' in ", path_, " is ",
                    dtype_safetensors_name(e.dtype), shape_str(e.shape), ", destination is ",
                    dst.defined() ? dst.str() : std::string("undefined"));
  const uint8_t* src = bytes(e);
  const size_t es = dtype_size(e.dtype);
  const bool aligned = reinterpret_cast<uintptr_t>(src) % es == 0;
  if (dst.is_contiguous() && (dst.dtype() == e.dtype || aligned)) {
    // memcpy (same dtype) does not care about alignment; convert() reads typed pointers.
    convert(src, e.dtype, dst.raw_data(), dst.dtype(), static_cast<size_t>(shape_numel(e.shape)));
    return;
  }
  dst.copy_from(get(name));
}

// ---- writer -------------------------------------------------------------------

std::string safetensors_header(const std::vector<TensorSpec>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  check_names(tensors, metadata);
  const std::string h = header_json(tensors, metadata);
  const uint64_t n = h.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + h;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header = safetensors_header(specs_of(tensors), metadata);
  write_file_atomic(path, [&](FileSink& out) {
    out.write(header.data(), header.size());
    for (const auto& [name, t] : tensors) {
      if (t.numel() == 0) continue;
      Tensor c = t.contiguous();
      out.write(c.raw_data(), c.nbytes());
    }
  });
}

std::string shard_file_name(const std::string& prefix, int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "-%05d-of-%05d.safetensors", k, n);
  return prefix + buf;
}

std::vector<std::string> write_sharded_safetensors(const std::string& dir,
                                                   const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                   uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata,
                                                   const std::string& prefix) {
  TESSERA_ARG_CHECK(max_shard_bytes > 0, "write_sharded_safetensors: max_shard_bytes must be positive");
  check_names(specs_of(tensors), metadata);
  std::vector<std::vector<std::pair<std::string, Tensor>>> groups(1);
  uint64_t in_group = 0, total = 0;
  for (const auto& nt : tensors) {
    uint64_t b = nt.second.nbytes();
    if (!groups.back().empty() && in_group + b > max_shard_bytes) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(nt);
    in_group += b;
    total += b;
  }
  const int n = static_cast<int>(groups.size());
  std::vector<std::string> paths;
  json weight_map = json::object();
  for (int k = 0; k < n; ++k) {
    std::string file = shard_file_name(prefix, k + 1, n);
    std::string p = (fs::path(dir) / file).string();
    write_safetensors(p, groups[static_cast<size_t>(k)], metadata);
    paths.push_back(p);
    for (const auto& nt : groups[static_cast<size_t>(k)]) weight_map[nt.first] = file;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  std::string ipath = (fs::path(dir) / (prefix + ".safetensors.index.json")).string();
  write_file_atomic(ipath, text);
  return paths;
}

// ---- sharded reader -------------------------------------------------------------

ShardedSafetensorsReader::ShardedSafetensorsReader(const std::string& index_path) : index_path_(index_path) {
  const std::string& ip = index_path_;
  const std::string text = read_regular_file(ip, kMaxIndexBytes);
  json j = parse_json_strict(ip, text.data(), text.data() + text.size(), "index");
  if (!j.is_object()) fail(ip, "index is not a JSON object");
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail(ip, "index has no \"weight_map\" object");
  if (j.contains("metadata")) {
    const json& m = j["metadata"];
    if (!m.is_object()) fail(ip, "\"metadata\" is not an object");
    for (auto it = m.begin(); it != m.end(); ++it) {
      index_metadata_[it.key()] = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
    }
    if (m.contains("total_size")) {
      const json& t = m["total_size"];
      if (t.is_number_unsigned()) {
        total_size_ = t.get<uint64_t>();
      } else if (t.is_number_float() && t.get<double>() >= 0 &&
                 t.get<double>() == static_cast<double>(static_cast<uint64_t>(t.get<double>()))) {
        total_size_ = static_cast<uint64_t>(t.get<double>());  // some exporters write 1234.0
      } else {
        fail(ip, "\"total_size\" must be a non-negative integer, got " + t.dump());
      }
    }
  }
  const fs::path dir = fs::path(ip).parent_path();
  std::map<std::string, size_t> shard_index;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string()) fail(ip, detail::concat("weight_map['", it.key(), "'] is not a file name"));
    const std::string file = it.value().get<std::string>();
    fs::path fp(file);
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\0') != std::string::npos) {
      fail(ip, detail::concat(
                   "weight_map['", it.key(), "'] = '", file,
                   "' must be a file name relative to the index's directory (a plain file name, no '/' or '..')"));
    }
    auto [sit, inserted] = shard_index.emplace(file, shards_.size());
    if (inserted) {
      std::string sp = (dir / fp).string();
      if (!fs::exists(sp)) fail(ip, detail::concat("shard '", sp, "' (holding '", it.key(), "') does not exist"));
      shards_.push_back(std::make_unique<SafetensorsReader>(sp));
    }
    const SafetensorsReader& shard = *shards_[sit->second];
    if (!shard.contains(it.key())) {
      fail(ip, detail::concat("tensor '", it.key(), "' is mapped to '", shard.path(), "' which does not hold it"));
    }
    weight_map_[it.key()] = sit->second;
  }
  for (const auto& s : shards_) {
    for (const SafetensorsEntry& e : s->entries()) {
      auto w = weight_map_.find(e.name);
      if (w == weight_map_.end()) {
        fail(ip,
             detail::concat("shard '", s->path(), "' holds tensor '", e.name, "' which the weight_map does not list"));
      }
      if (shards_[w->second].get() != s.get()) {
        fail(ip, detail::concat("tensor '", e.name, "' is in both '", s->path(), "' and '", shards_[w->second]->path(),
                                "'"));
      }
    }
  }
}

std::vector<std::string> ShardedSafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(weight_map_.size());
  for (const auto& kv : weight_map_) out.push_back(kv.first);
  return out;
}

bool ShardedSafetensorsReader::contains(const std::string& name) const { return weight_map_.count(name) > 0; }

const SafetensorsReader& ShardedSafetensorsReader::shard_of(const std::string& name) const {
  auto it = weight_map_.find(name);
  TESSERA_ARG_CHECK(it != weight_map_.end(), "tensor '", name, "' is not in the weight_map of ", index_path_);
  return *shards_[it->second];
}

const SafetensorsEntry& ShardedSafetensorsReader::entry(const std::string& name) const {
  return shard_of(name).entry(name);
}
const std::string& ShardedSafetensorsReader::file_of(const std::string& name) const { return shard_of(name).path(); }
Tensor ShardedSafetensorsReader::get(const std::string& name, Device* device) const {
  return shard_of(name).get(name, device);
}
void ShardedSafetensorsReader::read_into(const std::string& name, Tensor& dst) const {
  shard_of(name).read_into(name, dst);
}
void ShardedSafetensorsReader::read_bytes(const std::string& name, uint64_t offset, uint64_t bytes, void* dst) const {
  shard_of(name).read_bytes(name, offset, bytes, dst);
}
const std::map<std::string, std::string>& ShardedSafetensorsReader::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  return shards_.empty() ? kEmpty : shards_.front()->metadata();
}

void scan_nonfinite(const void* data, DType dtype, int64_t n, int64_t* count, int64_t* first, const char** first_kind) {
  // Exponent all ones: inf (mantissa 0) or nan. Read through memcpy: the
  // bytes may sit at any alignment inside a file.
  auto scan = [&](auto zero, uint32_t exp, uint32_t mant, uint32_t sign) {
    using U = decltype(zero);
    const auto* b = static_cast<const unsigned char*>(data);
    auto at = [&](int64_t i) {
      U u;
      std::memcpy(&u, b + i * static_cast<int64_t>(sizeof(U)), sizeof(U));
      return u;
    };
    // A branch-free count first (vectorised; almost every piece has none),
    // then the first one's index and kind only when there are any.
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += (at(i) & exp) == exp;
    if (bad == 0) return;
    if (*count == 0) {
      for (int64_t i = 0; i < n; ++i) {
        const U u = at(i);
        if ((u & exp) != exp) continue;
        *first = i;
        *first_kind = (u & mant) ? "nan" : ((u & sign) ? "-inf" : "inf");
        break;
      }
    }
    *count += bad;
  };
  switch (dtype) {
    case DType::F32:
      scan(uint32_t{0}, 0x7f800000u, 0x007fffffu, 0x80000000u);
      break;
    case DType::BF16:
      scan(uint16_t{0}, 0x7f80u, 0x007fu, 0x8000u);
      break;
    case DType::F16:
      scan(uint16_t{0}, 0x7c00u, 0x03ffu, 0x8000u);
      break;
    default:
      break;
  }
}

std::vector<std::string> nonfinite_problems(const TensorSource& src) {
  std::vector<std::string> out;
  constexpr uint64_t kPiece = uint64_t{4} << 20;
  std::vector<unsigned char> buf;
  for (const std::string& name : src.names()) {
    const SafetensorsEntry& e = src.entry(name);
    if (e.dtype != DType::F32 && e.dtype != DType::BF16 && e.dtype != DType::F16) continue;
    const uint64_t es = dtype_size(e.dtype), total = e.end - e.begin;
    int64_t bad = 0, first = -1;
    const char* kind = "";
    for (uint64_t at = 0; at < total; at += kPiece) {
      const uint64_t n = std::min(kPiece, total - at);
      buf.resize(n);
      src.read_bytes(name, at, n, buf.data());
      int64_t c = bad, f = -1;
      scan_nonfinite(buf.data(), e.dtype, static_cast<int64_t>(n / es), &c, &f, &kind);
      if (bad == 0 && c > 0) first = static_cast<int64_t>(at / es) + f;
      bad = c;
    }
    if (bad) {
      out.push_back(detail::concat(src.file_of(name), ": tensor '", name, "' holds ", bad, " non-finite value",
                                   bad == 1 ? "" : "s", " (first at flat index ", first, ": ", kind, ")"));
    }
  }
  return out;
}

void check_finite(const TensorSource& src) {
  std::vector<std::string> p = nonfinite_problems(src);
  if (p.empty()) return;
  std::string msg = src.path() + ": non-finite weights:";
  for (const std::string& line : p) msg += "\n  " + line;
  msg += "\n(pass --allow-nonfinite to load them anyway)";
  throw FormatError(msg);
}

std::unique_ptr<TensorSource> open_safetensors(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    // transformers' from_pretrained order: model.safetensors first, then
    // the sharded form's index (a directory holding both loads the file).
    fs::path one = fs::path(path) / "model.safetensors";
    if (fs::exists(one, ec)) return std::make_unique<SafetensorsReader>(one.string());
    fs::path idx = fs::path(path) / "model.safetensors.index.json";
    if (fs::exists(idx, ec)) return std::make_unique<ShardedSafetensorsReader>(idx.string());
    throw FormatError(path + ": directory holds neither model.safetensors.index.json nor model.safetensors");
  }
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    return std::make_unique<ShardedSafetensorsReader>(path);
  }
  return std::make_unique<SafetensorsReader>(path);
}

}  // namespace tessera::parallel::checkpoint
