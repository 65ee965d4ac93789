#include "parallel/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/device.h"
#include "tests/checkpoint/test_util.h"

namespace tessera::parallel::checkpoint {
namespace {

using tessera::testing::read_bytes;
using tessera::testing::safetensors_bytes;
using tessera::testing::TempDir;
using tessera::testing::write_bytes;

template <typename T>
Tensor raw_tensor(const std::vector<T>& v, const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  EXPECT_EQ(t.nbytes(), v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(T));
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

TEST(Safetensors, RoundTripEveryDtypeBitExact) {
  TempDir dir;
  const float nan_payload = std::bit_cast<float>(0x7fc12345u);
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"f32", raw_tensor<float>({1.5f, -0.0f, std::numeric_limits<float>::infinity(), nan_payload,
                                 std::numeric_limits<float>::denorm_min(), 3.25e38f},
                                {2, 3}, DType::F32)},
      // bf16/f16 as raw bit patterns: quiet NaN with payload, -0, smallest denormal, -Inf, max finite.
      {"bf16", raw_tensor<uint16_t>({0x7fc1, 0x8000, 0x0001, 0xff80, 0x7f7f, 0x3f80}, {3, 2}, DType::BF16)},
      {"f16", raw_tensor<uint16_t>({0x7e01, 0x8000, 0x0001, 0xfc00, 0x7bff}, {5}, DType::F16)},
      {"i32", raw_tensor<int32_t>({std::numeric_limits<int32_t>::min(), -1, 0, std::numeric_limits<int32_t>::max()},
                                  {2, 1, 2}, DType::I32)},
      {"i64", raw_tensor<int64_t>({std::numeric_limits<int64_t>::min(), 42, std::numeric_limits<int64_t>::max()}, {3},
                                  DType::I64)},
      {"scalar", raw_tensor<float>({7.0f}, {}, DType::F32)},
      {"empty", raw_tensor<int64_t>({}, {0, 4}, DType::I64)},
      {"empty_bf16", raw_tensor<uint16_t>({}, {3, 0}, DType::BF16)},
  };
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, ts);
  SafetensorsReader r(path);
  ASSERT_EQ(r.entries().size(), ts.size());
  EXPECT_TRUE(r.metadata().empty());
  uint64_t at = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto& [name, t] = ts[i];
    ASSERT_TRUE(r.contains(name)) << name;
    Tensor got = r.get(name);
    EXPECT_TRUE(same_bytes(got, t)) << name << " " << got.str() << " vs " << t.str();
    // Written in the order given, contiguous from 0.
    EXPECT_EQ(r.entries()[i].name, name);
    EXPECT_EQ(r.entries()[i].begin, at);
    at += t.nbytes();
    EXPECT_EQ(r.entries()[i].end, at);
  }
  EXPECT_EQ(r.data_size(), at);
  EXPECT_EQ((8 + r.header_size()) % 8, 0u) << "data section should start 8-byte aligned";
  EXPECT_FALSE(r.contains("nope"));
  EXPECT_THROW(r.get("nope"), InvalidArgument);
  // The 0-d tensor is a real scalar.
  EXPECT_EQ(r.get("scalar").dim(), 0);
  EXPECT_EQ(r.get("scalar").item(0), 7.0);
}

TEST(Safetensors, MetadataAndStridedSourceRoundTrip) {
  TempDir dir;
  Tensor m = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor mt = m.transpose(0, 1);  // [3, 2], not contiguous: written row-major
  std::map<std::string, std::string> md = {{"format", "pt"}, {"note", "h\xc3\xa9llo \"quoted\""}};
  const std::string path = dir.file("m.safetensors");
  write_safetensors(path, {{"mt", mt}}, md);
  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata(), md);
  Tensor got = r.get("mt");
  EXPECT_EQ(got.shape(), (Shape{3, 2}));
  EXPECT_EQ(got.to_float_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

TEST(Safetensors, ByteExactLayout) {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  write_safetensors(path, {{"a", Tensor::from_vector({1.0f, 2.0f}, {2})}, {"b", Tensor::full({}, 7, DType::I32)}},
                    {{"k", "v"}});
  // Header JSON, counted by hand:
  //   {"__metadata__":{"k":"v"},                                   26 chars
  //   "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},        54
  //   "b":{"dtype":"I32","shape":[],"data_offsets":[8,12]}}        52
  // = 132, padded with 4 spaces so 8 + 136 = 144 is a multiple of 8.
  const std::string json =
      "{\"__metadata__\":{\"k\":\"v\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[8,12]}}    ";
  ASSERT_EQ(json.size(), 136u);
  std::string expected("\x88\0\0\0\0\0\0\0", 8);  // 136 = 0x88, little-endian u64
  expected += json;
  expected += std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);  // 1.0f, 2.0f
  expected += std::string("\x07\x00\x00\x00", 4);                  // int32 7
  EXPECT_EQ(read_bytes(path), expected);
  SafetensorsReader r(path);
  EXPECT_EQ(r.header_size(), 136u);
  EXPECT_EQ(r.data_size(), 12u);
}

