// Trainer configuration: presets, keys, files, round trips and clear errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "stableflash/attention/option_text.hpp"
#include "stableflash/train/config.hpp"
#include "test_files.hpp"

namespace stableflash::train {
namespace {

using stableflash::testing::expect_error_mentions;
using stableflash::testing::ScratchDir;

TEST(TrainConfig, PresetsAreValidAndTheDefaultIsTheRecommendedAttention) {
  for (const auto& name : preset_names()) {
    TrainConfig c = preset(name);
    EXPECT_NO_THROW(c.validate()) << name;
    for (const auto& la : c.layer_attention()) {
      EXPECT_EQ(la.kind, model::AttentionKind::flash);
      EXPECT_EQ(la.options.numerics, attention::Numerics::fused);
      EXPECT_EQ(la.options.delta_source, attention::DeltaSource::automatic);
      EXPECT_EQ(la.options.policy, attention::ShiftPolicy::standard);
      EXPECT_EQ(la.options.normalizer, attention::Normalizer::fp32);
      EXPECT_EQ(la.options.round_bits, 7);
    }
    // the attention library's one definition, key for key (also what the C ABI hands to Python)
    const auto& rec = attention::recommended_settings();
    EXPECT_EQ(c.attention_default, AttentionSettings(rec.begin(), rec.end())) << name;
  }
  EXPECT_EQ(recommended_attention(),
            (AttentionSettings{{"numerics", "fused"}, {"policy", "standard"}, {"delta_source", "auto"},
                               {"normalizer", "fp32"}, {"round_bits", "7"}}));
  const TrainConfig paper = preset("gpt2-124m");
  EXPECT_EQ(paper.model.n_layer, 12);
  EXPECT_EQ(paper.model.padded_vocab_size, 50304);
  EXPECT_FALSE(paper.model.bias);
  EXPECT_EQ(paper.tokens_per_step(), 524288);
  EXPECT_EQ(paper.optim.warmup_steps, 2000);
  expect_error_mentions([] { preset("gpt5"); }, {"gpt5", "tiny", "gpt2-124m"});
}

TEST(TrainConfig, PerLayerAttentionOverridesTheDefault) {
  TrainConfig c = preset("tiny");
  apply_assignment(c, "attention.default.numerics=paper");
  apply_assignment(c, "attention.layer.1.policy=paper");
  apply_assignment(c, "attention.layer.1.delta_source=rounded");
  apply_assignment(c, "attention.layer.1.round_bits=3");
  apply_assignment(c, "attention.layer.2.numerics=standard");
  c.validate();
  const auto la = c.layer_attention();
  EXPECT_EQ(la[0].options.numerics, attention::Numerics::paper);
  EXPECT_EQ(la[0].options.policy, attention::ShiftPolicy::standard);  // the default's
  EXPECT_EQ(la[1].options.policy, attention::ShiftPolicy::paper);
  EXPECT_EQ(la[1].options.delta_source, attention::DeltaSource::rounded);
  EXPECT_EQ(la[1].options.round_bits, 3);
  EXPECT_EQ(la[2].kind, model::AttentionKind::standard);
  EXPECT_EQ(la[3].options.round_bits, 7);
}

TEST(TrainConfig, BadValuesNameTheKey) {
  TrainConfig c = preset("tiny");
  expect_error_mentions([&] { apply_assignment(c, "optim.lr=fast"); }, {"optim.lr", "fast", "number"});
  expect_error_mentions([&] { apply_assignment(c, "model.n_layers=3"); }, {"unknown key", "model.n_layers"});
  expect_error_mentions([&] { apply_assignment(c, "attention.layer.1.policy=magic"); }, {"attention.layer.1", "policy", "hashed_offset"});
  expect_error_mentions([&] { apply_assignment(c, "attention.layer.x.policy=paper"); }, {"layer index"});
  expect_error_mentions([&] { apply_assignment(c, "attention.default.numerics=reference"); }, {"numerics", "standard, paper or fused"});
  expect_error_mentions([&] { apply_assignment(c, "no_equals_sign"); }, {"key=value"});
  TrainConfig d = preset("tiny");
  apply_assignment(d, "attention.layer.9.policy=paper");
  expect_error_mentions([&] { d.validate(); }, {"attention.layer.9", "4 layers"});
  TrainConfig e = preset("tiny");
  apply_assignment(e, "train.seq_len=4096");
  expect_error_mentions([&] { e.validate(); }, {"train.seq_len", "block_size"});
  TrainConfig f = preset("tiny");
  apply_assignment(f, "model.n_head=3");
  expect_error_mentions([&] { f.validate(); }, {"model.n_embd", "model.n_head"});
  TrainConfig g = preset("tiny");
  apply_assignment(g, "optim.decay_steps=5");
  expect_error_mentions([&] { g.validate(); }, {"optim.decay_steps"});
  TrainConfig h = preset("tiny");
  apply_assignment(h, "attention.layer.0.round_bits=40");
  expect_error_mentions([&] { h.validate(); }, {"attention.layer.0", "round_bits"});
}

TEST(TrainConfig, TomlAndJsonFilesUseTheSameKeys) {
  ScratchDir dir;
  {
    std::ofstream(dir.file("c.toml")) << "[model]\nn_layer = 2\nbias = true\n[optim]\nname = \"muon\"\nlr = 5e-4\n"
                                         "[attention.layer.1]\ndelta_source = \"exact\"\nround_bits = 3\n";
    std::ofstream(dir.file("c.json")) << R"({"train": {"steps": 17, "seed": 5}, "attention": {"default": {"numerics": "paper"}}})";
    std::ofstream(dir.file("bad.toml")) << "[model]\nn_layer = \"two\"\n";
    std::ofstream(dir.file("broken.toml")) << "[model\n";
  }
  TrainConfig c = preset("tiny");
  apply_config_file(c, dir.file("c.toml"));
  apply_config_file(c, dir.file("c.json"));
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_TRUE(c.model.bias);
  EXPECT_EQ(c.optim.kind, optim::OptimizerKind::muon);
  EXPECT_EQ(c.optim.lr, 5e-4);
  EXPECT_EQ(c.train.steps, 17);
  EXPECT_EQ(c.layer_attention()[1].options.delta_source, attention::DeltaSource::exact);
  EXPECT_EQ(c.layer_attention()[0].options.numerics, attention::Numerics::paper);
  expect_error_mentions([&] { apply_config_file(c, dir.file("bad.toml")); }, {"bad.toml", "model.n_layer", "integer"});
  expect_error_mentions([&] { apply_config_file(c, dir.file("broken.toml")); }, {"broken.toml:1"});
  expect_error_mentions([&] { apply_config_file(c, dir.file("missing.toml")); }, {"missing.toml", "not found"});
}

TEST(TrainConfig, JsonRoundTripIsExactAndMismatchesAreListed) {
  TrainConfig c = preset("tiny");
  apply_assignment(c, "optim.lr=0.0012345678901234567");
  apply_assignment(c, "attention.layer.1.policy=paper");
  const TrainConfig back = from_json(to_json(c), "test");
  EXPECT_EQ(back.entries(), c.entries());
  EXPECT_TRUE(resume_mismatches(c, back).empty());
  TrainConfig more_steps = back;
  more_steps.train.steps = 1000;
  EXPECT_TRUE(resume_mismatches(c, more_steps).empty());
  // The optimizer's overlap changes no bit: it may change on resume, and the config.json of a
  // checkpoint written before the key existed reads with its default.
  TrainConfig overlapped = back;
  EXPECT_FALSE(back.train.overlap_optimizer);
  apply_assignment(overlapped, "train.overlap_optimizer=true");
  EXPECT_TRUE(overlapped.train.overlap_optimizer);
  EXPECT_TRUE(resume_mismatches(c, overlapped).empty());
  auto without = nlohmann::json::parse(to_json(overlapped));
  ASSERT_TRUE(without["train"].contains("overlap_optimizer"));
  without["train"].erase("overlap_optimizer");
  const TrainConfig old_checkpoint = from_json(without.dump(), "old checkpoint");
  EXPECT_FALSE(old_checkpoint.train.overlap_optimizer);
  EXPECT_TRUE(resume_mismatches(old_checkpoint, overlapped).empty());
  // Likewise the CUDA graphs (on by default): a checkpoint from before the key resumes with them.
  EXPECT_TRUE(back.train.cuda_graph);
  TrainConfig eager = back;
  apply_assignment(eager, "train.cuda_graph=false");
  EXPECT_FALSE(eager.train.cuda_graph);
  EXPECT_TRUE(resume_mismatches(c, eager).empty());
  without["train"].erase("cuda_graph");
  EXPECT_TRUE(from_json(without.dump(), "old checkpoint").train.cuda_graph);
  EXPECT_TRUE(resume_mismatches(from_json(without.dump(), "old checkpoint"), eager).empty());
  TrainConfig other = back;
  apply_assignment(other, "model.n_layer=6");
  apply_assignment(other, "attention.layer.1.delta_source=exact");
  const auto m = resume_mismatches(c, other);
  ASSERT_EQ(m.size(), 2u);
  const std::string all = m[0] + "\n" + m[1];
  EXPECT_NE(all.find("attention.layer.1.delta_source: checkpoint has (unset), this run has exact"), std::string::npos) << all;
  EXPECT_NE(all.find("model.n_layer: checkpoint has 4, this run has 6"), std::string::npos) << all;
}

}  // namespace
}  // namespace stableflash::train

