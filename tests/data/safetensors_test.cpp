#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "stableflash/data/safetensors.hpp"
#include "test_files.hpp"

namespace stableflash::data {
namespace {

using stableflash::testing::expect_error_mentions;
using stableflash::testing::read_bytes;
using stableflash::testing::ScratchDir;
using stableflash::testing::write_bytes;

std::vector<unsigned char> file_with_header(const std::string& json, std::size_t data_bytes) {
  std::vector<unsigned char> b(8 + json.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(std::uint64_t(json.size()) >> (8 * i));
  std::copy(json.begin(), json.end(), b.begin() + 8);
  return b;
}

TEST(Safetensors, RoundTripKeepsDtypesShapesValuesAndMetadata) {
  ScratchDir dir;
  SafetensorsFile f;
  const std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -1e-30f};
  const std::vector<std::uint16_t> b{0x3f80, 0xbf80};
  f.tensors["a"] = Tensor::from<float>(DType::f32, {2, 3}, a);
  f.tensors["b"] = Tensor::from<std::uint16_t>(DType::bf16, {2}, b);
  f.metadata["note"] = "x";
  f.write(dir.file("t.safetensors"));
  const SafetensorsFile g = SafetensorsFile::read(dir.file("t.safetensors"));
  ASSERT_EQ(g.tensors.size(), 2u);
  EXPECT_EQ(g.find("a")->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(g.find("b")->dtype, DType::bf16);
  const auto av = g.find("a")->as<float>();
  EXPECT_TRUE(std::equal(av.begin(), av.end(), a.begin(), a.end()));
  EXPECT_EQ(g.find("b")->as<std::uint16_t>()[1], 0xbf80);
  EXPECT_EQ(g.metadata.at("note"), "x");
  // the header is padded so the data starts 8-byte aligned, as the reference writer does
  const auto bytes = read_bytes(dir.file("t.safetensors"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, CorruptFilesAreRefusedNamingTheProblem) {
  ScratchDir dir;
  const std::string p = dir.file("bad.safetensors");
  write_bytes(p, {1, 2, 3});
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {p, "too short"});
  write_bytes(p, file_with_header("{not json", 0));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {p, "not valid JSON"});
  write_bytes(p, file_with_header(R"({"q":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {"'q'", "outside"});
  write_bytes(p, file_with_header(R"({"q":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {"'q'", "needs 12"});
  write_bytes(p, file_with_header(R"({"q":{"dtype":"X9","shape":[1],"data_offsets":[0,1]}})", 1));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {"'q'", "unknown dtype"});
  write_bytes(p, file_with_header(
                     R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {"overlap"});
  std::vector<unsigned char> huge(16, 0xff);
  write_bytes(p, huge);
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {"header length"});
}

TEST(Safetensors, SizesThatOverflowAreRefused) {
  ScratchDir dir;
  const std::string p = dir.file("big.safetensors");
  // 2^63 is no int64: it used to come back as a negative dimension
  write_bytes(p, file_with_header(R"({"q":{"dtype":"U8","shape":[9223372036854775808,0],"data_offsets":[0,0]}})", 0));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {p, "'q'", "dimension 9223372036854775808", "2^63-1"});
  // 2^32 * 2^32 * 2 elements * 4 bytes wraps to 0 in 64 bits: it used to match an empty range
  write_bytes(p, file_with_header(R"({"q":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}})", 0));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {p, "'q'", "more than 2^64 bytes"});
  // a zero dimension makes any shape empty, however large the others: valid
  write_bytes(p, file_with_header(R"({"q":{"dtype":"F32","shape":[4611686018427387904,0,4611686018427387904],"data_offsets":[0,0]}})", 0));
  EXPECT_EQ(SafetensorsFile::read(p).find("q")->elements(), 0);
}

TEST(Safetensors, EveryDataByteBelongsToATensor) {
  ScratchDir dir;
  const std::string p = dir.file("t.safetensors");
  write_bytes(p, file_with_header(R"({"q":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
  EXPECT_NO_THROW(SafetensorsFile::read(p));
  write_bytes(p, file_with_header(R"({"q":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 11));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {p, "3 trailing bytes"});
  write_bytes(p, file_with_header(R"({"q":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  expect_error_mentions([&] { SafetensorsFile::read(p); }, {p, "bytes [0, 4)", "no tensor"});
}

TEST(Safetensors, AFolderOrAMissingFileIsNamedWithTheReason) {
  ScratchDir dir;
  expect_error_mentions([&] { SafetensorsFile::read(dir.file("")); }, {dir.file(""), "is a folder"});
  expect_error_mentions([&] { SafetensorsFile::read(dir.file("no.safetensors")); }, {"no.safetensors", "No such file or directory"});
}

TEST(Safetensors, NonFiniteValuesAreCountedPerDtype) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> f32{1, inf, -inf, nan, 3.4e38f, -0.0f};
  EXPECT_EQ(count_non_finite(Tensor::from<float>(DType::f32, {6}, f32)), 3);
  const std::vector<double> f64{1e308, -std::numeric_limits<double>::infinity(), std::nan("")};
  EXPECT_EQ(count_non_finite(Tensor::from<double>(DType::f64, {3}, f64)), 2);
  // BF16: +Inf 0x7f80, -Inf 0xff80, a NaN 0x7fc1; 0x7f7f is the largest finite value
  const std::vector<std::uint16_t> b16{0x7f80, 0xff80, 0x7fc1, 0x7f7f, 0x3f80};
  EXPECT_EQ(count_non_finite(Tensor::from<std::uint16_t>(DType::bf16, {5}, b16)), 3);
  // F16: +Inf 0x7c00, a NaN 0xfe00; 0x7bff is 65504, the largest finite value
  const std::vector<std::uint16_t> h16{0x7c00, 0xfe00, 0x7bff};
  EXPECT_EQ(count_non_finite(Tensor::from<std::uint16_t>(DType::f16, {3}, h16)), 2);
  EXPECT_EQ(count_non_finite(Tensor::from<std::uint16_t>(DType::u16, {3}, h16)), 0);
}

TEST(Safetensors, FailedWriteLeavesThePreviousFileIntact) {
  ScratchDir dir;
  SafetensorsFile good;
  const std::vector<float> x{1, 2, 3};
  good.tensors["x"] = Tensor::from<float>(DType::f32, {3}, x);
  good.write(dir.file("m.safetensors"));
  const auto before = read_bytes(dir.file("m.safetensors"));
  SafetensorsFile broken;
  broken.tensors["x"] = Tensor{DType::f32, {4}, std::vector<std::byte>(12)};  // 12 bytes for 4 floats
  EXPECT_THROW(broken.write(dir.file("m.safetensors")), std::invalid_argument);
  EXPECT_EQ(read_bytes(dir.file("m.safetensors")), before);
}

}  // namespace
}  // namespace stableflash::data