TEST(Safetensors, HandWrittenFileWithTrailingSpacesAndOutOfOrderEntries) {
  // Entries listed in the header out of data order, with trailing whitespace:
  // valid, and entries() come back in data-offset order.
  TempDir dir;
  const std::string path = dir.file("h.safetensors");
  std::string data("\x01\x00\x02\x00\x03\x00\x00\x00", 8);
  write_bytes(path, safetensors_bytes("{\"y\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                                      "\"x\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}   ",
                                      data));
  SafetensorsReader r(path);
  ASSERT_EQ(r.entries().size(), 2u);
  EXPECT_EQ(r.entries()[0].name, "x");
  EXPECT_EQ(r.entries()[1].name, "y");
  EXPECT_EQ(r.get("y").item(0), 3.0);
  EXPECT_EQ(r.get("x").data<uint16_t>()[1], 2);
}

TEST(Safetensors, ReadIntoConvertsAndFillsStridedDestination) {
  TempDir dir;
  const std::string path = dir.file("r.safetensors");
  // A bf16 tensor of odd size first, so the f32 tensor after it sits at a
  // 2-byte (misaligned for f32) offset in the mapping.
  write_safetensors(path, {{"odd", Tensor::from_vector({1, 2, 3}, {3}, DType::BF16)},
                           {"w", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3})}});
  SafetensorsReader r(path);
  EXPECT_EQ(r.entry("w").begin, 6u);
  Tensor dst = Tensor::zeros({2, 3}, DType::BF16);
  r.read_into("w", dst);
  EXPECT_EQ(dst.to_float_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  Tensor big = Tensor::zeros({2, 6}, DType::F32);
  Tensor half = big.slice(1, 3, 6);  // strided view
  r.read_into("w", half);
  EXPECT_EQ(big.to_float_vector(), (std::vector<float>{0, 0, 0, 1, 2, 3, 0, 0, 0, 4, 5, 6}));
  Tensor wrong = Tensor::zeros({3, 2}, DType::F32);
  EXPECT_THROW(r.read_into("w", wrong), InvalidArgument);
}

TEST(Safetensors, GetOntoDeviceChargesIt) {
  TempDir dir;
  const std::string path = dir.file("d.safetensors");
  write_safetensors(path, {{"w", Tensor::from_vector({1, 2, 3, 4}, {4})}});
  Device dev(DeviceSpec::preset("test-core"));
  {
    SafetensorsReader r(path);
    Tensor t = r.get("w", &dev);
    EXPECT_EQ(t.device(), &dev);
    EXPECT_EQ(dev.memory_stats().in_use, 16u);
    EXPECT_EQ(t.to_float_vector(), (std::vector<float>{1, 2, 3, 4}));
  }
  EXPECT_EQ(dev.memory_stats().in_use, 0u);
}

