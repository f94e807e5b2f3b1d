// Exactness against the peer: token ids identical to tiktoken (tests/peers/tiktoken_peer.py's
// semantics) on adversarial strings, every code point PCRE2's Unicode tables assign, and
// multi-megabyte texts the tokenizer was not developed on.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "tokenizer_helpers.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace stableflash::testing {
namespace {

using Ids = std::vector<std::uint32_t>;

// Compares our ids with tiktoken's for each input; reports the first few mismatches readably.
void expect_same_as_tiktoken(const std::vector<std::string>& inputs, const std::vector<std::string>& names) {
  SF_TIKTOKEN_OR_SKIP(peer, inputs);
  Gpt2Encoder enc(gpt2());
  int shown = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Ids ours = enc.encode(inputs[i]);
    const Ids& theirs = (*peer)[i];
    if (ours == theirs) continue;
    const auto [a, b] = std::mismatch(ours.begin(), ours.end(), theirs.begin(), theirs.end());
    const std::size_t at = std::size_t(a - ours.begin());
    ADD_FAILURE() << names[i] << ": tokens differ from tiktoken at token " << at << " of " << ours.size() << " (tiktoken: "
                  << theirs.size() << "); ours " << (a == ours.end() ? std::string("<end>") : std::to_string(*a)) << " '"
                  << (a == ours.end() ? "" : gpt2()->token_bytes(*a)) << "', tiktoken "
                  << (b == theirs.end() ? std::string("<end>") : std::to_string(*b)) << " '"
                  << (b == theirs.end() ? "" : gpt2()->token_bytes(*b)) << "'";
    if (++shown == 5) break;
  }
}

std::vector<std::string> numbered(const std::string& what, std::size_t n) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(what + " #" + std::to_string(i));
  return v;
}

TEST(TokenizerPeer, AdversarialStrings) {
  std::vector<std::string> in = {
      "Hello world", " the", "", " ", "\n", "\r\n", "a\r\nb\r\n\r\n", "  leading", "trailing  ", "a  b   c    d",
      std::string(1000, ' ') + "x", std::string(100000, ' ') + "x" + std::string(100000, '\n') + "y", std::string(5000, ' '),
      std::string(777, '\n') + "y", "\t \t \n \r\n  \u00a0\u3000x",
      "don't I'm we'll they've she'd it's DON'T I'M 'S 'Re 'll'll 're've", "’s ’t curly", "''''''' ''s",
      "1234567890 123 4567 12.5 1,000,000 3.14159e-10 0x1F ½ ² ٣٤٥ ௫ Ⅻ 〇", std::string(300, '7'),
      "<|endoftext|>", "a<|endoftext|>b <|endoftext|> <|endo", "e\u0301 a\u0300\u0316 Z\u0351\u0352\u0357\u035b\u0346",
      "👍 👍🏽 👨\u200d👩\u200d👧\u200d👦 🇫🇷🇩🇪 🏳\ufe0f\u200d🌈 🤖🤖🤖", "mixed世界hello мир123 العربية-text",
      "\u200b\u200c\u200d\ufeff\u2060", "\u0085\u2028\u2029\u000b\u000c\u001c\u001d\u001e\u001f", "a\u0085b \u0085 x",
      "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈𐌰 \U0002A6D6\U00030000", "\U000E0001\U000E0041\U000F0000\U0010FFFD",
      std::string(200, 'a'), "aGVsbG8gd29ybGQhIHRoaXMgaXMgYmFzZTY0IGVuY29kZWQgdGV4dA==" + std::string(150, 'Z'),
      "http://example.com/path?q=1&r=2#frag", "snake_case camelCase kebab-case SCREAMING_CASE", "....!!!?\?\?---___",
      // Not UTF-8: tiktoken's byte-level rule (the rest after the first bad byte is one piece).
      "\xff", "\x80", "abc\xff", "\xff" "abc def", "hello \xff world", "hello  \n\n \xff world", "a\xe2\x82", "\xe2\x82 x",
      "x\n\n\xff", "\xc0\xaf overlong", "\xed\xa0\x80 surrogate", "\xf4\x90\x80\x80 big", "ok \xf0\x9f\x91", "\xfe\xfe\xfe\xfe",
      "tab\t\t\xc3", "  \t\n\x80 after spaces", "words then " + std::string(300, 'q') + "\xff" + std::string(300, ' ') + "end"};
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += char(b);
  in.push_back(all_bytes);
  for (int b = 0x80; b < 0x100; ++b) in.push_back(std::string("x ") + char(b) + " y");
  expect_same_as_tiktoken(in, numbered("adversarial", in.size()));
}

