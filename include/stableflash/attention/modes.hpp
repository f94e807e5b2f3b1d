// The names of the numerics contract (docs/numerics-contract.md): modes, run-time knobs and shift policies.
// Plain enums with parsing/printing, shared by the library, the CLI and the audit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace stableflash::attention {

// Where rounding happens (docs/numerics-contract.md "Modes").
enum class Numerics : std::uint8_t {
  reference,  // everything in FP64 from the BF16 inputs: the oracle
  paper,      // the authors' tiled PyTorch implementation under BF16 autocast
  fused,      // production fused kernels (FlashAttention-2/3, cuDNN)
};

// What the softmax row sum is summed from in `fused` numerics.
enum class Normalizer : std::uint8_t {
  fp32,  // the FP32 P-bar (FlashAttention's choice; numerator/denominator mismatch)
  bf16,  // the BF16(P-bar) actually fed to the P-bar*V product
};

// Where the backward's delta = rowsum(dO * O) takes O from.
enum class DeltaSource : std::uint8_t {
  rounded,      // the BF16 O (the paper and FlashAttention-2/3)
  compensated,  // the BF16 O plus a BF16 residual of its rounding, summed in FP32
  exact,        // rowsum(dP * P): no O involved, one more pass over the keys
  // "auto": the cheaper clean source for the call, exact in fused numerics up to kAutoExactMaxKeys
  // keys, else compensated (AttentionOptions::for_shape resolves it; attention.hpp)
  automatic,
};

// The choice of the softmax shift m (docs/numerics-contract.md "Shift policies").
enum class ShiftPolicy : std::uint8_t {
  standard,       // m' = tile row max
  paper,          // the published rule: beta * r_m / 0 on repeated tile maxima
  hashed_offset,  // ours: m' = r_m + o(row), o in [0.5, 1) from a hash of (b, h, i)
  fixed_offset,   // control for the design: m' = r_m + ln(4/3) in every row (P-bar max = 0.75)
};

std::string_view to_string(Numerics v);
std::string_view to_string(Normalizer v);
std::string_view to_string(DeltaSource v);
std::string_view to_string(ShiftPolicy v);

// Parsing returns nullopt for an unknown name; callers name the flag or field in their error.
std::optional<Numerics> parse_numerics(std::string_view s);
std::optional<Normalizer> parse_normalizer(std::string_view s);
std::optional<DeltaSource> parse_delta_source(std::string_view s);
std::optional<ShiftPolicy> parse_shift_policy(std::string_view s);

// Comma-separated list of the valid names, for error messages and --help.
std::string valid_names_numerics();
std::string valid_names_normalizer();
std::string valid_names_delta_source();
std::string valid_names_shift_policy();

}  // namespace stableflash::attention