TEST(Safetensors, WriterRejectsBadInputAndLeavesTargetUntouched) {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  write_safetensors(path, {{"a", Tensor::from_vector({1}, {1})}});
  const std::string before = read_bytes(path);
  Tensor t = Tensor::from_vector({2}, {1});
  EXPECT_THROW(write_safetensors(path, {{"a", t}, {"a", t}}), InvalidArgument);
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", t}}), InvalidArgument);
  EXPECT_THROW(write_safetensors(path, {{"", t}}), InvalidArgument);
  EXPECT_THROW(write_safetensors(path, {{"\xff\xfe", t}}), InvalidArgument);
  // Metadata keys and values must be UTF-8 too (an overlong '/' and a lone continuation byte).
  for (const auto& md : std::vector<std::map<std::string, std::string>>{{{"k", "\xc0\xaf"}}, {{"\x80", "v"}}}) {
    try {
      write_safetensors(path, {{"a", t}}, md);
      ADD_FAILURE() << "accepted non-UTF-8 metadata";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("is not valid UTF-8"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(read_bytes(path), before);
  // No temp file left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
  // A directory that does not exist: an Error naming the path, nothing created.
  try {
    write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", t}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir"), std::string::npos) << e.what();
  }
  // Overwrite works and replaces the content atomically.
  write_safetensors(path, {{"b", t}});
  SafetensorsReader r(path);
  EXPECT_TRUE(r.contains("b"));
  EXPECT_FALSE(r.contains("a"));
}

// ---- one test per rejection rule ----

class SafetensorsReject : public ::testing::Test {
 protected:
  // Writes `bytes` and expects FormatError mentioning the file and `rule`.
  void expect_rejected(const std::string& bytes, const std::string& rule) {
    const std::string path = dir_.file("bad.safetensors");
    write_bytes(path, bytes);
    try {
      SafetensorsReader r(path);
      ADD_FAILURE() << "accepted a file that breaks: " << rule;
    } catch (const FormatError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << "error does not name the file: " << msg;
      EXPECT_NE(msg.find(rule), std::string::npos) << "error does not state '" << rule << "': " << msg;
    }
  }
  static std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                           const std::string& offsets) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
  }
  TempDir dir_;
};

TEST_F(SafetensorsReject, FileShorterThanLengthField) { expect_rejected(std::string("\x02\0\0", 3), "too short"); }

TEST_F(SafetensorsReject, HeaderLengthOverLimit) {
  expect_rejected(safetensors_bytes("{}", "", 100'000'001), "exceeds the limit of 100000000");
}

TEST_F(SafetensorsReject, HeaderLengthPastEndOfFile) {
  expect_rejected(safetensors_bytes("{}", "", 50), "runs past the end");
}

TEST_F(SafetensorsReject, HeaderNotUtf8) {
  expect_rejected(safetensors_bytes("{\"\xc3\x28\":1}", ""), "not valid UTF-8");
}

TEST_F(SafetensorsReject, HeaderNotStartingWithBrace) {
  expect_rejected(safetensors_bytes(" {}", ""), "does not start with '{'");
  expect_rejected(safetensors_bytes("", ""), "does not start with '{'");
}

TEST_F(SafetensorsReject, HeaderNotJson) {
  expect_rejected(safetensors_bytes("{\"a\":", ""), "not valid JSON");
  expect_rejected(safetensors_bytes("{} x", ""), "not valid JSON");
}

TEST_F(SafetensorsReject, EntryMissingField) {
  expect_rejected(safetensors_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", std::string(4, '\0')),
                  "missing \"data_offsets\"");
  expect_rejected(safetensors_bytes("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0')),
                  "missing \"dtype\"");
}

TEST_F(SafetensorsReject, UnknownDtype) {
  expect_rejected(safetensors_bytes("{" + entry("a", "Q7", "[1]", "[0,4]") + "}", std::string(4, '\0')),
                  "unknown dtype 'Q7'");
}

TEST_F(SafetensorsReject, ValidButUnsupportedDtype) {
  expect_rejected(safetensors_bytes("{" + entry("a", "F64", "[1]", "[0,8]") + "}", std::string(8, '\0')),
                  "dtype F64 is not supported by tessera");
}

TEST_F(SafetensorsReject, NegativeOrFractionalNumbers) {
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[-1]", "[0,4]") + "}", std::string(4, '\0')),
                  "non-negative integers");
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[1]", "[0,4.0]") + "}", std::string(4, '\0')),
                  "non-negative integers");
}

TEST_F(SafetensorsReject, SizeNotNumelTimesDtypeSize) {
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[3]", "[0,8]") + "}", std::string(8, '\0')),
                  "end - begin must equal numel x dtype size");
}

TEST_F(SafetensorsReject, EndBeforeBegin) {
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[0]", "[4,0]") + "}", std::string(4, '\0')),
                  "end before begin");
}

TEST_F(SafetensorsReject, OffsetsNotStartingAtZero) {
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[1]", "[4,8]") + "}", std::string(8, '\0')),
                  "leave a gap (expected begin 0");
}

TEST_F(SafetensorsReject, GapBetweenTensors) {
  expect_rejected(
      safetensors_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[1]", "[8,12]") + "}",
                        std::string(12, '\0')),
      "leave a gap (expected begin 4");
}

TEST_F(SafetensorsReject, OverlappingTensors) {
  expect_rejected(
      safetensors_bytes("{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[1]", "[4,8]") + "}",
                        std::string(8, '\0')),
      "overlap the previous tensor");
}

