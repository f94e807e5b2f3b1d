// The trainer end to end on a small model and generated shards: exact resume, exact replay,
// checkpoints Hugging Face can read, and clear refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <Eigen/Dense>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/data/safetensors.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/run_files.hpp"
#include "stableflash/train/sampling.hpp"
#include "stableflash/train/trainer.hpp"
#include "test_files.hpp"
#include "train_test_util.hpp"

namespace stableflash::train {
namespace {

namespace fs = std::filesystem;
using stableflash::testing::expect_error_mentions;
using stableflash::testing::read_bytes;
using stableflash::testing::ScratchDir;

TrainResult train(const TrainConfig& c, const std::string& run_dir, bool resume = false, const std::string& replay = "") {
  TrainOptions o;
  o.run_dir = run_dir, o.resume = resume, o.replay_log = replay, o.progress = false;
  o.device = TrainDevice::cpu;  // the CPU path also where a GPU is visible
  return run_training(c, o);
}

std::vector<double> losses(const TrainResult& r) {
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

std::vector<nlohmann::json> metrics_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

class Trainer : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir.file("data"));
    stableflash::testing::write_test_shards(dir.file("data"));
  }
  TrainConfig config() const { return stableflash::testing::small_config(dir.file("data")); }
  ScratchDir dir;
};

