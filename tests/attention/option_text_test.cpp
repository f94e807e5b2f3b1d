// The one text parser of attention knobs (attention::set_option), shared by the trainer's keys and
// the command-line flags.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "stableflash/attention/option_text.hpp"

namespace stableflash::attention {
namespace {

std::string error_of(AttentionOptions& o, const char* key, const char* value) {
  try {
    set_option(o, key, value, "here");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(OptionText, EveryNamedKnobSetsItsField) {
  AttentionOptions o;
  set_option(o, "numerics", "paper", "t");
  set_option(o, "policy", "hashed_offset", "t");
  set_option(o, "beta", "4", "t");
  set_option(o, "eps", "0.01", "t");
  set_option(o, "tile_q", "64", "t");
  set_option(o, "tile_k", "128", "t");
  set_option(o, "normalizer", "bf16", "t");
  set_option(o, "round_bits", "3", "t");
  set_option(o, "delta_source", "exact", "t");
  set_option(o, "causal", "true", "t");
  set_option(o, "scale", "0.125", "t");
  set_option(o, "device", "cuda", "t");
  set_option(o, "deterministic", "1", "t");
  EXPECT_EQ(o.numerics, Numerics::paper);
  EXPECT_EQ(o.policy, ShiftPolicy::hashed_offset);
  EXPECT_EQ(o.policy_params.beta, 4.0f);
  EXPECT_EQ(o.policy_params.eps, 0.01f);
  EXPECT_EQ(o.tile_q, 64);
  EXPECT_EQ(o.tile_k, 128);
  EXPECT_EQ(o.normalizer, Normalizer::bf16);
  EXPECT_EQ(o.round_bits, 3);
  EXPECT_EQ(o.delta_source, DeltaSource::exact);
  EXPECT_TRUE(o.causal);
  EXPECT_EQ(o.scale, 0.125f);
  EXPECT_EQ(o.device, Device::cuda);
  EXPECT_TRUE(o.deterministic);
  EXPECT_EQ(option_names().size(), 13u);
}

// The project's default attention (docs/numerics-findings.md, "Recommendation"), defined once here
// and read by the trainer, the C ABI and the Python package.
TEST(OptionText, TheRecommendedAttentionIsFusedStandardShiftAutoDelta) {
  const AttentionOptions r = recommended_options();
  EXPECT_EQ(r.numerics, Numerics::fused);
  EXPECT_EQ(r.policy, ShiftPolicy::standard);
  EXPECT_EQ(r.delta_source, DeltaSource::automatic);
  EXPECT_EQ(r.normalizer, Normalizer::fp32);
  EXPECT_EQ(r.round_bits, 7);
  // Only those knobs: everything else is AttentionOptions' own default.
  const AttentionOptions plain;
  EXPECT_EQ(r.policy_params.beta, plain.policy_params.beta);
  EXPECT_EQ(r.policy_params.eps, plain.policy_params.eps);
  EXPECT_EQ(r.tile_q, plain.tile_q);
  EXPECT_EQ(r.tile_k, plain.tile_k);
  EXPECT_EQ(r.causal, plain.causal);
  EXPECT_EQ(r.scale, plain.scale);
  EXPECT_EQ(r.device, plain.device);
  EXPECT_EQ(r.deterministic, plain.deterministic);
  std::vector<std::string> names;
  for (const auto& [name, value] : recommended_settings()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"numerics", "policy", "delta_source", "normalizer", "round_bits"}));
}

TEST(OptionText, ErrorsNameTheSourceTheKeyTheValueAndWhatIsValid) {
  AttentionOptions o;
  const AttentionOptions before = o;
  const std::string policy = error_of(o, "policy", "magic");
  for (const char* part : {"here", "policy", "'magic'", "hashed_offset"}) EXPECT_NE(policy.find(part), std::string::npos) << policy;
  EXPECT_NE(error_of(o, "round_bits", "seven").find("integer"), std::string::npos);
  EXPECT_NE(error_of(o, "beta", "inf").find("finite number"), std::string::npos);
  EXPECT_NE(error_of(o, "causal", "yes").find("true or false"), std::string::npos);
  const std::string unknown = error_of(o, "polcy", "paper");
  EXPECT_NE(unknown.find("unknown attention setting 'polcy'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("delta_source"), std::string::npos) << unknown;
  EXPECT_EQ(o.policy, before.policy);  // a refused value changes nothing
  EXPECT_EQ(o.round_bits, before.round_bits);
}

}  // namespace
}  // namespace stableflash::attention
