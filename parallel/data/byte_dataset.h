// Byte-level language-model data: tokens are the bytes of text files (vocab 256).
//
// The corpus is the concatenation of the files in the order given (the
// default list is every regular file, not symlink, directly under
// /usr/share/common-licenses, sorted by name). The validation split is the
// last `val_fraction` (default 5%) of the concatenated bytes, the training
// split everything before it; windows never cross the boundary, so the splits
// are disjoint byte ranges.
//
// Batches do not depend on the parallel layout: row r of step s is global
// sample i = s * global_batch + r, whose window start is a pure function of
// (seed, split, i) (a counter-based generator, SplitMix64), so any data-parallel
// rank computes its own rows and the union over ranks is the serial batch.
// Each row is seq+1 consecutive bytes: inputs are [0, seq), targets [1, seq+1).
//
// A ByteDataset holds the corpus in memory, is immutable after construction
// and batch() is safe to call from several threads; batch() allocates nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace tessera::parallel::data {

enum class Split { kTrain, kVal };
const char* split_name(Split s);  // "train", "val"

class ByteDataset {
 public:
  static constexpr int64_t kVocab = 256;
  static constexpr const char* kDefaultDir = "/usr/share/common-licenses";

  // Reads every file whole. Throws FormatError naming the file when one is
  // missing, not a regular file, unreadable or empty; InvalidArgument for an
  // empty list or val_fraction outside (0, 1).
  explicit ByteDataset(const std::vector<std::string>& files, double val_fraction = 0.05, uint64_t seed = 1234);

  // The default file list (sorted, regular files only); throws FormatError
  // naming the directory when it is missing or holds no regular file.
  static std::vector<std::string> default_files(const std::string& dir = kDefaultDir);

  const std::vector<std::string>& files() const { return files_; }
  uint64_t seed() const { return seed_; }
  int64_t total_bytes() const { return static_cast<int64_t>(corpus_.size()); }
  // [begin, end) byte range of a split in the concatenated corpus.
  int64_t split_begin(Split s) const { return s == Split::kTrain ? 0 : train_end_; }
  int64_t split_end(Split s) const { return s == Split::kTrain ? train_end_ : total_bytes(); }
  int64_t split_bytes(Split s) const { return split_end(s) - split_begin(s); }
  const std::vector<uint8_t>& corpus() const { return corpus_; }

  // Corpus offset of global sample `sample` (window of seq+1 bytes) in `split`.
  int64_t window_start(Split split, int64_t sample, int64_t seq) const;

  // Fills rows [first_row, first_row + rows) of step `step`'s global batch
  // (global_batch rows) into out[rows * (seq + 1)], row-major. Throws
  // InvalidArgument when the split is shorter than seq + 1 bytes or the row
  // range is outside [0, global_batch).
  void batch(Split split, int64_t step, int64_t global_batch, int64_t seq, int64_t first_row, int64_t rows,
             int32_t* out) const;

 private:
  std::vector<std::string> files_;
  std::vector<uint8_t> corpus_;
  int64_t train_end_ = 0;
  uint64_t seed_;
};

// Consecutive non-overlapping windows of seq+1 bytes from the start of `path`
// (window k covers bytes [k*(seq+1), (k+1)*(seq+1))), at most max_windows of
// them (max_windows <= 0: all that fit); a trailing partial window is dropped.
// Returns the window count; out holds count * (seq + 1) tokens. Throws
// FormatError naming the file when it is missing, unreadable, empty or
// shorter than seq + 1 bytes.
int64_t eval_windows(const std::string& path, int64_t seq, int64_t max_windows, std::vector<int32_t>* out);

}  // namespace tessera::parallel::data
