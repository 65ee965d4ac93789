#include "parallel/data/byte_dataset.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "tests/checkpoint/test_util.h"

namespace tessera::parallel::data {
namespace {

using tessera::testing::TempDir;
using tessera::testing::write_bytes;

// Two files whose bytes are all distinct positions mod 256 would be ambiguous;
// a counter pattern makes every window identifiable by its first bytes.
std::string pattern(size_t n, int salt) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + static_cast<size_t>(salt) + i / 256) & 0xff);
  return s;
}

class ByteDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = dir_.file("a.txt");
    b_ = dir_.file("b.txt");
    write_bytes(a_, pattern(3000, 1));
    write_bytes(b_, pattern(1000, 2));
  }
  TempDir dir_;
  std::string a_, b_;
};

TEST_F(ByteDatasetTest, CorpusIsConcatenationAndSplitIsLastFivePercent) {
  ByteDataset ds({a_, b_});
  EXPECT_EQ(ds.total_bytes(), 4000);
  std::string expect = pattern(3000, 1) + pattern(1000, 2);
  EXPECT_TRUE(std::equal(expect.begin(), expect.end(), ds.corpus().begin(),
                         [](char c, uint8_t u) { return static_cast<uint8_t>(c) == u; }));
  EXPECT_EQ(ds.split_begin(Split::kTrain), 0);
  EXPECT_EQ(ds.split_end(Split::kTrain), 3800);  // 5% of 4000 = 200 bytes held out
  EXPECT_EQ(ds.split_begin(Split::kVal), 3800);
  EXPECT_EQ(ds.split_end(Split::kVal), 4000);
}

TEST_F(ByteDatasetTest, RowsAreCorpusWindowsInsideTheirSplit) {
  ByteDataset ds({a_, b_});
  const int64_t seq = 63, gb = 16;
  std::vector<int32_t> out(static_cast<size_t>(gb * (seq + 1)));
  for (Split sp : {Split::kTrain, Split::kVal}) {
    for (int64_t step = 0; step < 20; ++step) {
      ds.batch(sp, step, gb, seq, 0, gb, out.data());
      for (int64_t r = 0; r < gb; ++r) {
        int64_t start = ds.window_start(sp, step * gb + r, seq);
        ASSERT_GE(start, ds.split_begin(sp));
        ASSERT_LE(start + seq + 1, ds.split_end(sp));  // never crosses into the other split
        for (int64_t i = 0; i <= seq; ++i) {
          ASSERT_EQ(out[static_cast<size_t>(r * (seq + 1) + i)], ds.corpus()[static_cast<size_t>(start + i)]);
        }
      }
    }
  }
}

TEST_F(ByteDatasetTest, DeterministicAcrossInstancesAndSeedsDiffer) {
  ByteDataset d1({a_, b_}), d2({a_, b_}), d3({a_, b_}, 0.05, 99);
  const int64_t seq = 31, gb = 8;
  std::vector<int32_t> x(static_cast<size_t>(gb * (seq + 1))), y(x.size()), z(x.size());
  for (int64_t step : {0, 1, 17, 1000}) {
    d1.batch(Split::kTrain, step, gb, seq, 0, gb, x.data());
    d2.batch(Split::kTrain, step, gb, seq, 0, gb, y.data());
    d3.batch(Split::kTrain, step, gb, seq, 0, gb, z.data());
    EXPECT_EQ(x, y) << "step " << step;
    EXPECT_NE(x, z) << "step " << step;
  }
  // Consecutive steps differ.
  d1.batch(Split::kTrain, 0, gb, seq, 0, gb, x.data());
  d1.batch(Split::kTrain, 1, gb, seq, 0, gb, y.data());
  EXPECT_NE(x, y);
}

TEST_F(ByteDatasetTest, RowsSplitOverRanksConcatenateToTheSerialBatch) {
  ByteDataset ds({a_, b_});
  const int64_t seq = 47, gb = 12, len = seq + 1;
  for (int64_t step : {0, 3, 250}) {
    std::vector<int32_t> serial(static_cast<size_t>(gb * len));
    ds.batch(Split::kTrain, step, gb, seq, 0, gb, serial.data());
    for (int64_t ranks : {1, 2, 4, 3, 5}) {  // 5 does not divide 12: uneven shares
      std::vector<int32_t> joined;
      int64_t at = 0;
      for (int64_t rank = 0; rank < ranks; ++rank) {
        int64_t rows = gb / ranks + (rank < gb % ranks ? 1 : 0);
        std::vector<int32_t> part(static_cast<size_t>(rows * len));
        ds.batch(Split::kTrain, step, gb, seq, at, rows, part.data());
        joined.insert(joined.end(), part.begin(), part.end());
        at += rows;
      }
      EXPECT_EQ(joined, serial) << "step " << step << " ranks " << ranks;
    }
  }
}

TEST_F(ByteDatasetTest, SampleStreamDoesNotDependOnBatchSize) {
  // Row r of step s is global sample s*gb + r, so step 1 at batch 4 is rows 4..7 of step 0 at batch 8.
  ByteDataset ds({a_, b_});
  const int64_t seq = 15, len = seq + 1;
  std::vector<int32_t> big(static_cast<size_t>(8 * len)), small(static_cast<size_t>(4 * len));
  ds.batch(Split::kVal, 0, 8, seq, 0, 8, big.data());
  ds.batch(Split::kVal, 1, 4, seq, 0, 4, small.data());
  EXPECT_TRUE(std::equal(small.begin(), small.end(), big.begin() + 4 * len));
}

