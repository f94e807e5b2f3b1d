// The encoder: pre-tokenize, look each piece up (whole-piece token, then a per-thread cache),
// merge what is left; and tiktoken's byte-level rule for input that is not valid UTF-8.
#include <stdexcept>

#include "bpe_internal.hpp"

namespace stableflash::data {
namespace {

// piece bytes -> its tokens, per thread. Ordinary text repeats a small set of pieces, so after a
// warm-up nearly every piece that is not itself a token is found here instead of being merged.
class PieceCache {
 public:
  static constexpr std::size_t kMaxPiece = 64;       // longer pieces are rare and not worth keeping
  static constexpr std::size_t kMaxEntries = 1 << 19; // then start over: bounded memory

  PieceCache() { slots_.resize(4096); }  // grows with use: short-lived encoders stay cheap

  // Appends the cached tokens and returns true, or returns false.
  bool find(std::string_view piece, std::uint64_t h, std::vector<std::uint32_t>& out) const {
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key_len == 0) return false;
      if (s.hash == h && s.key_len == piece.size() && keys_.compare(s.key_off, s.key_len, piece) == 0) {
        out.insert(out.end(), toks_.begin() + s.tok_off, toks_.begin() + s.tok_off + s.tok_len);
        return true;
      }
    }
  }

  void insert(std::string_view piece, std::uint64_t h, const std::uint32_t* toks, std::size_t n) {
    if (piece.size() > kMaxPiece || piece.empty()) return;
    if (used_ >= kMaxEntries) clear();
    if (2 * (used_ + 1) > slots_.size()) grow();  // load factor <= 1/2 keeps probes short
    place({h, std::uint32_t(keys_.size()), std::uint32_t(toks_.size()), std::uint16_t(piece.size()), std::uint16_t(n)});
    keys_.append(piece);
    toks_.insert(toks_.end(), toks, toks + n);
    ++used_;
  }

 private:
  struct Slot {
    std::uint64_t hash = 0;
    std::uint32_t key_off = 0, tok_off = 0;
    std::uint16_t key_len = 0, tok_len = 0;  // key_len 0: empty slot (pieces are never empty)
  };
  void place(const Slot& s) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = s.hash & mask;
    while (slots_[i].key_len != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old)
      if (s.key_len != 0) place(s);
  }
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear(), toks_.clear(), used_ = 0;
  }
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<std::uint32_t> toks_;
  std::size_t used_ = 0;
};

}  // namespace

struct Gpt2Encoder::State {
  explicit State(const Gpt2Tokenizer& t) : matcher(t.pretokenizer()) {}
  Pretokenizer::Matcher matcher;
  PieceCache cache;
  MergeScratch scratch;

  // Appends the tokens of one piece: the piece itself when it is a token (tiktoken checks this
  // first, and it can differ from what merging would give), else the merge result.
  void encode_piece(const BpeTables& t, std::string_view piece, std::vector<std::uint32_t>& out) {
    const std::uint64_t h = hash_bytes(piece.data(), piece.size());
    if (const std::uint32_t id = t.rank_of(piece.data(), piece.size(), h); id != kNoRank) {
      out.push_back(id);
      return;
    }
    if (cache.find(piece, h, out)) return;
    const std::size_t before = out.size();
    bpe_merge(t, piece, out, scratch);
    cache.insert(piece, h, out.data() + before, out.size() - before);
  }
};

Gpt2Encoder::Gpt2Encoder(std::shared_ptr<const Gpt2Tokenizer> tokenizer)
    : tok_(std::move(tokenizer)), st_(std::make_unique<State>(*tok_)) {}
Gpt2Encoder::~Gpt2Encoder() = default;
Gpt2Encoder::Gpt2Encoder(Gpt2Encoder&&) noexcept = default;
Gpt2Encoder& Gpt2Encoder::operator=(Gpt2Encoder&&) noexcept = default;

void Gpt2Encoder::encode(std::string_view bytes, std::vector<std::uint32_t>& out) {
  const BpeTables& t = tok_->tables();
  const std::size_t first = out.size();
  const std::size_t valid = utf8_valid_prefix(bytes);
  const std::string_view text = bytes.substr(0, valid);
  std::size_t last_piece_tokens = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const std::size_t end = st_->matcher.piece_end(text, pos);
    const std::size_t before = out.size();
    st_->encode_piece(t, text.substr(pos, end - pos), out);
    last_piece_tokens = out.size() - before;
    pos = end;
  }
  if (valid == bytes.size()) return;

  // Not valid UTF-8: tiktoken's _encode_bytes. The regex only ran on the valid prefix; the
  // tokens of its last piece (widened over trailing all-whitespace tokens, whose split could
  // have been different) are taken back and merged again together with every remaining byte.
  std::string unstable;
  std::size_t n = out.size() - first;
  if (n > 0 && last_piece_tokens > 0) {
    if (t.all_space[out[out.size() - last_piece_tokens]])
      while (last_piece_tokens < n && t.all_space[out[out.size() - last_piece_tokens - 1]]) ++last_piece_tokens;
    for (std::size_t i = out.size() - last_piece_tokens; i < out.size(); ++i) unstable += t.bytes(out[i]);
    out.resize(out.size() - last_piece_tokens);
  }
  unstable += bytes.substr(valid);
  // One piece, possibly megabytes long: not cached, merged by the O(n log n) path.
  const std::uint32_t id = t.rank_of(unstable.data(), unstable.size());
  if (id != kNoRank)
    out.push_back(id);
  else
    bpe_merge(t, unstable, out, st_->scratch);
}

std::size_t utf8_valid_prefix(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  while (i < n) {
    // ASCII runs dominate real text: skip them eight bytes at a time.
    while (i + 8 <= n) {
      std::uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (RFC 3629 table)
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if ((s[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return n;
}

std::vector<std::size_t> parallel_cut_points(std::string_view text, std::size_t target_bytes) {
  std::vector<std::size_t> cuts;
  if (target_bytes == 0) return cuts;
  std::size_t from = target_bytes;
  while (from < text.size()) {
    // The first visible ASCII character + "\n" + ASCII letter at or after `from`: pieces end
    // on both sides of that '\n' (no alternative of the pattern spans a '\n' and a letter, a
    // letter's piece may only start with ' ', and with no whitespace before it the '\n' is a
    // piece of its own, also at the end of a chunk), so the two sides encode independently.
    std::size_t cut = std::string_view::npos;
    for (std::size_t i = text.find('\n', from); i != std::string_view::npos && i + 1 < text.size(); i = text.find('\n', i + 1)) {
      const char c = text[i + 1], before = text[i - 1];
      if (((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) && before > ' ' && before < 0x7f) {
        cut = i + 1;
        break;
      }
    }
    if (cut == std::string_view::npos) break;
    cuts.push_back(cut);
    from = cut + target_bytes;
  }
  return cuts;
}

}  // namespace stableflash::data
