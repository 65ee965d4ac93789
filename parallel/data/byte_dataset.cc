#include "parallel/data/byte_dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "runtime/files.h"
#include "runtime/random.h"

namespace tessera::parallel::data {

namespace fs = std::filesystem;

namespace {

// Appends the whole of `path` to `out`; FormatError naming the file otherwise.
void read_file(const std::string& path, std::vector<uint8_t>* out) {
  // The inputs' one check (runtime/files.h): a FIFO, a device or a directory
  // given as data is refused without blocking ("data file 'x': not a regular
  // file (a FIFO)"), as are a missing or unreadable file ("data file 'x':
  // cannot open: No such file or directory").
  uint64_t size = 0;
  const int fd = open_input_file(path, "data file", &size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const size_t before = out->size();
  const size_t want = static_cast<size_t>(size);
  out->resize(before + want);
  size_t got = 0;
  while (got < want) {
    ssize_t r = ::read(fd, out->data() + before + got, want - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      out->resize(before);
      throw FormatError(detail::concat("data file '", path, "': cannot read: ", std::strerror(errno)));
    }
    if (r == 0) break;  // shrank while reading: keep what is there
    got += static_cast<size_t>(r);
  }
  out->resize(before + got);
  if (got == 0) throw FormatError(detail::concat("data file '", path, "' is empty"));
}

}  // namespace

const char* split_name(Split s) { return s == Split::kTrain ? "train" : "val"; }

ByteDataset::ByteDataset(const std::vector<std::string>& files, double val_fraction, uint64_t seed)
    : files_(files), seed_(seed) {
  TESSERA_ARG_CHECK(!files.empty(), "ByteDataset: no data files given");
  TESSERA_ARG_CHECK(val_fraction > 0 && val_fraction < 1, "ByteDataset: val_fraction ", val_fraction,
                    " must be in (0, 1)");
  for (const std::string& f : files_) read_file(f, &corpus_);
  const int64_t n = total_bytes();
  int64_t val = static_cast<int64_t>(std::ceil(static_cast<double>(n) * val_fraction));
  val = std::clamp<int64_t>(val, 1, n - 1 > 0 ? n - 1 : 1);
  train_end_ = n - val;
}

std::vector<std::string> ByteDataset::default_files(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw FormatError(detail::concat("cannot list data directory '", dir, "': ", ec.message()));
  std::vector<std::string> out;
  for (const fs::directory_entry& e : it) {
    // Symlinks (GPL -> GPL-3) would repeat a text and leak it across the split.
    if (fs::is_regular_file(e.symlink_status())) out.push_back(e.path().string());
  }
  if (out.empty()) throw FormatError(detail::concat("data directory '", dir, "' holds no regular file"));
  std::sort(out.begin(), out.end());
  return out;
}

int64_t ByteDataset::window_start(Split split, int64_t sample, int64_t seq) const {
  const int64_t len = seq + 1;
  const int64_t n = split_bytes(split);
  TESSERA_ARG_CHECK(seq >= 1 && n >= len, "the ", split_name(split), " split has ", n,
                    " bytes, fewer than one window of seq+1 = ", len, " (corpus ", total_bytes(), " bytes in ",
                    files_.size(), " files)");
  const uint64_t count = static_cast<uint64_t>(n - len + 1);  // valid starts
  // Unbiased draw in [0, count) (Lemire's multiply-and-reject), each attempt a
  // fresh hash of (seed, split, sample, attempt): a pure function of its inputs.
  const uint64_t base = splitmix64(splitmix64(seed_) ^ (split == Split::kTrain ? 0x7472ull : 0x76616cull));
  const uint64_t threshold = (0 - count) % count;
  for (uint64_t attempt = 0;; ++attempt) {
    uint64_t r = splitmix64(base ^ splitmix64(static_cast<uint64_t>(sample) * 0x100000001b3ull + attempt));
    unsigned __int128 m = static_cast<unsigned __int128>(r) * count;
    if (static_cast<uint64_t>(m) >= threshold) return split_begin(split) + static_cast<int64_t>(m >> 64);
  }
}

void ByteDataset::batch(Split split, int64_t step, int64_t global_batch, int64_t seq, int64_t first_row, int64_t rows,
                        int32_t* out) const {
  TESSERA_ARG_CHECK(step >= 0 && global_batch > 0 && seq >= 1, "batch: step ", step, ", global_batch ", global_batch,
                    ", seq ", seq);
  TESSERA_ARG_CHECK(first_row >= 0 && rows >= 0 && first_row + rows <= global_batch, "batch: rows [", first_row, ", ",
                    first_row + rows, ") outside the global batch of ", global_batch);
  const int64_t len = seq + 1;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = window_start(split, step * global_batch + first_row + r, seq);
    const uint8_t* src = corpus_.data() + start;
    int32_t* dst = out + r * len;
    for (int64_t i = 0; i < len; ++i) dst[i] = src[i];
  }
}

int64_t eval_windows(const std::string& path, int64_t seq, int64_t max_windows, std::vector<int32_t>* out) {
  TESSERA_ARG_CHECK(seq >= 1, "eval_windows: seq ", seq, " must be positive");
  std::vector<uint8_t> bytes;
  read_file(path, &bytes);
  const int64_t len = seq + 1;
  int64_t count = static_cast<int64_t>(bytes.size()) / len;
  if (count == 0) {
    throw FormatError(
        detail::concat("eval file '", path, "' has ", bytes.size(), " bytes, fewer than one window of seq+1 = ", len));
  }
  if (max_windows > 0) count = std::min(count, max_windows);
  out->assign(static_cast<size_t>(count * len), 0);
  for (int64_t i = 0; i < count * len; ++i) (*out)[static_cast<size_t>(i)] = bytes[static_cast<size_t>(i)];
  return count;
}

}  // namespace tessera::parallel::data
