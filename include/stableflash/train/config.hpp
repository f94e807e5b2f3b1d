// The trainer's configuration: typed fields, the dotted keys that set them (config files and
// `--set key=value` use the same keys), presets, and per-layer attention settings.
// docs/training.md lists every key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/optimizer.hpp"

namespace stableflash::train {

// One layer's attention, as key -> value strings (keys of kAttentionKeys). The defaults apply to
// every layer; `attention.layer.N.KEY` overrides layer N (0-based: the paper's "second layer" is 1).
using AttentionSettings = std::map<std::string, std::string>;

// The attention settings a run gets unless told otherwise: attention::recommended_settings(), the
// project's one definition of its default (fused numerics, the standard shift, delta from the
// compensated output; docs/numerics-findings.md "Recommendation").
AttentionSettings recommended_attention();

struct TrainSettings {
  std::int64_t steps = 300;        // optimizer steps to reach (a resumed run continues up to this)
  int batch_size = 8;              // sequences per micro-batch
  int seq_len = 128;               // tokens per sequence (<= model.block_size)
  int grad_accum = 1;              // micro-batches per optimizer step
  std::uint64_t seed = 1337;       // initialisation and window sampling
  std::int64_t val_every = 50;     // 0 disables validation
  int val_batches = 4;             // micro-batches of held-out windows per validation
  std::int64_t checkpoint_every = 100;  // 0: only at the end
  int keep_checkpoints = 2;        // newest checkpoints kept in RUN/checkpoints
  // GPU: the attention backward accumulates dQ in a fixed order too (every other GPU reduction
  // always does), so a step's bits depend only on the weights and the batch: bitwise resume and
  // replay. Off by default: it costs about 14% of a GPT-2 124M step (docs/benchmarks.md). The CPU
  // path is always deterministic.
  bool deterministic = false;
  // GPU, one process or all-reduce data parallelism (not ZeRO-1): the optimizer step runs on a
  // second stream while the next step's forward starts, layer by layer in the order the forward
  // reads the weights. Changes no bit of the results (tested); off (the default: on the H200 at
  // GPT-2 124M it measured the same step time, 30.61 against 30.56 ms, docs/benchmarks.md): the
  // same kernels one after the other on one stream.
  bool overlap_optimizer = false;
  // GPU, one process without train.overlap_optimizer: each micro-batch's forward and backward is
  // replayed from a CUDA graph, recorded on the second micro-batch (model/gpt2_cuda.hpp
  // set_cuda_graph): the host launches one graph instead of ~316 kernels. The same bits as off
  // (tested); on by default. At GPT-2 124M, B 16 x T 1024 on the H200 it measured no gain (30.53
  // against 30.55 ms, docs/benchmarks.md): the host was already ahead of the GPU there. Data
  // parallelism and the overlapped optimizer stay without graphs (their per-layer host hooks);
  // probe steps and validation run as usual.
  bool cuda_graph = true;
  // Every N steps the probes run (train/probes.hpp): spectral norms of every weight matrix and of
  // each head's W_Q, W_K, W_V, W_O, and the attention statistics; 0: never.
  std::int64_t probe_every = 100;
  bool operator==(const TrainSettings&) const = default;
};

// The `probe.*` keys: what the probes look at beyond the spectral norms, and the spike detector.
// None of them changes what a step computes (they may change on resume).
struct ProbeSettings {
  // Layers whose attention is captured for the statistics, the delta shadow and the similarity
  // (flash layers only; `standard` layers have no BF16 q, k, v). Empty: every layer.
  std::vector<int> layers;
  // The attention probes (the kernels' tie counters, row statistics, delta shadow, similarity;
  // all from one capture) every N steps (0: never).
  std::int64_t attention_every = 500;
  // Spectral norms of every weight matrix and of each head's W_K, W_V, W_O every N steps (0: never):
  // a host power iteration over all weights, too slow for every probe step (docs/training.md).
  std::int64_t sigma_every = 2000;
  int sequences = 1;   // sequences of the step's last micro-batch that a capture keeps
  int rows = 16;       // query rows per sequence and head the row statistics and similarity sample
  // Spike detector: a loss above loss_factor x the median of the last `window` losses, or a
  // spectral norm above sigma_factor x the median of its last `window` probes, writes a capture
  // (RUN/captures/step_N) to replay the event; 0 turns a criterion off.
  double spike_loss_factor = 1.5;
  double spike_sigma_factor = 2.0;
  int spike_window = 50;
  int spike_captures = 3;  // at most this many captures per run (a diverged run spikes every step)
  bool operator==(const ProbeSettings&) const = default;
};

struct DataSettings {
  std::string dir;                  // folder of {train,val}_NNNNNN.bin shards
  std::string train_split = "train";
  std::string val_split = "val";
  bool operator==(const DataSettings&) const = default;
};

// Data parallelism over several GPUs (ignored by a single process). Neither changes what a step
// computes beyond the order of floating-point sums, so both may change on resume.
struct DistSettings {
  // 1: ZeRO-1, gradients reduce-scattered, optimizer state sharded over the ranks, parameters
  // all-gathered; 0: gradients all-reduced, every rank keeps the whole optimizer state.
  int zero_stage = 1;
  // Gradient buckets of about this many MB (FP32 values), cut from the last layer down; each is
  // reduced once the backward has finished it, while the backward goes on (PyTorch DDP's 25 MB).
  double bucket_mb = 25.0;
  // The tied token embedding's gradient reduced in two parts: the classifier's (dense, complete
  // before the layers' backward) overlapped with the backward, the embedding lookup's rows (known
  // at its end) sent to their owners only. Needs the padded vocabulary to be a multiple of the
  // world size (else ignored); changes the FP32 order in which wte's gradient is summed.
  bool split_embedding = true;
  bool operator==(const DistSettings&) const = default;
};

struct TrainConfig {
  std::string preset = "tiny";
  model::Gpt2Config model;
  optim::OptimizerConfig optim;
  TrainSettings train;
  DataSettings data;
  DistSettings dist;
  ProbeSettings probe;
  AttentionSettings attention_default = recommended_attention();
  std::map<int, AttentionSettings> attention_layer;  // overrides by layer index

