// The training benchmark (see bench.hpp). Batches are random token ids drawn once from a seed, so
// no corpus is needed and nothing but the training step is timed.
#include "stableflash/train/bench.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <vector>

#include "engine.hpp"
#include "probes.hpp"
#include "stableflash/numerics/random.hpp"
#include "stableflash/optim/optimizer.hpp"

namespace stableflash::train {

double BenchTrainResult::probe_share() const {
  double share = 0;
  if (wq_probe_ms >= 0 && probe_every > 0) share += wq_probe_ms / (double(probe_every) * ms_per_step);
  if (attention_probe_ms >= 0 && attention_every > 0) share += attention_probe_ms / (double(attention_every) * ms_per_step);
  if (sigma_probe_ms >= 0 && sigma_every > 0) share += sigma_probe_ms / (double(sigma_every) * ms_per_step);
  return share;
}

BenchTrainResult bench_training(const TrainConfig& config, const BenchTrainOptions& o) {
  config.validate();
  if (o.steps < 5 || o.warmup_steps < 1) throw std::invalid_argument("bench train: --steps must be >= 5 and --warmup >= 1");
  const TrainSettings& ts = config.train;
  const int B = ts.batch_size, T = ts.seq_len;
  const World& world = o.world;
  if (world.distributed() && ts.grad_accum % world.size != 0)
    throw std::invalid_argument("bench train: train.grad_accum must be a multiple of the " + std::to_string(world.size) + " ranks");
  const bool cuda = world.distributed() || o.device == TrainDevice::cuda || (o.device == TrainDevice::automatic && cuda_training_available());
  const std::int64_t memory_before = cuda ? cuda_memory_in_use() : -1;
  const auto engine = cuda ? make_cuda_engine(config, world.distributed() ? world.local_rank : o.gpu, world) : make_cpu_engine(config);
  engine->init_weights(ts.seed);

  // Eight micro-batches of random ids over the real vocabulary, split into inputs and targets once
  // and reused in turn (as the peer does), so the timed steps do no host work on them.
  SplitMix64 rng(o.seed);
  struct MicroBatch {
    std::vector<int> inputs, targets;  // [B, T]
  };
  std::vector<MicroBatch> batches(8);
  for (auto& mb : batches) {
    std::vector<int> seq(std::size_t(B) * (T + 1));  // B windows of T + 1 tokens
    for (int& t : seq) t = int(rng.next() % std::uint64_t(config.model.vocab_size));
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t) {
        mb.inputs.push_back(seq[std::size_t(b) * (T + 1) + t]);
        mb.targets.push_back(seq[std::size_t(b) * (T + 1) + t + 1]);
      }
  }
  std::int64_t micro_index = 0;
  auto step = [&](std::int64_t s) {
    engine->zero_grad();
    for (int micro = world.rank; micro < ts.grad_accum; micro += world.size) {
      const MicroBatch& mb = batches[std::size_t(micro_index++ % 8)];
      engine->train_micro_batch(mb.inputs, mb.targets, B, T, 1.0f / float(ts.grad_accum), micro + world.size >= ts.grad_accum);
    }
    const double loss = engine->take_loss_sum() / ts.grad_accum;
    engine->clip_grad_norm(config.optim.grad_clip);
    engine->optimizer_step(optim::learning_rate(config.optim, s));
    return loss;
  };

