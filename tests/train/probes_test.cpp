// The trainer's probes end to end on a small model (train/probes.hpp): they never change training,
// they write their fields on their steps, the delta running sum continues bit for bit on resume,
// and a spike capture replays its step bit for bit with the command it prints.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine.hpp"
#include "probes.hpp"
#include "stableflash/train/trainer.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {
namespace {

namespace fs = std::filesystem;
using stableflash::testing::ScratchDir;

TrainResult train(const TrainConfig& c, const std::string& run_dir, bool resume = false) {
  TrainOptions o;
  o.run_dir = run_dir, o.resume = resume, o.progress = false;
  o.device = TrainDevice::cpu;
  return run_training(c, o);
}

std::vector<nlohmann::json> metrics_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

class Probes : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir.file("data"));
    stableflash::testing::write_test_shards(dir.file("data"));
  }
  // Layer 0 with the default attention (auto delta: exact at the test's short rows), layer 1 with the failing setting
  // magnified (paper numerics, standard shift, rounded delta, 3 bits): both capture paths.
  TrainConfig config() const {
    TrainConfig c = stableflash::testing::small_config(dir.file("data"));
    c.set("attention.layer.1.numerics", "paper", "test");
    c.set("attention.layer.1.policy", "standard", "test");
    c.set("attention.layer.1.delta_source", "rounded", "test");
    c.set("attention.layer.1.round_bits", "3", "test");
    c.set("attention.layer.1.tile_k", "8", "test");
    c.probe.spike_loss_factor = 0, c.probe.spike_sigma_factor = 0;
    return c;
  }
  ScratchDir dir;
};

TEST_F(Probes, NeverChangeTraining) {
  TrainConfig on = config();
  on.train.probe_every = 1, on.probe.sigma_every = 2, on.probe.attention_every = 1, on.probe.rows = 5, on.probe.sequences = 2;
  TrainConfig off = config();
  off.train.probe_every = 0;
  const auto a = train(on, dir.file("on")), b = train(off, dir.file("off"));
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (std::size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i;  // bitwise
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i;
    EXPECT_FALSE(a.steps[i].probe_fields.empty());
    EXPECT_TRUE(b.steps[i].probe_fields.empty());
  }
}

// The W_Q probe reads only each layer's c_attn rows from the engine (wq_weights): the norms are
// bitwise those measured on the whole model's copy (a sigma step's input), from the same cold start.
TEST_F(Probes, WqProbeFromItsOwnWeightsEqualsTheWholeCopy) {
  const TrainConfig c = config();
  auto engine = make_cpu_engine(c);
  engine->init_weights(c.train.seed);
  TrainingProbes partial(c), whole(c);
  StepMetrics a, b;
  partial.measure(*engine, a, /*wq=*/true, /*sigma=*/false, /*attention=*/false);
  whole.measure(*engine, b, /*wq=*/true, /*sigma=*/true, /*attention=*/false);
  ASSERT_EQ(a.wq_sigma.size(), std::size_t(c.model.n_layer));
  EXPECT_EQ(a.wq_sigma, b.wq_sigma);
  EXPECT_EQ(a.wq_sigma_heads, b.wq_sigma_heads);
  for (double s : a.wq_sigma) EXPECT_GT(s, 0.0);  // initialized weights: not a zero buffer
}