  // Sets one dotted key from its text form; `source` names where it came from ("--set",
  // "config.toml") in errors. Throws std::invalid_argument naming the key and the valid values.
  void set(const std::string& key, const std::string& value, const std::string& source);
  // Every key with its current value, in documentation order (attention overrides last).
  std::vector<std::pair<std::string, std::string>> entries() const;

  // Checks every field and the attention settings of every layer; throws naming the key.
  void validate() const;
  // The attention of each layer, resolved from the defaults and the overrides.
  std::vector<model::LayerAttention> layer_attention() const;
  // The layers the probes capture: probe.layers, or every layer when it is empty.
  std::vector<int> probe_layers() const;
  // Tokens one optimizer step trains on.
  std::int64_t tokens_per_step() const { return std::int64_t(train.batch_size) * train.seq_len * train.grad_accum; }
};

// Names of the presets: "tiny" (the default), "gpt2-124m", "gpt2-350m".
std::vector<std::string> preset_names();
// Throws std::invalid_argument listing the valid names.
TrainConfig preset(const std::string& name);

// Reads a TOML (.toml) or JSON (.json) file of nested tables/objects whose dotted paths are the
// keys, and applies it on top of `config`. Errors name the file and the key.
void apply_config_file(TrainConfig& config, const std::string& path);
// Applies "key=value" (as given to --set).
void apply_assignment(TrainConfig& config, const std::string& assignment);

// Where a run's settings come from, in the order they apply (what `stableflash train` parses).
struct ConfigSources {
  std::string preset;             // empty: "tiny", or on resume the run's own config.json
  std::string resume_run_dir;     // non-empty: start from RUN/config.json (a preset is then refused)
  std::string config_file;        // optional TOML/JSON file
  std::vector<std::string> sets;  // "key=value" overrides
  std::int64_t steps = 0;         // > 0: train.steps
};
// Builds and validates the config. Errors name the source.
TrainConfig build_config(const ConfigSources& sources);

// The config as nested JSON text (RUN/config.json, checkpoints), and back.
std::string to_json(const TrainConfig& config);
TrainConfig from_json(const std::string& json_text, const std::string& source);

// Keys whose values must agree between a checkpoint and the run that resumes from it (everything
// that changes what the steps compute); returns "key: checkpoint has A, this run has B" lines.
std::vector<std::string> resume_mismatches(const TrainConfig& checkpoint, const TrainConfig& run);

// The default data folder: <source tree>/.deps/corpus/shards, where scripts/setup-corpus.sh builds
// the default corpus.
std::string default_data_dir();

}  // namespace stableflash::train