  BenchTrainResult r;
  r.device = engine->describe();
  r.ranks = world.size;
  std::int64_t s = 0;
  for (int i = 0; i < o.warmup_steps; ++i) r.last_loss = step(s++);
  std::int64_t peak = cuda ? cuda_memory_in_use() : -1;
  const int window = o.steps / 5;
  std::vector<double> per_step;
  // Data parallel: the compute stream's waits for communication are timed by events over the
  // timed windows (a few microseconds of host work per wait).
  engine->measure_communication(true);
  engine->take_communication_wait_ms();
  engine->take_update_wait_ms();
  double timed_s = 0;
  const std::int64_t replays_before = engine->graph_replays();
  for (int w = 0; w < 5; ++w) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < window; ++i) r.last_loss = step(s++);
    engine->take_loss_sum();  // waits for the window's last optimizer step
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    timed_s += seconds;
    per_step.push_back(seconds / window);
    if (cuda) peak = std::max(peak, cuda_memory_in_use());
  }
  // Every timed micro-batch of this rank came from the graph: the step time is the graph's.
  r.cuda_graph = engine->graph_replays() - replays_before == std::int64_t(5) * window * (ts.grad_accum / world.size);
  const double wait_ms = engine->take_communication_wait_ms();
  const double update_wait_ms = engine->take_update_wait_ms();
  engine->measure_communication(false);
  r.communication_wait_ms = wait_ms / double(5 * window);
  r.communication_wait_share = wait_ms / (timed_s * 1e3);
  r.optimizer_overlapped = engine->optimizer_overlaps();
  r.optimizer_wait_ms = update_wait_ms / double(5 * window);
  std::sort(per_step.begin(), per_step.end());
  const double dt = per_step[2];
  // The parts of a step, each timed alone between synchronizations (take_loss_sum waits for the
  // optimizer's stream too): with the update overlapped, optimizer_ms is its whole time, of which
  // the step itself only sees optimizer_wait_ms.
  auto median_ms = [&](auto&& part) {
    std::vector<double> t;
    for (int i = 0; i < 7; ++i) {
      engine->take_loss_sum();
      const auto t0 = std::chrono::steady_clock::now();
      part();
      engine->take_loss_sum();
      t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[3];
  };
  const MicroBatch& first = batches[0];
  r.forward_ms = median_ms([&] { engine->eval_micro_batch(first.inputs, first.targets, B, T); });
  if (!world.distributed()) {  // a lone micro-batch of one rank would wait for the others' all-reduce
    r.forward_backward_ms = median_ms([&] { engine->train_micro_batch(first.inputs, first.targets, B, T, 1.0f, /*last=*/false); });
    r.optimizer_ms = median_ms([&] {
      engine->clip_grad_norm(config.optim.grad_clip);
      engine->optimizer_step(optim::learning_rate(config.optim, s));
    });
  }
  if (!world.distributed() && config.train.probe_every > 0) {
    // A probed step against a plain one, each timed alone between synchronizations. The first
    // probe starts the power iterations cold (a run's first probe does too): not timed.
    TrainingProbes probes(config);
    auto probed = [&](bool wq, bool sigma, bool attention) {
      engine->zero_grad();
      for (int micro = 0; micro < ts.grad_accum; ++micro) {
        const MicroBatch& mb = batches[std::size_t(micro_index++ % 8)];
        if (micro + 1 == ts.grad_accum) probes.request(*engine, attention);
        engine->train_micro_batch(mb.inputs, mb.targets, B, T, 1.0f / float(ts.grad_accum), micro + 1 == ts.grad_accum);
      }
      StepMetrics m;
      m.loss = engine->take_loss_sum() / ts.grad_accum;
      engine->clip_grad_norm(config.optim.grad_clip);
      engine->optimizer_step(optim::learning_rate(config.optim, s));
      probes.measure(*engine, m, wq, sigma, attention);
    };
    probed(true, config.probe.sigma_every > 0, config.probe.attention_every > 0);
    const double plain = median_ms([&] { r.last_loss = step(s++); });
    r.wq_probe_ms = std::max(0.0, median_ms([&] { probed(true, false, false); }) - plain);
    r.probe_every = config.train.probe_every;
    if (config.probe.attention_every > 0) {
      r.attention_probe_ms = std::max(0.0, median_ms([&] { probed(false, false, true); }) - plain);
      r.attention_every = config.probe.attention_every;
    }
    if (config.probe.sigma_every > 0) {
      r.sigma_probe_ms = std::max(0.0, median_ms([&] { probed(false, true, false); }) - plain);
      r.sigma_every = config.probe.sigma_every;
    }
  }
  r.ms_per_step = dt * 1e3;
  r.tokens_per_s = double(config.tokens_per_step()) / dt;
  if (cuda) r.peak_memory_gib = double(peak - memory_before) / double(1ull << 30);
  // Every rank's own (collectives: every rank reaches them).
  r.peak_memory_gib_per_rank = engine->from_every_rank(r.peak_memory_gib);
  r.communication_wait_share_per_rank = engine->from_every_rank(r.communication_wait_share);
  const auto layout = model::parameter_layout(config.model);
  for (const auto& t : layout) r.parameters += t.size;
  const double n_params = double(r.parameters - std::int64_t(config.model.block_size) * config.model.n_embd);  // without wpe
  const double per_token = 6.0 * n_params + 12.0 * config.model.n_layer * config.model.n_embd * double(T);
  r.model_flops_per_step = per_token * double(config.tokens_per_step());
  r.mfu = r.model_flops_per_step / dt / 989e12 / world.size;  // per GPU
  r.execution = engine->execution_summary();
  engine->finish();
  return r;
}

}  // namespace stableflash::train