TEST(TokenizerPeer, RandomMixtures) {
  SplitMix64 rng(2024);
  std::vector<std::string> in;
  for (int i = 0; i < 3000; ++i) {
    std::string s = random_mixed_text(rng, 1 + rng.next() % 30);
    if (i % 5 == 0) s.insert(rng.next() % (s.size() + 1), 1, char(0x80 + rng.next() % 128));  // some not UTF-8
    in.push_back(s);
  }
  expect_same_as_tiktoken(in, numbered("mixture", in.size()));
}

// Every code point PCRE2's tables assign (so: Unicode 14 with PCRE2 10.42), in every plane, in
// contexts that exercise each alternative of the pattern. Unassigned ones are left out: tiktoken's
// regex knows a newer Unicode, and docs/tokenizer.md documents that difference.
TEST(TokenizerPeer, EveryCodePointOurUnicodeTablesAssign) {
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* cn = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("^\\p{Cn}$"), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  ASSERT_NE(cn, nullptr);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(cn, nullptr);
  std::vector<std::string> in(17);  // one input per plane
  std::size_t assigned = 0;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const std::string u = utf8(c);
    if (pcre2_match(cn, reinterpret_cast<PCRE2_SPTR>(u.data()), u.size(), 0, 0, md, nullptr) >= 0) continue;
    ++assigned;
    in[c >> 16] += "a" + u + "b " + u + "1 x" + u + u + " " + u + "'s\n";
  }
  pcre2_match_data_free(md);
  pcre2_code_free(cn);
  EXPECT_GE(assigned, 282230u) << "PCRE2 assigns fewer code points than Unicode 14 does";  // 14.0: 282,230 not Cn
  std::vector<std::string> names;
  for (int p = 0; p < 17; ++p) names.push_back("plane " + std::to_string(p) + " (" + std::to_string(in[p].size()) + " bytes)");
  expect_same_as_tiktoken(in, names);
}

// Multi-megabyte texts that played no part in developing the tokenizer: the machine's own
// licence and copyright texts (real English with names in many scripts), and text made of random
// GPT-2 tokens (every corner of the vocabulary, whitespace and punctuation mixed in).
TEST(TokenizerPeer, HeldOutMegabyteTexts) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const char* dir : {"/usr/share/common-licenses", "/usr/share/doc"})
    if (fs::is_directory(dir))
      for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied); it != fs::recursive_directory_iterator(); ++it)
        if (it->is_regular_file() && (std::string(dir) == "/usr/share/common-licenses" || it->path().filename() == "copyright"))
          files.push_back(it->path());
  std::sort(files.begin(), files.end());
  std::string system_text;
  for (const auto& f : files) {
    if (system_text.size() > (6u << 20)) break;
    std::ifstream in(f, std::ios::binary);
    const std::string t{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    // A few copyright files are Latin-1; invalid bytes are covered above, and here they would
    // turn the rest of the text into one piece instead of testing the pattern.
    if (data::utf8_valid_prefix(t) == t.size()) system_text += t;
  }
  EXPECT_GT(system_text.size(), 256u << 10) << "few licence/copyright texts on this machine";

  SplitMix64 rng(99);
  std::string tokens_text;
  while (tokens_text.size() < (3u << 20)) {
    const auto t = gpt2()->token_bytes(std::uint32_t(rng.next() % data::kEndOfText));
    if (data::utf8_valid_prefix(t) != t.size()) continue;  // partial characters: see above
    tokens_text += t;
    if (rng.next() % 8 == 0) tokens_text += " ";
    if (rng.next() % 64 == 0) tokens_text += "\n";
  }
  std::cout << "held-out texts: " << files.size() << " licence/copyright files, " << system_text.size() << " bytes; "
            << tokens_text.size() << " bytes of random-token text\n";
  expect_same_as_tiktoken({system_text, tokens_text}, {"licence/copyright texts", "random-token text"});
}

}  // namespace
}  // namespace stableflash::testing
