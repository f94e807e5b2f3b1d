// libFuzzer target: encode/decode on arbitrary bytes. Checks (abort on failure):
//   decode(encode(b)) == b, every id is an ordinary token, a fresh encoder agrees with a warm one
//   (the piece cache), encoding in chunks at parallel_cut_points equals encoding whole, and
//   decoding arbitrary ids never crashes.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "stableflash/data/tokenizer.hpp"

using namespace stableflash::data;

namespace {

const std::shared_ptr<const Gpt2Tokenizer>& tokenizer() {
  static const auto tok = Gpt2Tokenizer::load(resolve_gpt2_ranks_path());
  return tok;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_tokenizer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  static Gpt2Encoder warm(tokenizer());
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const auto ids = warm.encode(bytes);
  for (const auto id : ids)
    if (id >= kEndOfText) fail("encode produced a special or out-of-range id");
  if (tokenizer()->decode(ids) != bytes) fail("decode(encode(b)) != b");
  if (size < 256 && Gpt2Encoder(tokenizer()).encode(bytes) != ids) fail("fresh and warm encoders disagree");
  if (utf8_valid_prefix(bytes) == size) {
    std::vector<std::uint32_t> chunked;
    std::size_t begin = 0;
    for (const auto cut : parallel_cut_points(bytes, 8)) warm.encode(bytes.substr(begin, cut - begin), chunked), begin = cut;
    warm.encode(bytes.substr(begin), chunked);
    if (chunked != ids) fail("encoding at parallel cut points differs from encoding whole");
  }
  std::vector<std::uint16_t> any(size / 2);
  for (std::size_t i = 0; i < any.size(); ++i) any[i] = std::uint16_t((data[2 * i] | data[2 * i + 1] << 8) % kGpt2VocabSize);
  (void)tokenizer()->decode(any);
  return 0;
}
