// GPT-2's pre-tokenization: the regex that cuts text into pieces before BPE, through PCRE2 so
// that \p{L}, \p{N} and \s come from a maintained Unicode table (PCRE2 10.42: Unicode 14).
#include <stdexcept>
#include <string>

#include "bpe_internal.hpp"

namespace stableflash::data {
namespace {

// GPT-2's pattern (tiktoken's gpt2 pat_str), with one change of spelling: tiktoken's regex
// engine defines `\s` as the Unicode White_Space property; PCRE2's `\s` under UCP has its own
// definition (Perl space), so the property is named instead of trusting two meanings of `\s`.
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

const char* Pretokenizer::pattern() { return kPattern; }

Pretokenizer::Pretokenizer() {
  int err = 0;
  PCRE2_SIZE off = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off,
                        nullptr);
  if (!code_) throw std::runtime_error("GPT-2 pattern does not compile in PCRE2 at offset " + std::to_string(off) + ": " + pcre2_message(err));
  // JIT makes matching several times faster; where the platform lacks it the interpreter is
  // still exact, only slower.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(code_); }

Pretokenizer::Matcher::Matcher(const Pretokenizer& p) : p_(p) {
  md_ = pcre2_match_data_create_from_pattern(p.code_, nullptr);
  mctx_ = pcre2_match_context_create(nullptr);
  // The JIT's default 32 KiB stack is too small for `\s+(?!\S)` over long whitespace runs;
  // 64 MiB covers runs of millions of characters (the interpreter fallback handles the rest).
  if (p.jit_) {
    stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(mctx_, nullptr, stack_);
  }
  if (!md_ || !mctx_) throw std::bad_alloc();
}

Pretokenizer::Matcher::~Matcher() {
  pcre2_match_data_free(md_);
  pcre2_match_context_free(mctx_);
  if (stack_) pcre2_jit_stack_free(stack_);
}

std::size_t Pretokenizer::Matcher::piece_end(std::string_view text, std::size_t pos) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The caller validated the UTF-8 once for the whole text; PCRE2 must not re-check it per call.
  int rc = p_.jit_ ? pcre2_jit_match(p_.code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md_, mctx_)
                   : PCRE2_ERROR_JIT_BADOPTION;
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_JIT_BADOPTION) {
    // Interpreter: no machine-stack limit, only a heap limit we lift for pathological runs.
    pcre2_set_heap_limit(mctx_, 4u * 1024 * 1024);  // KiB
    rc = pcre2_match(p_.code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md_, mctx_);
  }
  if (rc < 0) throw std::runtime_error("GPT-2 pattern: PCRE2 match failed at byte " + std::to_string(pos) + ": " + pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md_);
  // Every character matches one alternative, so the match starts where we asked and is not empty.
  if (ov[0] != pos || ov[1] <= pos)
    throw std::logic_error("GPT-2 pattern left a gap at byte " + std::to_string(pos) + " (PCRE2 Unicode tables broken?)");
  return ov[1];
}

}  // namespace stableflash::data
