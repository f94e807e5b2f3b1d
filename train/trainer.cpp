// The training loop (see trainer.hpp), written once against TrainingEngine (engine.hpp).
#include "stableflash/train/trainer.hpp"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>

#include "engine.hpp"
#include "probes.hpp"
#include "spikes.hpp"
#include "stableflash/data/atomic_file.hpp"
#include "stableflash/data/shards.hpp"
#include "stableflash/optim/optimizer.hpp"
#include "stableflash/train/checkpoint.hpp"
#include "stableflash/train/progress.hpp"
#include "stableflash/train/run_files.hpp"
#include "stableflash/train/run_lock.hpp"
#include "stableflash/train/signals.hpp"

namespace stableflash::train {
namespace fs = std::filesystem;

namespace {

// Distinct streams for training windows and validation windows, apart from the weight init
// (which uses SplitMix64(seed, tensor index)).
constexpr std::uint64_t kDataSalt = 0x5851f42d4c957f2dull;
constexpr std::uint64_t kValSalt = 0x14057b7ef767814full;

std::vector<std::string> shards_or_explain(const TrainConfig& c, const std::string& split) {
  const std::string how = "Build the default corpus with scripts/setup-corpus.sh, or point data.dir at a folder of llm.c token shards "
                          "(--set data.dir=DIR).";
  if (!fs::is_directory(c.data.dir)) throw std::runtime_error("data.dir " + c.data.dir + " does not exist. " + how);
  auto paths = data::list_shards(c.data.dir, split);
  if (paths.empty()) throw std::runtime_error("no " + split + " shards (" + split + "_NNNNNN.bin) in " + c.data.dir + ". " + how);
  return paths;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// A number as JSON: non-finite values (a NaN validation loss, an infinite norm) as null, which JSON
// has, instead of the bare nan/inf that printf writes and no JSON reader takes.
std::string json_number(const char* f, double v) { return std::isfinite(v) ? fmt(f, v) : "null"; }

std::string metrics_line(const StepMetrics& m) {
  std::string s = "{\"step\": " + std::to_string(m.step) + ", \"loss\": " + json_number("%.9g", m.loss) + ", \"lr\": " +
                  json_number("%.17g", m.lr) + ", \"grad_norm\": " + json_number("%.9g", m.grad_norm) +
                  ", \"tokens_per_s\": " + json_number("%.1f", m.tokens_per_s);
  if (m.val_loss) s += ", \"val_loss\": " + json_number("%.9g", *m.val_loss);
  if (!m.wq_sigma.empty()) {
    s += ", \"wq_sigma\": [";
    for (std::size_t l = 0; l < m.wq_sigma.size(); ++l) s += (l ? ", " : "") + json_number("%.6g", m.wq_sigma[l]);
    s += "], \"wq_sigma_heads\": [";
    for (std::size_t l = 0; l < m.wq_sigma_heads.size(); ++l) {
      s += l ? ", [" : "[";
      for (std::size_t h = 0; h < m.wq_sigma_heads[l].size(); ++h) s += (h ? ", " : "") + json_number("%.6g", m.wq_sigma_heads[l][h]);
      s += "]";
    }
    s += "]";
  }
  return s + m.probe_fields + "}\n";
}

// Tokens of windows [first, first + count) into inputs/targets [count, T].
void fill_batch(const data::ShardSet& set, const std::vector<data::WindowStart>& windows, std::size_t first, int count, int len,
                std::vector<int>& inputs, std::vector<int>& targets) {
  inputs.resize(std::size_t(count) * len), targets.resize(std::size_t(count) * len);
  for (int b = 0; b < count; ++b) {
    const auto w = set.window(windows[first + b], std::size_t(len) + 1);
    for (int t = 0; t < len; ++t) {
      inputs[std::size_t(b) * len + t] = w[t];
      targets[std::size_t(b) * len + t] = w[t + 1];
    }
  }
}

// The token windows of one optimizer step: `micro` micro-batches of [B, T] inputs and targets.
struct StepBatch {
  std::vector<data::WindowStart> windows;
  std::vector<std::vector<int>> inputs, targets;
};

std::unique_ptr<TrainingEngine> make_engine(const TrainConfig& config, const TrainOptions& options) {
  const World& world = options.world;
  if (world.uses_collectives()) {
    if (options.device == TrainDevice::cpu) throw std::invalid_argument("data-parallel training (WORLD_SIZE > 1) runs on GPUs only; drop --device cpu");
    if (config.train.grad_accum % world.size != 0)
      throw std::invalid_argument("train.grad_accum = " + std::to_string(config.train.grad_accum) + " must be a multiple of the " +
                                  std::to_string(world.size) + " ranks: each rank trains grad_accum / ranks micro-batches of every step");
    return make_cuda_engine(config, world.local_rank, world);
  }
  const bool cuda = options.device == TrainDevice::cuda || (options.device == TrainDevice::automatic && cuda_training_available());
  if (cuda && options.cpu_bf16_autocast) throw std::invalid_argument("BF16 autocast emulation is a CPU option");
  return cuda ? make_cuda_engine(config, options.gpu) : make_cpu_engine(config, options.cpu_bf16_autocast);
}

}  // namespace

std::uint64_t data_seed(std::uint64_t seed) { return seed ^ kDataSalt; }

TrainResult run_training(const TrainConfig& config, const TrainOptions& options) {
  config.validate();
  if (options.run_dir.empty()) throw std::invalid_argument("a run directory is needed (--run-dir)");
  const TrainSettings& ts = config.train;
  const int B = ts.batch_size, T = ts.seq_len;
  const int windows_per_step = B * ts.grad_accum;

  // Data first: a missing corpus should fail before anything is written.
  // Every token id is checked against the model's vocabulary when the shards open (file and offset
  // of the first bad one), not hours later when a window holding it is drawn.
  const auto vocab = std::uint32_t(config.model.vocab_size);
  const data::ShardSet train_set(shards_or_explain(config, config.data.train_split), vocab);
  std::optional<data::ShardSet> val_set;
  if (ts.val_every > 0) val_set.emplace(shards_or_explain(config, config.data.val_split), vocab);
  BatchLogHeader header;
  for (std::size_t i = 0; i < train_set.shard_count(); ++i) header.shards.push_back(fs::path(train_set.shard(i).path()).filename().string());
  header.windows_per_step = windows_per_step;
  header.window_tokens = T + 1;

  // Data parallel: every rank computes, rank 0 alone writes the run directory and reports.
  const World& world = options.world;
  const bool writer = world.rank == 0;
  // One trainer per run directory, taken before anything in it is read (a --resume next to a live
  // run would read a checkpoint that run is about to replace).
  std::optional<RunLock> lock;
  if (writer) lock.emplace(options.run_dir);

  const auto engine = make_engine(config, options);
  if (options.progress && writer)
    std::fprintf(stderr, "  device: %s%s\n", engine->describe().c_str(),
                 world.distributed() ? (", " + std::to_string(world.size) + " ranks").c_str() : "");
  TrainerState state;
  std::string last_checkpoint;
  std::int64_t last_checkpoint_step = -1;
  std::vector<std::vector<data::WindowStart>> logged_steps;  // batches.log up to the checkpoint (resume)
  if (options.resume) {
    const std::string latest = latest_checkpoint(options.run_dir);
    Checkpoint ckpt;
    try {
      ckpt = open_checkpoint(latest);
    } catch (const std::runtime_error& e) {
      // Point at the checkpoints that are still there: the user decides which one to trust.
      std::string others;
      for (const auto& c : list_checkpoints(options.run_dir))
        if (c != latest) others += " " + fs::path(c).filename().string();
      throw std::runtime_error(std::string(e.what()) +
                               (others.empty() ? std::string()
                                               : ". Earlier checkpoints in " + options.run_dir + "/checkpoints:" + others +
                                                     " (to resume from one, write its name into checkpoints/latest)"));
    }
    const auto mismatches = resume_mismatches(ckpt.config, config);
    if (!mismatches.empty()) {
      std::string msg = "checkpoint " + ckpt.dir + " was written with another config; refusing to resume:";
      for (const auto& m : mismatches) msg += "\n  " + m;
      throw std::runtime_error(msg);
    }
    // Read now, written only after every check: a resume that fails leaves the run as it was.
    if (writer) logged_steps = batch_log_for_resume(options.run_dir + "/batches.log", header, ckpt.state.step);
    engine->load(ckpt);
    state = ckpt.state;
    last_checkpoint = ckpt.dir;
    last_checkpoint_step = ckpt.state.step;
  } else {
    if (fs::exists(fs::path(options.run_dir) / "checkpoints" / "latest"))
      throw std::runtime_error(options.run_dir + " already holds a run with checkpoints; continue it with --resume or choose another --run-dir");
    engine->init_weights(ts.seed);
  }
  if (!options.replay_log.empty()) state.replay_log = fs::absolute(options.replay_log).string();
  std::optional<BatchLog> replay;
  if (!state.replay_log.empty()) {
    replay = BatchLog::read(state.replay_log, ts.steps);
    if (replay->header.windows_per_step != windows_per_step || replay->header.window_tokens != T + 1)
      throw std::runtime_error(state.replay_log + ": logged " + std::to_string(replay->header.windows_per_step) + " windows of " +
                               std::to_string(replay->header.window_tokens) + " tokens per step; this config takes " +
                               std::to_string(windows_per_step) + " of " + std::to_string(T + 1));
    if (replay->header.shards != header.shards)
      throw std::runtime_error(state.replay_log + ": logged on other training shards than those in " + config.data.dir);
    if (std::int64_t(replay->steps.size()) < ts.steps)
      throw std::runtime_error(state.replay_log + ": holds " + std::to_string(replay->steps.size()) + " steps; train.steps is " +
                               std::to_string(ts.steps) + " (use --steps " + std::to_string(replay->steps.size()) + " or fewer)");
  }

  const std::string run = options.run_dir;
  std::optional<BatchLogWriter> batch_log;
  std::ofstream metrics;
  if (writer) {
    // Every check has passed: from here on the run directory changes.
    clean_up_interrupted_writes(run);
    data::write_file_atomically(run + "/config.json", [&](std::ostream& o) { o << to_json(config); });
    truncate_metrics(run + "/metrics.jsonl", state.step);
    batch_log.emplace(run + "/batches.log", header, logged_steps);
    metrics.open(run + "/metrics.jsonl", std::ios::app);
    if (!metrics) throw std::runtime_error(run + "/metrics.jsonl: cannot open for appending");
  }

  // Held-out windows, fixed for the whole run so validation losses compare across steps.
  std::vector<data::WindowStart> val_windows;
  if (val_set) {
    SplitMix64 rng(ts.seed ^ kValSalt);
    for (int i = 0; i < ts.val_batches * B; ++i) val_windows.push_back(val_set->sample(rng, std::size_t(T) + 1));
  }
  std::vector<int> inputs, targets;
  auto validate_loss = [&]() {
    for (int k = world.rank; k < ts.val_batches; k += world.size) {
      fill_batch(*val_set, val_windows, std::size_t(k) * B, B, T, inputs, targets);
      engine->eval_micro_batch(inputs, targets, B, T);
    }
    return engine->take_loss_sum() / ts.val_batches;
  };
  // The windows and tokens of a step: from the replayed log or drawn from the step's own stream.
  auto load_step = [&](std::int64_t step) {
    StepBatch b;
    if (replay) {
      b.windows = replay->steps[std::size_t(step)];
    } else {
      SplitMix64 rng(data_seed(ts.seed), std::uint64_t(step));
      for (int i = 0; i < windows_per_step; ++i) b.windows.push_back(train_set.sample(rng, std::size_t(T) + 1));
    }
    b.inputs.resize(std::size_t(ts.grad_accum)), b.targets.resize(std::size_t(ts.grad_accum));
    for (int micro = 0; micro < ts.grad_accum; ++micro)
      fill_batch(train_set, b.windows, std::size_t(micro) * B, B, T, b.inputs[std::size_t(micro)], b.targets[std::size_t(micro)]);
    return b;
  };

  // Probes and the spike detector read the run (rank 0 only): their state continues on resume
  // from the metrics kept up to the checkpoint.
  TrainingProbes probes(config);
  SpikeDetector spikes(config.probe);
  int captures_written = 0;
  if (writer && options.resume) {
    probes.restore(run + "/metrics.jsonl");
    spikes.restore(run + "/metrics.jsonl");
  }
  Progress progress(options.progress && writer, state.step, ts.steps, config.tokens_per_step());
  TrainResult result;
  result.last_checkpoint = last_checkpoint;
  // On the GPU the next step's batch is read while this step's work runs (the host would
  // otherwise leave the GPU idle between steps).
  std::future<StepBatch> prefetched;
  // Ctrl-C / SIGTERM: the step in flight finishes, a checkpoint is written, and the run returns
  // (the caller exits 130 / 143). Before this point a signal ends the process at once: nothing to save.
  std::optional<StopOnSignals> stop_on_signals;
  if (options.stop_on_signals) stop_on_signals.emplace();
  // Data parallel: every rank asks whether any was signalled (a collective), so all stop after the
  // same step even when the signal reaches them at different moments. Past the first step the
  // question is asked in the middle of the step (after the loss, when the communication stream is
  // idle): at the top it would wait for the previous step's parameter all-gather, which ZeRO-1
  // overlaps with the forward.
  const std::int64_t first_step = state.step;
  bool stop_agreed = false;
  auto save = [&]() {  // a collective under ZeRO-1: every rank calls it, rank 0 writes
    const TrainingSnapshot snapshot = engine->snapshot();
    if (writer) {
      last_checkpoint = save_checkpoint(run, config, snapshot, state);
      result.last_checkpoint = last_checkpoint;
    }
    last_checkpoint_step = state.step;
  };
  for (std::int64_t step = state.step; step < ts.steps; ++step) {
    const bool ask_now = !world.distributed() || step == first_step;
    if (options.stop_on_signals && (ask_now ? engine->any_rank(stop_signal() != 0) : stop_agreed)) {
      result.stopped_by_signal = stop_signal() != 0 ? stop_signal() : SIGTERM;  // a rank of another host was asked
      if (state.step > 0 && last_checkpoint_step != state.step) save();
      break;
    }
    const auto t0 = std::chrono::steady_clock::now();
    StepBatch batch = prefetched.valid() ? prefetched.get() : load_step(step);
    if (batch_log) batch_log->append(step, batch.windows);
    engine->heartbeat(step);

    engine->zero_grad();
    // Rank r takes micro-batches r, r + ranks, ...: the step's windows do not depend on the world size.
    const bool last = step + 1 == ts.steps;
    for (int micro = world.rank; micro < ts.grad_accum; micro += world.size) {
      const bool last_micro = micro + world.size >= ts.grad_accum;
      if (writer && last_micro) probes.before_last_micro_batch(step, last, *engine);
      engine->train_micro_batch(batch.inputs[std::size_t(micro)], batch.targets[std::size_t(micro)], B, T, 1.0f / float(ts.grad_accum),
                                last_micro);
    }
    if (engine->asynchronous() && step + 1 < ts.steps) prefetched = std::async(std::launch::async, load_step, step + 1);
    StepMetrics m;
    m.step = step;
    m.loss = float(engine->take_loss_sum()) / float(ts.grad_accum);  // an FP32 value: metrics.jsonl's %.9g round-trips it
    if (options.stop_on_signals && world.distributed()) stop_agreed = engine->any_rank(stop_signal() != 0);
    auto stop_non_finite = [&]() {
      progress.finish();
      throw NonFiniteLoss(std::string(std::isfinite(m.loss) ? "gradient norm" : "loss") + " is " +
                          fmt("%g", std::isfinite(m.loss) ? m.grad_norm : m.loss) + " at step " + std::to_string(step) +
                          "; stopped before updating the weights. " +
                          (last_checkpoint.empty() ? std::string("No checkpoint was written yet.")
                                                   : "The last good checkpoint is " + last_checkpoint + " (step " +
                                                         std::to_string(last_checkpoint_step) + "); it is left as it was."));
    };
    if (!std::isfinite(m.loss)) stop_non_finite();
    // The norm, the clipping factor and the update are queued without waiting: on the GPU the
    // update then overlaps the next step's forward. The norm is read once it is computed; a norm
    // that is not finite has made the queued update change nothing.
    engine->clip_grad_norm(config.optim.grad_clip);
    m.lr = optim::learning_rate(config.optim, step);
    engine->optimizer_step(m.lr);
    m.grad_norm = engine->grad_norm();
    if (!std::isfinite(m.grad_norm)) stop_non_finite();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.tokens_per_s = double(config.tokens_per_step()) / std::max(seconds, 1e-9);
    if (val_set && ((step + 1) % ts.val_every == 0 || last)) m.val_loss = validate_loss();
    if (writer) probes.after_step(step, last, *engine, m);
    if (writer) {
      metrics << metrics_line(m) << std::flush;
      if (!metrics) throw std::runtime_error(run + "/metrics.jsonl: write failed");
      if (const auto why = spikes.check(m); why && captures_written < config.probe.spike_captures) {
        const SpikeCapture c = write_spike_capture(run, config, step, *why, last_checkpoint, last_checkpoint_step);
        ++captures_written;
        m.capture_dir = c.dir;
        if (options.progress)
          std::fprintf(stderr, "\n  spike at step %lld: %s\n  capture: %s\n  replay:  %s\n", static_cast<long long>(step), why->c_str(),
                       c.dir.c_str(), c.replay_command.c_str());
      }
    }
    state.step = step + 1;
    state.last_loss = m.loss;
    if (last || (ts.checkpoint_every > 0 && (step + 1) % ts.checkpoint_every == 0)) save();
    progress.update(m);
    result.steps.push_back(m);
    if (options.on_step) options.on_step(m);
  }
  progress.finish();
  result.execution = engine->execution_summary();
  result.graph_replays = engine->graph_replays();
  if (options.progress && writer && !result.execution.empty()) std::fprintf(stderr, "  %s\n", result.execution.c_str());
  engine->finish();
  return result;
}

}  // namespace stableflash::train
