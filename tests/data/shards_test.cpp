#include <gtest/gtest.h>

#include <set>

#include "stableflash/data/shards.hpp"
#include "test_files.hpp"

namespace stableflash::data {
namespace {

using stableflash::testing::expect_error_mentions;
using stableflash::testing::read_bytes;
using stableflash::testing::ScratchDir;
using stableflash::testing::write_bytes;

std::vector<std::uint16_t> iota_tokens(std::size_t n, std::uint16_t start) {
  std::vector<std::uint16_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint16_t>(start + i);
  return t;
}

TEST(Shards, WriteThenReadRoundTripsInLlmcLayout) {
  ScratchDir dir;
  const auto tokens = iota_tokens(1000, 50000);  // values above 2^15 check unsigned handling
  write_shard(dir.file("train_000000.bin"), tokens);
  const auto bytes = read_bytes(dir.file("train_000000.bin"));
  ASSERT_EQ(bytes.size(), 1024 + 2 * tokens.size());
  EXPECT_EQ(bytes[0] | bytes[1] << 8 | bytes[2] << 16 | bytes[3] << 24, 20240520);
  EXPECT_EQ(bytes[4], 1);
  EXPECT_EQ(bytes[8] | bytes[9] << 8, 1000);
  const Shard s = Shard::open(dir.file("train_000000.bin"), kAnyTokenId);
  EXPECT_TRUE(std::equal(s.tokens().begin(), s.tokens().end(), tokens.begin(), tokens.end()));
}

TEST(Shards, CorruptShardsAreRefusedWithTheReason) {
  ScratchDir dir;
  const std::string p = dir.file("train_000000.bin");
  write_shard(p, iota_tokens(100, 0));
  auto good = read_bytes(p);

  write_bytes(p, std::vector<unsigned char>(good.begin(), good.begin() + 100));
  expect_error_mentions([&] { Shard::open(p); }, {p, "short header"});
  auto bad_magic = good;
  bad_magic[0] ^= 1;
  write_bytes(p, bad_magic);
  expect_error_mentions([&] { Shard::open(p); }, {p, "bad magic"});
  auto bad_version = good;
  bad_version[4] = 7;
  write_bytes(p, bad_version);
  expect_error_mentions([&] { Shard::open(p); }, {p, "version 7"});
  write_bytes(p, std::vector<unsigned char>(good.begin(), good.end() - 10));
  expect_error_mentions([&] { Shard::open(p); }, {p, "truncated"});
  auto odd = good;
  odd.push_back(0);
  write_bytes(p, odd);
  expect_error_mentions([&] { Shard::open(p); }, {p, "odd byte count"});
}

TEST(Shards, TokenIdsOutsideTheVocabularyAreRefusedAtOpenWithFileAndOffset) {
  ScratchDir dir;
  const std::string p = dir.file("train_000000.bin");
  auto tokens = iota_tokens(100, 0);
  tokens[37] = 50257;  // GPT-2's first padding row: silently trained before the check
  tokens[90] = 60000;
  write_shard(p, tokens);
  expect_error_mentions([&] { Shard::open(p); }, {p, "token id 50257", "offset 37", "byte 1098", "2 of its 100"});
  expect_error_mentions([&] { ShardSet({p}); }, {p, "offset 37"});
  EXPECT_EQ(Shard::open(p, kAnyTokenId).tokens()[90], 60000);
  // a smaller model's vocabulary is the bound it passes: id 99 is its last valid one
  tokens = iota_tokens(100, 0);
  write_shard(p, tokens);
  EXPECT_EQ(ShardSet({p}, 100).total_tokens(), 100u);
  expect_error_mentions([&] { ShardSet({p}, 99); }, {p, "token id 99", "offset 99", "(0..98)"});
}

TEST(Shards, AFolderOrAMissingFileIsNamedWithTheReason) {
  ScratchDir dir;
  expect_error_mentions([&] { Shard::open(dir.file("")); }, {dir.file(""), "is a folder"});
  expect_error_mentions([&] { Shard::open(dir.file("nope.bin")); }, {dir.file("nope.bin"), "No such file or directory"});
}

TEST(Shards, SamplingIsReproducibleUniformAndStaysInsideShards) {
  ScratchDir dir;
  write_shard(dir.file("train_000000.bin"), iota_tokens(10, 0));
  write_shard(dir.file("train_000001.bin"), iota_tokens(3, 100));  // shorter than a window: never drawn
  write_shard(dir.file("train_000002.bin"), iota_tokens(6, 200));
  write_shard(dir.file("val_000000.bin"), iota_tokens(6, 300));
  const auto paths = list_shards(dir.file(""), "train");
  ASSERT_EQ(paths.size(), 3u);
  const ShardSet set(paths);
  const std::size_t len = 5;
  EXPECT_EQ(set.window_count(len), 6u + 2u);
  SplitMix64 a(42), b(42);
  std::vector<int> hits(8, 0);
  const int draws = 80000;
  for (int n = 0; n < draws; ++n) {
    const WindowStart w = set.sample(a, len);
    ASSERT_EQ(w, set.sample(b, len));
    ASSERT_NE(w.shard, 1u);
    const auto t = set.window(w, len);
    ASSERT_EQ(t.size(), len);
    ++hits[w.shard == 0 ? w.offset : 6 + w.offset];
  }
  // each of the 8 windows has probability 1/8: binomial sd = sqrt(n p (1-p)); allow 6 sd
  const double expect = draws / 8.0, sd = std::sqrt(draws * (1.0 / 8) * (7.0 / 8));
  for (int h : hits) EXPECT_NEAR(h, expect, 6 * sd);
  expect_error_mentions([&] { set.window({2, 4}, len); }, {"train_000002.bin", "runs past"});
  expect_error_mentions([&] { set.sample(a, 11); }, {"no shard holds"});
}

}  // namespace
}  // namespace stableflash::data