TEST_F(SafetensorsReject, DataLongerThanTensors) {
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + "}", std::string(6, '\0')),
                  "data must cover the rest of the file exactly");
}

TEST_F(SafetensorsReject, TruncatedData) {
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[4]", "[0,16]") + "}", std::string(10, '\0')),
                  "truncated");
}

TEST_F(SafetensorsReject, DuplicateNames) {
  expect_rejected(
      safetensors_bytes("{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("a", "F32", "[1]", "[4,8]") + "}",
                        std::string(8, '\0')),
      "name 'a' twice");
}

TEST_F(SafetensorsReject, MetadataNotStrings) {
  expect_rejected(safetensors_bytes("{\"__metadata__\":{\"n\":3}}", ""), "must be a string");
  expect_rejected(safetensors_bytes("{\"__metadata__\":[1]}", ""), "__metadata__ must be an object");
}

TEST_F(SafetensorsReject, NumelTimesDtypeSizeOverflows) {
  // 2^62 elements of 4 bytes: numel fits in 64 bits, its byte size does not.
  expect_rejected(safetensors_bytes("{" + entry("a", "F32", "[4611686018427387904]", "[0,0]") + "}", ""), "overflows");
  // numel itself overflows (2^40 x 2^40), whatever the dtype.
  expect_rejected(safetensors_bytes("{" + entry("a", "I32", "[1099511627776,1099511627776]", "[0,0]") + "}", ""),
                  "overflows");
}

TEST_F(SafetensorsReject, KeyTwiceInsideOneEntry) {
  expect_rejected(
      safetensors_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"dtype\":\"I32\",\"data_offsets\":[0,4]}}",
                        std::string(4, '\0')),
      "has the name 'dtype' twice");
}

TEST_F(SafetensorsReject, EntryNotAnObject) {
  expect_rejected(safetensors_bytes("{\"a\":5}", ""), "entry is not an object");
}

TEST(Safetensors, MissingFileNamesIt) {
  try {
    SafetensorsReader r("/nonexistent/dir/model.safetensors");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, EmptyHeaderObjectIsAValidEmptyFile) {
  TempDir dir;
  write_bytes(dir.file("e.safetensors"), safetensors_bytes("{}", ""));
  SafetensorsReader r(dir.file("e.safetensors"));
  EXPECT_TRUE(r.entries().empty());
  // And the writer produces one too.
  write_safetensors(dir.file("w.safetensors"), {});
  EXPECT_TRUE(SafetensorsReader(dir.file("w.safetensors")).entries().empty());
}

// ---- sharded layout ----

std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, Tensor>> ts;
  for (int i = 0; i < 5; ++i) {
    std::vector<float> v(25);
    for (int k = 0; k < 25; ++k) v[static_cast<size_t>(k)] = static_cast<float>(i * 100 + k);
    ts.emplace_back("layer." + std::to_string(i) + ".w", Tensor::from_vector(v, {5, 5}));  // 100 bytes each
  }
  return ts;
}

