// The tokenizer on its own: documented anchors, round trips, the byte mapping, ranks-file
// validation, UTF-8 validation and the parallel cut points. Exactness against tiktoken is in
// tokenizer_peer_test.cpp.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fstream>
#include <iterator>
#include <set>

#include "test_files.hpp"
#include "tokenizer_helpers.hpp"

namespace stableflash::testing {
namespace {

using Ids = std::vector<std::uint32_t>;

TEST(Tokenizer, DocumentedAnchors) {
  // From the issue (and GPT-2's vocabulary as published): the only hard-coded ids in the tests.
  Gpt2Encoder enc(gpt2());
  EXPECT_EQ(enc.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(enc.encode(" the"), (Ids{262}));
  EXPECT_EQ(gpt2()->token_bytes(data::kEndOfText), "<|endoftext|>");
  EXPECT_EQ(gpt2()->decode(Ids{15496, 995, data::kEndOfText}), "Hello world<|endoftext|>");
  EXPECT_TRUE(enc.encode("").empty());
}

// docs/tokenizer.md tells users where we differ from tiktoken (PCRE2's Unicode tables) with this
// example. With Unicode 14 tables it must split as documented; with newer tables it must match
// tiktoken's split, and the documentation is then stale: this test says so.
TEST(Tokenizer, UnicodeVersionDifferenceIsTheDocumentedOne) {
  char version[32] = {};
  ASSERT_GT(pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version), 0);
  const std::string text = utf8(U'\U00031350') + "'s";  // CJK Extension H, assigned in Unicode 15
  const Ids ours{172, 109, 235, 238, 6, 82}, tiktoken{172, 109, 235, 238, 338};  // tiktoken 0.14.0
  const Ids got = Gpt2Encoder(gpt2()).encode(text);
  if (std::string(version) < "15") {
    EXPECT_EQ(got, ours) << "PCRE2 Unicode " << version;
  } else {
    EXPECT_EQ(got, tiktoken) << "PCRE2 Unicode " << version;
    ADD_FAILURE() << "PCRE2 now knows Unicode " << version << ": update docs/tokenizer.md's known difference";
  }
  EXPECT_EQ(gpt2()->decode(got), text);
  std::ifstream doc(std::string(STABLEFLASH_SOURCE_DIR) + "/docs/tokenizer.md");
  const std::string md{std::istreambuf_iterator<char>(doc), std::istreambuf_iterator<char>()};
  EXPECT_NE(md.find("`[172, 109, 235, 238, 6, 82]` here and `[172, 109, 235, 238, 338]` in tiktoken"), std::string::npos)
      << "docs/tokenizer.md no longer shows the example users are told about";
}

TEST(Tokenizer, EndOfTextInTheInputIsOrdinaryText) {
  Gpt2Encoder enc(gpt2());
  const Ids ids = enc.encode("a<|endoftext|>b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), data::kEndOfText), 0);
  EXPECT_EQ(gpt2()->decode(ids), "a<|endoftext|>b");
}

TEST(Tokenizer, DecodeOfEncodeIsIdentityForValidUtf8) {
  Gpt2Encoder enc(gpt2());
  SplitMix64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const std::string s = random_mixed_text(rng, rng.next() % 40);
    const Ids ids = enc.encode(s);
    ASSERT_EQ(gpt2()->decode(ids), s) << "case " << i;
    for (auto id : ids) ASSERT_LT(id, data::kEndOfText);
  }
}

TEST(Tokenizer, InvalidBytesSurviveTheRoundTrip) {
  Gpt2Encoder enc(gpt2());
  SplitMix64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    std::string s = random_mixed_text(rng, rng.next() % 12);
    for (int k = int(rng.next() % 4); k >= 0; --k) s.insert(rng.next() % (s.size() + 1), 1, char(0x80 + rng.next() % 128));
    ASSERT_EQ(gpt2()->decode(enc.encode(s)), s) << "case " << i;
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  EXPECT_EQ(gpt2()->decode(enc.encode(all)), all);
}

TEST(Tokenizer, EncoderStateDoesNotLeakBetweenCalls) {
  // The piece cache must give what a fresh encoder gives, in any order.
  SplitMix64 rng(3);
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back(random_mixed_text(rng, 30));
  Gpt2Encoder warm(gpt2());
  for (const auto& t : texts) warm.encode(t);
  for (const auto& t : texts) ASSERT_EQ(warm.encode(t), Gpt2Encoder(gpt2()).encode(t));
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  expect_error_mentions([] { gpt2()->decode(Ids{1, 50257}); }, {"50257", "not in GPT-2's vocabulary"});
}

TEST(Tokenizer, ByteToUnicodeIsGpt2sPrintableBijection) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t u = data::gpt2_byte_to_unicode(std::uint8_t(b));
    EXPECT_TRUE(seen.insert(u).second) << "byte " << b << " collides";
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) EXPECT_EQ(u, char32_t(b));
    else EXPECT_TRUE(u >= 0x100 && u < 0x100 + 68) << "byte " << b;
  }
  // GPT-2's encoder.json writes " the" as "Ġthe" (U+0120) and "\n" as "Ċ" (U+010A).
  EXPECT_EQ(data::gpt2_visible_token(" the"), "\u0120the");
  EXPECT_EQ(data::gpt2_visible_token("\n"), "\u010a");
}

