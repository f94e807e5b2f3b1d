// prepare -> loader round trip: the shards hold, in order, <|endoftext|> + the tokens of each
// document of its split; the same bytes whatever the thread count; errors name the input.
#include <gtest/gtest.h>
#include <zstd.h>

#include <filesystem>

#include "stableflash/data/documents.hpp"
#include "stableflash/data/prepare.hpp"
#include "stableflash/data/shards.hpp"
#include "test_files.hpp"
#include "tokenizer_helpers.hpp"

namespace stableflash::testing {
namespace {

namespace fs = std::filesystem;
using data::PrepareOptions;

void write_text(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

void write_zst(const std::string& path, const std::string& text) {
  std::string buf(ZSTD_compressBound(text.size()), '\0');
  const std::size_t n = ZSTD_compress(buf.data(), buf.size(), text.data(), text.size(), 3);
  ASSERT_FALSE(ZSTD_isError(n));
  buf.resize(n);
  write_text(path, buf);
}

std::string jsonl(const std::vector<std::string>& docs) {
  std::string s;
  for (const auto& d : docs) s += nlohmann::json{{"text", d}, {"id", 1}}.dump() + "\n\n";  // blank lines are skipped
  return s;
}

// A corpus of every input kind, and the documents it holds in order.
struct Corpus {
  std::vector<std::string> inputs, docs;
};

Corpus make_corpus(const ScratchDir& dir) {
  SplitMix64 rng(17);
  Corpus c;
  auto doc = [&](std::size_t pieces) { return random_mixed_text(rng, pieces); };
  std::vector<std::string> d;
  for (int i = 0; i < 6; ++i) d.push_back(doc(50 + i * 30));
  write_text(dir.file("in/a.txt"), d[0]);
  write_text(dir.file("in/sub/b.txt"), d[1]);
  write_text(dir.file("in/.hidden.txt"), "never read");
  write_zst(dir.file("in/sub/c.txt.zst"), d[2]);
  const std::vector<std::string> lines = {d[3], d[4], "", "<|endoftext|> as text", d[5]};
  write_text(dir.file("more.jsonl"), jsonl({lines[0], lines[1]}));
  write_zst(dir.file("more2.jsonl.zst"), jsonl({lines[2], lines[3], lines[4]}));
  // A document long enough to be cut into chunks and encoded in parallel.
  std::string big;
  while (big.size() < (5u << 19)) big += doc(40) + ".\nNext line " + std::to_string(big.size()) + "\n";
  write_text(dir.file("big.txt"), big);
  c.inputs = {dir.file("in"), dir.file("more.jsonl"), dir.file("more2.jsonl.zst"), dir.file("big.txt")};
  c.docs = {d[0], d[1], d[2], lines[0], lines[1], lines[2], lines[3], lines[4], big};  // folder in path order
  return c;
}

std::vector<std::uint16_t> read_split(const std::string& dir, const std::string& split) {
  std::vector<std::uint16_t> all;
  for (const auto& p : data::list_shards(dir, split)) {
    const auto s = data::Shard::open(p);
    all.insert(all.end(), s.tokens().begin(), s.tokens().end());
  }
  return all;
}

TEST(Prepare, ShardsHoldEachDocumentOfItsSplitInOrder) {
  ScratchDir dir;
  const Corpus c = make_corpus(dir);
  PrepareOptions o;
  o.inputs = c.inputs, o.out_dir = dir.file("out"), o.val_fraction = 0.3, o.shard_tokens = 100000, o.threads = 2, o.seed = 4;
  const auto sum = data::prepare_shards(gpt2(), o);

  std::vector<std::uint32_t> expect_train, expect_val;
  Gpt2Encoder enc(gpt2());
  std::size_t n_val = 0;
  for (std::size_t i = 0; i < c.docs.size(); ++i) {
    const bool val = data::is_val_document(o.seed, i, o.val_fraction);
    auto& dst = val ? expect_val : expect_train;
    n_val += val;
    dst.push_back(data::kEndOfText);
    enc.encode(c.docs[i], dst);  // the whole document at once, no parallel cuts
  }
  ASSERT_GT(n_val, 0u) << "seed 4 should put some document in val; pick another seed";
  ASSERT_LT(n_val, c.docs.size());
  const auto train = read_split(o.out_dir, "train"), val = read_split(o.out_dir, "val");
  EXPECT_EQ(std::vector<std::uint32_t>(train.begin(), train.end()), expect_train);
  EXPECT_EQ(std::vector<std::uint32_t>(val.begin(), val.end()), expect_val);
  EXPECT_EQ(sum.totals.documents, c.docs.size());
  EXPECT_EQ(sum.train_tokens + sum.val_tokens, sum.totals.tokens);
  EXPECT_EQ(sum.train_tokens, train.size());
  EXPECT_EQ(sum.val_documents, n_val);

  // Every shard but the last of a split is full, and the trainer's loader takes them.
  const auto shards = data::list_shards(o.out_dir, "train");
  ASSERT_EQ(shards.size(), (train.size() + 99999) / 100000);
  for (std::size_t i = 0; i + 1 < shards.size(); ++i) EXPECT_EQ(data::Shard::open(shards[i]).tokens().size(), 100000u);
  EXPECT_EQ(fs::path(shards[0]).filename(), "train_000000.bin");
  data::ShardSet set(shards);
  SplitMix64 rng(1);
  const auto w = set.sample(rng, 64);
  EXPECT_EQ(set.window(w, 64).size(), 64u);
  EXPECT_TRUE(fs::exists(o.out_dir + "/prepare.json"));
}

TEST(Prepare, SameBytesForAnyThreadCountAndRefusesToMixRuns) {
  ScratchDir dir;
  const Corpus c = make_corpus(dir);
  auto run = [&](const std::string& out, int threads) {
    PrepareOptions o;
    o.inputs = c.inputs, o.out_dir = dir.file(out), o.shard_tokens = 200000, o.threads = threads, o.val_fraction = 0.3;
    data::prepare_shards(gpt2(), o);
    std::vector<std::vector<unsigned char>> files;
    for (const auto& split : {"train", "val"})
      for (const auto& p : data::list_shards(o.out_dir, split)) files.push_back(read_bytes(p));
    files.push_back(read_bytes(o.out_dir + "/prepare.json"));
    return files;
  };
  const auto one = run("one", 1), three = run("three", 3);
  EXPECT_EQ(one, three);

  PrepareOptions o;
  o.inputs = c.inputs, o.out_dir = dir.file("one");
  expect_error_mentions([&] { data::prepare_shards(gpt2(), o); }, {"one", "already holds", "--overwrite"});
  o.overwrite = true, o.shard_tokens = 1u << 30;  // one shard now: the old numbered ones must be gone
  data::prepare_shards(gpt2(), o);
  EXPECT_EQ(data::list_shards(o.out_dir, "train").size(), 1u);
}

TEST(Prepare, BadInputsAreNamed) {
  ScratchDir dir;
  PrepareOptions o;
  o.out_dir = dir.file("out");
  o.inputs = {dir.file("missing.txt")};
  expect_error_mentions([&] { data::prepare_shards(gpt2(), o); }, {"missing.txt", "no such file"});
  write_text(dir.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"txt\": \"no text field\"}\n");
  o.inputs = {dir.file("bad.jsonl")};
  expect_error_mentions([&] { data::prepare_shards(gpt2(), o); }, {"bad.jsonl:2", "\"text\""});
  write_text(dir.file("broken.jsonl"), "{\"text\": \"ok\"}\n{not json\n");
  o.inputs = {dir.file("broken.jsonl")};
  expect_error_mentions([&] { data::prepare_shards(gpt2(), o); }, {"broken.jsonl:2", "not a JSON line"});
  SplitMix64 rng(1);
  write_zst(dir.file("cut.txt.zst"), std::string(100000, 'x') + random_mixed_text(rng, 3000));
  auto bytes = read_bytes(dir.file("cut.txt.zst"));
  bytes.resize(bytes.size() / 2);
  write_bytes(dir.file("cut.txt.zst"), bytes);
  o.inputs = {dir.file("cut.txt.zst")};
  expect_error_mentions([&] { data::prepare_shards(gpt2(), o); }, {"cut.txt.zst", "truncated zstd"});
  write_text(dir.file("junk.txt.zst"), "this is not zstd at all");
  o.inputs = {dir.file("junk.txt.zst")};
  expect_error_mentions([&] { data::prepare_shards(gpt2(), o); }, {"junk.txt.zst", "not a valid zstd"});
  o.inputs = {dir.file("bad.jsonl")}, o.val_fraction = 1.5;
  expect_error_mentions([&] { data::prepare_shards(gpt2(), o); }, {"--val-fraction"});
}

}  // namespace
}  // namespace stableflash::testing