TEST(SafetensorsSharded, RoundTripThroughIndex) {
  TempDir dir;
  auto ts = sample_tensors();
  // 250-byte shards hold two 100-byte tensors each: 2 + 2 + 1.
  auto paths = write_sharded_safetensors(dir.path(), ts, 250, {{"format", "pt"}});
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0], dir.file("model-00001-of-00003.safetensors"));
  EXPECT_EQ(paths[2], dir.file("model-00003-of-00003.safetensors"));
  auto index = nlohmann::json::parse(read_bytes(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 500u);
  EXPECT_EQ(index["weight_map"]["layer.0.w"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.3.w"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.4.w"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 5u);

  ShardedSafetensorsReader r(dir.file("model.safetensors.index.json"));
  EXPECT_EQ(r.total_size(), 500u);
  EXPECT_EQ(r.shards().size(), 3u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.file_of("layer.2.w"), dir.file("model-00002-of-00003.safetensors"));
  for (const auto& [name, t] : ts) EXPECT_TRUE(same_bytes(r.get(name), t)) << name;
  EXPECT_EQ(r.names().size(), 5u);
  EXPECT_THROW(r.get("layer.9.w"), InvalidArgument);

  // open_safetensors resolves a directory, an index and a plain file.
  auto from_dir = open_safetensors(dir.path());
  EXPECT_TRUE(same_bytes(from_dir->get("layer.4.w"), ts[4].second));
  auto from_index = open_safetensors(dir.file("model.safetensors.index.json"));
  EXPECT_EQ(from_index->names().size(), 5u);
  auto one = open_safetensors(paths[0]);
  EXPECT_EQ(one->names(), (std::vector<std::string>{"layer.0.w", "layer.1.w"}));
}

TEST(SafetensorsSharded, OversizedTensorGetsItsOwnShard) {
  TempDir dir;
  auto ts = sample_tensors();
  auto paths = write_sharded_safetensors(dir.path(), ts, 60, {}, "ckpt");
  EXPECT_EQ(paths.size(), 5u);
  EXPECT_EQ(paths[4], dir.file("ckpt-00005-of-00005.safetensors"));
  ShardedSafetensorsReader r(dir.file("ckpt.safetensors.index.json"));
  for (const auto& [name, t] : ts) EXPECT_TRUE(same_bytes(r.get(name), t)) << name;
}

class ShardedReject : public ::testing::Test {
 protected:
  void SetUp() override { write_sharded_safetensors(dir_.path(), sample_tensors(), 250); }
  void expect_rejected(const std::string& index_text, const std::string& rule) {
    const std::string ip = dir_.file("model.safetensors.index.json");
    write_bytes(ip, index_text);
    try {
      ShardedSafetensorsReader r(ip);
      ADD_FAILURE() << "accepted an index that breaks: " << rule;
    } catch (const FormatError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(ip), std::string::npos) << msg;
      EXPECT_NE(msg.find(rule), std::string::npos) << msg;
    }
  }
  TempDir dir_;
};

TEST_F(ShardedReject, NameMappedToWrongShard) {
  expect_rejected(R"({"weight_map": {"layer.0.w": "model-00002-of-00003.safetensors"}})", "which does not hold it");
}

TEST_F(ShardedReject, ShardTensorMissingFromWeightMap) {
  expect_rejected(R"({"weight_map": {"layer.0.w": "model-00001-of-00003.safetensors"}})",
                  "'layer.1.w' which the weight_map does not list");
}

TEST_F(ShardedReject, MissingShardFile) {
  expect_rejected(R"({"weight_map": {"x": "model-00009-of-00009.safetensors"}})", "does not exist");
}

TEST_F(ShardedReject, PathEscapingTheDirectory) {
  expect_rejected(R"({"weight_map": {"x": "../model-00001-of-00003.safetensors"}})", "must be a file name relative");
}

TEST_F(ShardedReject, AbsoluteOrNonStringFileName) {
  expect_rejected(R"({"weight_map": {"layer.0.w": ")" + dir_.file("model-00001-of-00003.safetensors") + R"("}})",
                  "must be a file name relative");
  expect_rejected(R"({"weight_map": {"layer.0.w": 1}})", "weight_map['layer.0.w'] is not a file name");
  expect_rejected(R"({"weight_map": {"layer.0.w": ""}})", "must be a file name relative");
}

TEST_F(ShardedReject, OneNameInTwoShards) {
  // A fourth shard that also holds layer.0.w, listed in the map for another tensor.
  write_safetensors(dir_.file("extra.safetensors"),
                    {{"layer.0.w", Tensor::from_vector(std::vector<float>(25, 1.f), {5, 5})},
                     {"extra.w", Tensor::from_vector({1.f}, {1})}});
  std::string map;
  for (int i = 0; i < 5; ++i)
    map +=
        "\"layer." + std::to_string(i) + ".w\": \"model-0000" + std::to_string(i / 2 + 1) + "-of-00003.safetensors\", ";
  expect_rejected("{\"weight_map\": {" + map + "\"extra.w\": \"extra.safetensors\"}}", "tensor 'layer.0.w' is in both");
}

TEST_F(ShardedReject, NoWeightMapOrBadTotal) {
  expect_rejected(R"({"metadata": {}})", "no \"weight_map\"");
  expect_rejected(R"({"metadata": {"total_size": -5}, "weight_map": {}})", "total_size");
  expect_rejected(R"({"weight_map": {}, "weight_map": {}})", "twice");
}

TEST_F(ShardedReject, MalformedShardNamesTheShard) {
  write_bytes(dir_.file("model-00002-of-00003.safetensors"), "garbage!!");
  try {
    ShardedSafetensorsReader r(dir_.file("model.safetensors.index.json"));
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00003.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::parallel::checkpoint
