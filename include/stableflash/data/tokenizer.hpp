// GPT-2's byte-level BPE tokenizer, token for token what tiktoken's `encode_ordinary` gives for
// GPT-2 (docs/tokenizer.md): the same pre-tokenization pattern (through PCRE2, Unicode classes from
// its tables), the same rank-ordered merges, and tiktoken's byte-level treatment of input that is
// not valid UTF-8, so decode(encode(b)) == b for every byte string.
//
// The ranks come at run time from GPT-2's official ranks file in tiktoken's format (one
// "base64(bytes) rank" per line); the set-up fetches and verifies it (scripts/setup-deps.sh).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace stableflash::data {

inline constexpr std::uint32_t kEndOfText = 50256;         // "<|endoftext|>", GPT-2's only special token
inline constexpr std::uint32_t kGpt2MergeableRanks = 50256;  // ranks 0..50255 in the ranks file
inline constexpr std::uint32_t kGpt2VocabSize = 50257;

// Where the ranks file is: `explicit_path` (a --ranks flag) when not empty, else the environment
// variable STABLEFLASH_GPT2_RANKS, else the project's .deps/gpt2.tiktoken (compiled in).
// Throws, naming the path tried and how to get the file, when it does not exist.
std::string resolve_gpt2_ranks_path(const std::string& explicit_path = "");

// GPT-2's reversible byte -> printable code point mapping (encoder.json shows "Ġthe" for " the").
// tiktoken's ranks file stores raw bytes, so the encoder never needs it; it is used to show tokens.
char32_t gpt2_byte_to_unicode(std::uint8_t byte);
// The token's bytes written through that mapping, as UTF-8 ("Ġthe").
std::string gpt2_visible_token(std::string_view token_bytes);

class Pretokenizer;
struct BpeTables;

// The immutable part: ranks, merge table and compiled pattern. Shared by any number of threads.
class Gpt2Tokenizer {
 public:
  // Loads and validates a tiktoken-format GPT-2 ranks file; errors name the file and line.
  static std::shared_ptr<const Gpt2Tokenizer> load(const std::string& ranks_path);
  ~Gpt2Tokenizer();
  Gpt2Tokenizer(const Gpt2Tokenizer&) = delete;
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer&) = delete;

  // The bytes a token stands for; "<|endoftext|>" for 50256. Throws for ids >= 50257.
  std::string_view token_bytes(std::uint32_t id) const;
  // Concatenated bytes of `ids` (not necessarily valid UTF-8). Throws naming a bad id.
  std::string decode(std::span<const std::uint32_t> ids) const;
  std::string decode(std::span<const std::uint16_t> ids) const;

  const BpeTables& tables() const { return *tables_; }
  const Pretokenizer& pretokenizer() const { return *pre_; }
  const std::string& ranks_path() const { return path_; }

 private:
  Gpt2Tokenizer() = default;
  std::string path_;
  std::unique_ptr<BpeTables> tables_;
  std::unique_ptr<Pretokenizer> pre_;
};

// The per-thread part: regex match state and a cache of piece -> tokens. Cheap to create, not
// thread-safe; give each thread its own.
class Gpt2Encoder {
 public:
  explicit Gpt2Encoder(std::shared_ptr<const Gpt2Tokenizer> tokenizer);
  ~Gpt2Encoder();
  Gpt2Encoder(Gpt2Encoder&&) noexcept;
  Gpt2Encoder& operator=(Gpt2Encoder&&) noexcept;

  // Appends the tokens of `bytes` to `out` (encode_ordinary semantics: "<|endoftext|>" in the
  // text is ordinary text).
  void encode(std::string_view bytes, std::vector<std::uint32_t>& out);
  std::vector<std::uint32_t> encode(std::string_view bytes) {
    std::vector<std::uint32_t> out;
    encode(bytes, out);
    return out;
  }
  const Gpt2Tokenizer& tokenizer() const { return *tok_; }

 private:
  struct State;
  std::shared_ptr<const Gpt2Tokenizer> tok_;
  std::unique_ptr<State> st_;
};

// Cut points that let a long text be encoded in independent pieces with exactly the tokens of
// encoding it whole: positions just after a '\n' that is followed by an ASCII letter, which every
// match of GPT-2's pattern ends at. Only valid for valid UTF-8 (invalid bytes make the rest of a
// text one piece, tiktoken's rule). Returns ascending offsets in (0, text.size()), each chunk
// roughly `target_bytes` long; empty when the text is short or has no such point.
std::vector<std::size_t> parallel_cut_points(std::string_view text, std::size_t target_bytes);

// Length of the longest prefix of `bytes` that is valid UTF-8 (Rust's `valid_up_to`: no
// overlong forms, surrogates or code points above U+10FFFF).
std::size_t utf8_valid_prefix(std::string_view bytes);

}  // namespace stableflash::data