namespace stableflash::train {
namespace {

TEST(TrainConfig, BuildAppliesPresetFileSetsAndStepsInOrderAndResumeStartsFromTheRun) {
  stableflash::testing::ScratchDir dir;
  std::ofstream(dir.file("c.toml")) << "[train]\nsteps = 40\nseed = 3\n";
  ConfigSources src;
  src.preset = "gpt2-124m", src.config_file = dir.file("c.toml"), src.sets = {"train.seed=4"}, src.steps = 0;
  TrainConfig c = build_config(src);
  EXPECT_EQ(c.model.n_layer, 12);
  EXPECT_EQ(c.train.steps, 40);
  EXPECT_EQ(c.train.seed, 4u);  // --set wins over the file
  src.steps = 50;
  EXPECT_EQ(build_config(src).train.steps, 50);  // --steps wins over both

  std::ofstream(dir.file("config.json")) << to_json(c);
  ConfigSources resume;
  resume.resume_run_dir = dir.file(""), resume.steps = 99;
  const TrainConfig r = build_config(resume);
  EXPECT_EQ(r.model.n_layer, 12);
  EXPECT_EQ(r.train.seed, 4u);
  EXPECT_EQ(r.train.steps, 99);
  resume.preset = "tiny";
  stableflash::testing::expect_error_mentions([&] { build_config(resume); }, {"--resume", "--preset"});
  ConfigSources nowhere;
  nowhere.resume_run_dir = dir.file("missing");
  stableflash::testing::expect_error_mentions([&] { build_config(nowhere); }, {"missing/config.json", "run directory"});
}

}  // namespace
}  // namespace stableflash::train