TEST_F(Probes, WriteTheirFieldsOnTheirSteps) {
  TrainConfig c = config();
  c.set("attention.layer.0.numerics", "standard", "test");  // a layer the kernels do not run: null entries
  c.train.probe_every = 1, c.probe.sigma_every = 3, c.probe.attention_every = 2, c.probe.rows = 4;
  train(c, dir.file("run"));
  const auto lines = metrics_lines(dir.file("run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 6u);
  for (const auto& l : lines) {
    const int step = l["step"];
    const bool stats = (step + 1) % 2 == 0 || step == 5, sigma = (step + 1) % 3 == 0 || step == 5;
    EXPECT_TRUE(l.contains("wq_sigma_heads")) << l.dump();
    EXPECT_EQ(l.contains("tie_rows"), stats) << l.dump();
    EXPECT_EQ(l.contains("max_logit"), stats) << l.dump();
    EXPECT_EQ(l.contains("sigma"), sigma) << l.dump();
    EXPECT_EQ(l.contains("wo_sigma_heads"), sigma) << l.dump();
    ASSERT_EQ(l.contains("delta_shadow"), stats) << l.dump();
    if (!stats) continue;
    EXPECT_TRUE(l["delta_shadow"][0].is_null());       // layer 0: standard attention
    EXPECT_TRUE(l["delta_shadow"][1].is_number());
    EXPECT_TRUE(l["rank1_similarity"][0].is_null());
    EXPECT_EQ(l["rank1_similarity"][1].size(), 2u);    // two heads
    if (stats) {
      EXPECT_TRUE(l["tie_rows"][0].is_null());
      EXPECT_EQ(l["tie_rows"][1].size(), 2u);
      EXPECT_EQ(l["attn_rows"].get<double>(), 2.0 * 16);  // B x T rows per head
      for (const auto& m : l["top_mass"][1]) EXPECT_TRUE(m.get<double>() > 0 && m.get<double>() <= 1.0);
    }
    if (sigma) {
      EXPECT_EQ(l["sigma"].size(), 2u + 4u * 2u);  // wte, wpe and four matrices per layer
      EXPECT_TRUE(l["sigma"].contains("h.1.mlp.c_fc"));
    }
  }
}

TEST_F(Probes, DeltaRunningSumContinuesOnResume) {
  TrainConfig c = config();
  c.train.probe_every = 1, c.probe.attention_every = 1;
  train(c, dir.file("whole"));
  TrainConfig first = c;
  first.train.steps = 3;
  train(first, dir.file("split"));
  train(c, dir.file("split"), /*resume=*/true);
  const auto whole = metrics_lines(dir.file("whole/metrics.jsonl")), split = metrics_lines(dir.file("split/metrics.jsonl"));
  ASSERT_EQ(whole.size(), split.size());
  for (std::size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(whole[i]["loss"], split[i]["loss"]);
    EXPECT_EQ(whole[i]["delta_shadow_sum"], split[i]["delta_shadow_sum"]) << "step " << i;
  }
  EXPECT_NE(whole.back()["delta_shadow_sum"][1].get<double>(), whole.back()["delta_shadow"][1].get<double>()) << "a sum over steps";
}

// A loss above 1.0001 x the median of the last 3 happens within a few noisy steps (the seed makes
// it the same every time); the capture's printed command, run as printed, reproduces the step.
TEST_F(Probes, SpikeCaptureReplaysTheStepBitForBit) {
  TrainConfig c = config();
  c.train.steps = 12, c.train.checkpoint_every = 3, c.train.probe_every = 4;
  c.probe.spike_loss_factor = 1.0001, c.probe.spike_window = 3, c.probe.spike_captures = 1;
  const auto r = train(c, dir.file("run"));
  std::string capture;
  std::int64_t step = -1;
  for (const auto& m : r.steps)
    if (!m.capture_dir.empty()) capture = m.capture_dir, step = m.step;
  ASSERT_FALSE(capture.empty()) << "no spike in 12 steps";
  ASSERT_GE(step, 3) << "the test wants a checkpoint before the spike";
  std::ifstream in(capture + "/capture.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["step"].get<std::int64_t>(), step);
  EXPECT_TRUE(fs::exists(capture + "/probe_history.jsonl"));
  std::string command = j["replay"];
  ASSERT_EQ(command.rfind("stableflash train ", 0), 0u) << command;
  command = std::string(STABLEFLASH_BIN) + command.substr(11) + " --device cpu --quiet";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto original = metrics_lines(dir.file("run/metrics.jsonl")), replayed = metrics_lines(capture + "/metrics.jsonl");
  ASSERT_EQ(replayed.back()["step"].get<std::int64_t>(), step);
  EXPECT_EQ(replayed.back()["loss"], original[std::size_t(step)]["loss"]);  // as printed: %.9g of an FP32 value, exact
  EXPECT_EQ(replayed.back()["grad_norm"], original[std::size_t(step)]["grad_norm"]);
}

TEST_F(Probes, ConfigKeysAreTypedAndNamedInErrors) {
  TrainConfig c = config();
  c.set("probe.layers", "1", "--set");
  EXPECT_EQ(c.probe_layers(), std::vector<int>{1});
  c.set("probe.layers", "all", "--set");
  EXPECT_EQ(c.probe_layers(), (std::vector<int>{0, 1}));
  EXPECT_THROW(c.set("probe.layers", "1,x", "--set"), std::invalid_argument);
  c.probe.layers = {5};
  try {
    c.validate();
    FAIL() << "layer 5 of 2 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("probe.layers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stableflash::train