TEST_F(ByteDatasetTest, WindowStartsCoverTheSplitUniformly) {
  // 200-byte validation split, seq 9: 191 valid starts; 20000 draws should hit
  // every one (expected ~105 each; missing one has probability ~e^-105 per start).
  ByteDataset ds({a_, b_});
  std::vector<int> hits(191, 0);
  for (int64_t i = 0; i < 20000; ++i) {
    int64_t s = ds.window_start(Split::kVal, i, 9) - ds.split_begin(Split::kVal);
    ASSERT_GE(s, 0);
    ASSERT_LT(s, 191);
    ++hits[static_cast<size_t>(s)];
  }
  int lo = *std::min_element(hits.begin(), hits.end()), hi = *std::max_element(hits.begin(), hits.end());
  EXPECT_GT(lo, 50);
  EXPECT_LT(hi, 170);
}

TEST_F(ByteDatasetTest, SplitTooSmallForSeqIsAClearError) {
  ByteDataset ds({a_, b_});
  std::vector<int32_t> out(300);
  try {
    ds.batch(Split::kVal, 0, 1, 200, 0, 1, out.data());  // val has 200 bytes, needs 201
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("val split has 200 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ds.batch(Split::kTrain, 0, 4, 8, 3, 2, out.data()), InvalidArgument);  // rows past the batch
}

TEST_F(ByteDatasetTest, BadFilesAreNamed) {
  auto expect_error = [](const std::vector<std::string>& files, const std::string& name, const std::string& what) {
    try {
      ByteDataset ds(files);
      ADD_FAILURE() << "accepted " << name;
    } catch (const FormatError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(name), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  const std::string missing = dir_.file("missing.txt");
  expect_error({a_, missing}, missing, "No such file");
  const std::string empty = dir_.file("empty.txt");
  write_bytes(empty, "");
  expect_error({a_, empty}, empty, "is empty");
  expect_error({dir_.path()}, dir_.path(), "not a regular file");
  EXPECT_THROW(ByteDataset(std::vector<std::string>{}), InvalidArgument);
  EXPECT_THROW(ByteDataset({a_}, 0.0), InvalidArgument);
}

TEST_F(ByteDatasetTest, UnreadableFileIsNamed) {
  const std::string locked = dir_.file("locked.txt");
  write_bytes(locked, "x");
  ::chmod(locked.c_str(), 0);
  // Root (CAP_DAC_OVERRIDE) reads a file without read permission: nothing to test.
  if (::access(locked.c_str(), R_OK) == 0)
    GTEST_SKIP() << "this user can read a mode-000 file (running as root), so an unreadable file cannot be made";
  try {
    ByteDataset ds({locked});
    ADD_FAILURE() << "accepted an unreadable file";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(locked), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Permission denied"), std::string::npos) << e.what();
  }
}

TEST_F(ByteDatasetTest, DefaultFilesAreSortedRegularFilesWithoutSymlinks) {
  const std::string d = dir_.file("licenses");
  std::filesystem::create_directory(d);
  write_bytes(d + "/MIT", "m");
  write_bytes(d + "/Apache", "a");
  std::filesystem::create_symlink(d + "/MIT", d + "/Link");
  std::filesystem::create_directory(d + "/sub");
  EXPECT_EQ(ByteDataset::default_files(d), (std::vector<std::string>{d + "/Apache", d + "/MIT"}));
  try {
    ByteDataset::default_files(d + "/sub");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(d + "/sub"), std::string::npos);
  }
  EXPECT_THROW(ByteDataset::default_files(dir_.file("nope")), FormatError);
}

TEST(ByteDatasetDefault, CommonLicensesCorpus) {
  if (!std::filesystem::is_directory(ByteDataset::kDefaultDir)) GTEST_SKIP() << "no " << ByteDataset::kDefaultDir;
  auto files = ByteDataset::default_files();
  ByteDataset ds(files);
  EXPECT_GT(ds.total_bytes(), 100000);
  EXPECT_TRUE(std::is_sorted(files.begin(), files.end()));
  for (const auto& f : files) EXPECT_FALSE(std::filesystem::is_symlink(f)) << f;
  std::vector<int32_t> out(size_t{4} * 257);
  ds.batch(Split::kVal, 0, 4, 256, 0, 4, out.data());
  for (int32_t t : out) ASSERT_TRUE(t >= 0 && t < ByteDataset::kVocab);
}

TEST_F(ByteDatasetTest, EvalWindowsAreConsecutiveFromTheStart) {
  const std::string f = dir_.file("eval.txt");
  write_bytes(f, "abcdefghij");  // 10 bytes, seq 2: windows abc def ghi (j dropped)
  std::vector<int32_t> out;
  EXPECT_EQ(eval_windows(f, 2, 0, &out), 3);
  EXPECT_EQ(out, (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'}));
  EXPECT_EQ(eval_windows(f, 2, 2, &out), 2);
  EXPECT_EQ(out, (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e', 'f'}));
  EXPECT_EQ(eval_windows(f, 9, 5, &out), 1);
  try {
    eval_windows(f, 10, 0, &out);  // needs 11 bytes
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(f), std::string::npos);
  }
  EXPECT_THROW(eval_windows(dir_.file("none.txt"), 2, 0, &out), FormatError);
}

}  // namespace
}  // namespace tessera::parallel::data