TEST_F(Trainer, LearnsAndWritesTheRunDirectory) {
  TrainConfig c = config();
  c.train.steps = 40, c.train.checkpoint_every = 0, c.train.val_every = 20;
  const auto r = train(c, dir.file("run"));
  ASSERT_EQ(r.steps.size(), 40u);
  // 80% of the shards' tokens cycle through 16 ids: a model that learns gets well below the
  // uniform ln(256) = 5.55 within a few dozen steps.
  std::printf("loss %.4f -> %.4f, val %.4f\n", r.steps.front().loss, r.steps.back().loss, *r.steps.back().val_loss);
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss - 1.0) << "no visible learning";
  for (const char* f : {"config.json", "metrics.jsonl", "batches.log", "checkpoints/latest"}) EXPECT_TRUE(fs::exists(dir.file("run/") + f)) << f;
  const auto lines = metrics_lines(dir.file("run/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 40u);
  for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s"}) EXPECT_TRUE(lines[0].contains(k)) << k;
  EXPECT_TRUE(lines[19].contains("val_loss"));  // val_every = 20: after steps 19 and 39
  EXPECT_FALSE(lines[20].contains("val_loss"));
  EXPECT_EQ(float(lines[5]["loss"].get<double>()), float(r.steps[5].loss));  // %.9g round-trips a float
  const BatchLog log = BatchLog::read(dir.file("run/batches.log"));
  EXPECT_EQ(log.steps.size(), 40u);
  EXPECT_EQ(log.header.windows_per_step, 4);  // batch 2 x accumulation 2
}

TEST_F(Trainer, CheckpointUsesHuggingFaceNamesAndLayout) {
  TrainConfig c = config();
  c.train.steps = 1;
  train(c, dir.file("run"));
  const std::string ckpt = latest_checkpoint(dir.file("run"));
  const auto f = data::SafetensorsFile::read(ckpt + "/model.safetensors");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  ASSERT_TRUE(f.find("transformer.h.0.attn.c_attn.weight"));
  EXPECT_EQ(f.find("transformer.h.0.attn.c_attn.weight")->shape, (std::vector<std::int64_t>{32, 96}));  // Conv1D [in, out]
  EXPECT_EQ(f.find("transformer.h.1.mlp.c_proj.weight")->shape, (std::vector<std::int64_t>{128, 32}));
  EXPECT_EQ(f.find("transformer.wte.weight")->shape, (std::vector<std::int64_t>{256, 32}));
  const data::Tensor* bias = f.find("transformer.h.1.attn.c_attn.bias");  // absent from the model: zeros for GPT2LMHeadModel
  ASSERT_TRUE(bias);
  for (float x : bias->as<float>()) EXPECT_EQ(x, 0.0f);
  const auto hf = nlohmann::json::parse(std::ifstream(ckpt + "/config.json"));
  EXPECT_EQ(hf["model_type"], "gpt2");
  EXPECT_EQ(hf["activation_function"], "gelu_new");
  EXPECT_EQ(hf["n_embd"], 32);
}

TEST_F(Trainer, ResumeReproducesTheUninterruptedRunBitForBit) {
  const TrainConfig c = config();  // 6 steps, checkpoints every 3
  const auto whole = train(c, dir.file("whole"));

  // Stopped at step 3 (its final checkpoint), then resumed to 6.
  TrainConfig first = c;
  first.train.steps = 3;
  auto a = losses(train(first, dir.file("split")));
  const auto b = train(c, dir.file("split"), /*resume=*/true);
  for (double x : losses(b)) a.push_back(x);
  EXPECT_EQ(a, losses(whole));
  EXPECT_EQ(b.steps.back().val_loss, whole.steps.back().val_loss);
  EXPECT_EQ(read_bytes(latest_checkpoint(dir.file("split")) + "/model.safetensors"),
            read_bytes(latest_checkpoint(dir.file("whole")) + "/model.safetensors"));
  EXPECT_EQ(read_bytes(latest_checkpoint(dir.file("split")) + "/optimizer.safetensors"),
            read_bytes(latest_checkpoint(dir.file("whole")) + "/optimizer.safetensors"));

  // A crash after step 4 (checkpoint 3 is the latest): the logs past it are rewritten, not doubled.
  TrainConfig crash = c;
  crash.train.steps = 5;
  train(crash, dir.file("crash"));
  fs::remove_all(dir.file("crash/checkpoints/step_00000005"));
  data::write_file_atomically(dir.file("crash/checkpoints/latest"), [](std::ostream& o) { o << "step_00000003\n"; });
  train(c, dir.file("crash"), /*resume=*/true);
  const auto lines = metrics_lines(dir.file("crash/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 6u);
  for (int s = 0; s < 6; ++s) {
    EXPECT_EQ(lines[s]["step"].get<int>(), s);
    EXPECT_EQ(float(lines[s]["loss"].get<double>()), float(whole.steps[s].loss));
  }
  EXPECT_EQ(BatchLog::read(dir.file("crash/batches.log")).steps, BatchLog::read(dir.file("whole/batches.log")).steps);
}

TEST_F(Trainer, ReplayTrainsOnTheLoggedWindows) {
  TrainConfig c = config();
  c.train.checkpoint_every = 0;
  const auto original = train(c, dir.file("original"));
  // Same config replaying the log: identical losses.
  const auto replayed = train(c, dir.file("replayed"), false, dir.file("original/batches.log"));
  EXPECT_EQ(losses(replayed), losses(original));
  // Another seed: different initial weights, yet exactly the logged windows (a seeded run differs).
  TrainConfig other = c;
  other.train.seed = 7;
  train(other, dir.file("other_seed_replay"), false, dir.file("original/batches.log"));
  train(other, dir.file("other_seed"));
  const auto logged = BatchLog::read(dir.file("original/batches.log")).steps;
  EXPECT_EQ(BatchLog::read(dir.file("other_seed_replay/batches.log")).steps, logged);
  EXPECT_NE(BatchLog::read(dir.file("other_seed/batches.log")).steps, logged);
  // A log of another batch shape, or shorter than the run, is refused.
  TrainConfig wider = c;
  wider.train.batch_size = 3;
  expect_error_mentions([&] { train(wider, dir.file("wider"), false, dir.file("original/batches.log")); }, {"batches.log", "windows"});
  TrainConfig longer = c;
  longer.train.steps = 9;
  expect_error_mentions([&] { train(longer, dir.file("longer"), false, dir.file("original/batches.log")); }, {"holds 6 steps", "--steps 6"});
}

TEST_F(Trainer, NonFiniteLossStopsNamingTheStepAndKeepsTheLastCheckpoint) {
  TrainConfig c = config();
  c.optim.lr = 1e30, c.optim.warmup_steps = 0, c.train.checkpoint_every = 1, c.train.val_every = 0;
  try {
    train(c, dir.file("run"));
    FAIL() << "expected the run to stop";
  } catch (const NonFiniteLoss& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("at step 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step_00000001"), std::string::npos) << msg;
  }
  const Checkpoint ckpt = open_checkpoint(latest_checkpoint(dir.file("run")));  // intact and verifiable
  EXPECT_EQ(ckpt.state.step, 1);
}

TEST_F(Trainer, RefusesMissingShardsDamagedOrMismatchedCheckpointsAndReusedRunDirs) {
  TrainConfig nodata = config();
  nodata.data.dir = dir.file("nowhere");
  expect_error_mentions([&] { train(nodata, dir.file("r0")); }, {"nowhere", "scripts/setup-corpus.sh", "data.dir"});
  fs::create_directories(dir.file("empty"));
  nodata.data.dir = dir.file("empty");
  expect_error_mentions([&] { train(nodata, dir.file("r0")); }, {"no train shards", "empty"});

  TrainConfig c = config();  // checkpoints after steps 3 and 4
  c.train.steps = 4;
  train(c, dir.file("run"));
  expect_error_mentions([&] { train(c, dir.file("run")); }, {"already holds a run", "--resume"});

  TrainConfig other = c;
  other.train.steps = 6, other.model.n_layer = 3;
  expect_error_mentions([&] { train(other, dir.file("run"), true); }, {"another config", "model.n_layer: checkpoint has 2, this run has 3"});

  const std::string ckpt = latest_checkpoint(dir.file("run"));
  auto bytes = read_bytes(ckpt + "/model.safetensors");
  bytes[bytes.size() / 2] ^= 0x40;
  stableflash::testing::write_bytes(ckpt + "/model.safetensors", bytes);
  TrainConfig more = c;
  more.train.steps = 6;
  expect_error_mentions([&] { train(more, dir.file("run"), true); },
                        {"step_00000004 is damaged", "model.safetensors", "checksum", "Earlier checkpoints", "step_00000003"});
  EXPECT_EQ(read_bytes(ckpt + "/model.safetensors"), bytes);  // left as it was, for inspection
  // Following the advice resumes from the previous, intact checkpoint.
  data::write_file_atomically(dir.file("run/checkpoints/latest"), [](std::ostream& o) { o << "step_00000003\n"; });
  EXPECT_EQ(train(more, dir.file("run"), true).steps.front().step, 3);
}

TEST_F(Trainer, LossesDoNotDependOnTheThreadCount) {
  TrainConfig c = config();
  c.train.steps = 4, c.train.checkpoint_every = 0;
  apply_assignment(c, "attention.layer.1.numerics=standard");  // both attention paths
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto one = losses(train(c, dir.file("one")));
  omp_set_num_threads(3);
  const auto three = losses(train(c, dir.file("three")));
  omp_set_num_threads(threads);
  EXPECT_EQ(one, three);
}

TEST_F(Trainer, MuonTrainsAndResumesExactly) {
  TrainConfig c = config();
  c.optim.kind = optim::OptimizerKind::muon, c.optim.weight_decay = 0.01, c.optim.lr = 5e-3;
  c.train.steps = 20, c.train.checkpoint_every = 10, c.train.val_every = 0;
  const auto whole = train(c, dir.file("whole"));
  EXPECT_LT(whole.steps.back().loss, whole.steps.front().loss - 0.5);
  TrainConfig half = c;
  half.train.steps = 10;
  auto a = losses(train(half, dir.file("split")));
  for (double x : losses(train(c, dir.file("split"), true))) a.push_back(x);
  EXPECT_EQ(a, losses(whole));
}

TEST_F(Trainer, SamplingIsSeededAndDrawsOnlyRealTokens) {
  TrainConfig c = config();
  c.model.vocab_size = 250;  // rows 250..255 are padding: never sampled
  c.train.steps = 30, c.train.checkpoint_every = 0, c.train.val_every = 0;
  // Shards holding ids past the model's vocabulary are refused when they open, naming the file and offset.
  expect_error_mentions([&] { train(c, dir.file("refused")); }, {"train_000000.bin", "token offset", "vocabulary of 250"});
  stableflash::testing::write_test_shards(dir.file("data"), /*vocab=*/250);
  train(c, dir.file("run"));
  const Checkpoint ckpt = open_checkpoint(latest_checkpoint(dir.file("run")));
  model::Gpt2<float> m(ckpt.config.model, ckpt.config.layer_attention());
  load_weights(ckpt, m);
  SampleOptions o;
  o.max_new_tokens = 40, o.temperature = 1.0, o.top_k = 0, o.seed = 3;
  const auto a = generate(m, {1, 2, 3}, o), b = generate(m, {1, 2, 3}, o);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 43u);  // longer than block_size 16: the context slides
  for (int id : a) EXPECT_LT(id, 250);
  SampleOptions greedy = o, top1 = o;
  greedy.temperature = 0, top1.top_k = 1, top1.seed = 9;
  EXPECT_EQ(generate(m, {1, 2, 3}, greedy), generate(m, {1, 2, 3}, top1));
  // 80% of the training tokens are the 16 ids of a cycle: the trained model's greedy choices are among them.
  const auto g = generate(m, {4, 5, 6, 7}, greedy);
  for (std::size_t i = 4; i < g.size(); ++i) EXPECT_LT(g[i], 16);
}

}  // namespace
}  // namespace stableflash::train