TEST(Tokenizer, Utf8ValidPrefixFollowsRfc3629) {
  using data::utf8_valid_prefix;
  EXPECT_EQ(utf8_valid_prefix("plain ascii text, long enough for the word loop"), 47u);
  EXPECT_EQ(utf8_valid_prefix("a\xC3\xA9z"), 4u);            // é
  EXPECT_EQ(utf8_valid_prefix("ab\xC0\xAF"), 2u);            // overlong '/'
  EXPECT_EQ(utf8_valid_prefix("ab\xE0\x80\xAF"), 2u);        // overlong, 3 bytes
  EXPECT_EQ(utf8_valid_prefix("ab\xED\xA0\x80"), 2u);        // surrogate U+D800
  EXPECT_EQ(utf8_valid_prefix("ab\xF4\x90\x80\x80"), 2u);    // above U+10FFFF
  EXPECT_EQ(utf8_valid_prefix("ab\xF0\x9F\x91"), 2u);        // truncated 👍
  EXPECT_EQ(utf8_valid_prefix("\x80"), 0u);                  // lone continuation
  EXPECT_EQ(utf8_valid_prefix("\xF0\x9F\x91\x8D\xFF"), 4u);  // 👍 then 0xFF
  EXPECT_EQ(utf8_valid_prefix("12345678\xE2\x82\xAC\xFE"), 11u);
}

TEST(Tokenizer, ParallelCutsGiveTheTokensOfTheWholeText) {
  SplitMix64 rng(5);
  std::string text;
  // Whitespace before the '\n' is the trap: "  \nA" must not become a chunk ending in "  \n".
  const char* joints[] = {"\nA", "  \nB", ".\nc", " \n\nd", "\r\ne", "x\nY", "\t\nz", "é\nq"};
  while (text.size() < 400000) text += random_mixed_text(rng, 20) + joints[rng.next() % 8];
  const auto cuts = data::parallel_cut_points(text, 4096);
  ASSERT_GT(cuts.size(), 10u);
  Gpt2Encoder enc(gpt2());
  const Ids whole = enc.encode(text);
  Ids pieces;
  std::size_t begin = 0;
  for (const auto c : cuts) {
    ASSERT_GT(c, begin);
    enc.encode(std::string_view(text).substr(begin, c - begin), pieces);
    begin = c;
  }
  enc.encode(std::string_view(text).substr(begin), pieces);
  EXPECT_EQ(pieces, whole);
}

TEST(Tokenizer, RanksFileErrorsNameTheFileAndLine) {
  ScratchDir dir;
  const std::string good = gpt2()->ranks_path();
  std::ifstream in(good);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), data::kGpt2MergeableRanks);
  auto write = [&](const std::string& name, const std::vector<std::string>& ls) {
    std::ofstream out(dir.file(name));
    for (const auto& l : ls) out << l << '\n';
    return dir.file(name);
  };
  auto edited = lines;
  edited[2] = "!!!! 2";
  expect_error_mentions([&] { Gpt2Tokenizer::load(write("b64", edited)); }, {"b64:3", "bad base64"});
  edited = lines;
  edited[5] = lines[5].substr(0, lines[5].find(' ')) + " 4";
  expect_error_mentions([&] { Gpt2Tokenizer::load(write("dup", edited)); }, {"dup:6", "appears twice"});
  edited = lines;
  edited.pop_back();
  expect_error_mentions([&] { Gpt2Tokenizer::load(write("short", edited)); }, {"short", "holds 50255 ranks"});
  edited = lines;
  edited[9] = lines[9].substr(0, lines[9].find(' ')) + " 9x";
  expect_error_mentions([&] { Gpt2Tokenizer::load(write("rank", edited)); }, {"rank:10", "bad rank '9x'"});
  expect_error_mentions([&] { Gpt2Tokenizer::load(dir.file("absent")); }, {"absent", "cannot open"});
  expect_error_mentions([&] { data::resolve_gpt2_ranks_path(dir.file("nowhere")); }, {"nowhere", "--ranks", "setup-deps.sh"});
}

}  // namespace
}  // namespace stableflash::testing