namespace stableflash::train {
namespace {

// The W_Q probe: every probe_every steps each layer's and each head's W_Q spectral norm, checked
// against a full SVD (Eigen, FP64) of the final checkpoint's weights, which the last probe saw.
// Power iteration estimates from below and stops when a round changes the estimate by at most
// 1e-6 of itself, leaving an error of about 1e-6 r / (1 - r), r = (sigma_2 / sigma_1)^2 (taken from
// the SVD; the factor 2 covers the neglected higher-order terms). It separates sigma_1 from sigma_2
// only at the rate r per round, so where they are nearly equal (r -> 1; one head here has
// sigma_2 / sigma_1 = 0.992) the round cap stops it in between: the estimate is then within twice
// their gap, 2 (1 - sqrt(r)) sigma_1, which is far below the growth the probe is for (x10 and more).
// metrics.jsonl prints 6 significant digits (half a unit of the last: 5e-6 relative).
TEST_F(Trainer, ProbesWriteLayerAndHeadSpectralNorms) {
  TrainConfig c = config();  // 2 layers, 2 heads, width 32
  c.train.probe_every = 2;
  train(c, dir.file("run"));
  const auto lines = metrics_lines(dir.file("run/metrics.jsonl"));
  int probes = 0;
  for (const auto& l : lines) {
    const bool probe_step = (l["step"].get<int>() + 1) % 2 == 0;
    ASSERT_EQ(l.contains("wq_sigma") && l.contains("wq_sigma_heads"), probe_step) << l.dump();
    probes += probe_step;
  }
  EXPECT_EQ(probes, 3);  // after steps 1, 3, 5 of 6
  const auto layers = lines.back()["wq_sigma"].get<std::vector<double>>();
  const auto heads = lines.back()["wq_sigma_heads"].get<std::vector<std::vector<double>>>();
  const auto weights = data::SafetensorsFile::read(latest_checkpoint(dir.file("run")) + "/model.safetensors");
  const int C = c.model.n_embd, H = c.model.n_head, D = C / H;
  ASSERT_EQ(layers.size(), std::size_t(c.model.n_layer));
  ASSERT_EQ(heads.size(), std::size_t(c.model.n_layer));
  auto check = [&](double probe, const Eigen::MatrixXd& m, const std::string& what) {
    const Eigen::VectorXd s = Eigen::JacobiSVD<Eigen::MatrixXd>(m).singularValues();
    const double r = s.size() > 1 ? std::pow(s(1) / s(0), 2) : 0.0;
    // 50 rounds (the cap after the first probe) reach the 1e-6 stop from any warm start when r^50 < 1e-6.
    const double printed = 5e-6, converged = 2 * 1e-6 * r / (1 - r), between = 2 * (1 - std::sqrt(r));
    const double error = std::pow(r, 50) < 1e-6 ? converged : between;
    EXPECT_LE(probe, s(0) * (1 + printed)) << what;
    EXPECT_GE(probe, s(0) * (1 - error - printed)) << what << " ((sigma_2 / sigma_1)^2 = " << r << ")";
  };
  for (int l = 0; l < c.model.n_layer; ++l) {
    const auto w = weights.find("transformer.h." + std::to_string(l) + ".attn.c_attn.weight")->as<float>();  // [C, 3C]
    Eigen::MatrixXd wq(C, C);
    for (int i = 0; i < C; ++i)
      for (int j = 0; j < C; ++j) wq(i, j) = double(w[std::size_t(i) * 3 * C + j]);
    check(layers[std::size_t(l)], wq, "layer " + std::to_string(l));
    ASSERT_EQ(heads[std::size_t(l)].size(), std::size_t(H));
    for (int h = 0; h < H; ++h) check(heads[std::size_t(l)][std::size_t(h)], wq.middleCols(h * D, D), "layer " + std::to_string(l) + " head " + std::to_string(h));
  }
}

}  // namespace
}  // namespace stableflash::train
