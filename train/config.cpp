// Trainer configuration: one table of dotted keys drives --set, config files, JSON round trips
// and the documentation order (see config.hpp).
#include "stableflash/train/config.hpp"

#include "stableflash/attention/option_text.hpp"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#ifndef STABLEFLASH_SOURCE_DIR
#error "STABLEFLASH_SOURCE_DIR must be defined by the build"
#endif

namespace stableflash::train {
namespace {

[[noreturn]] void bad_value(const std::string& source, const std::string& key, const std::string& value, const std::string& expected) {
  throw std::invalid_argument(source + ": " + key + " = '" + value + "': " + expected);
}

void parse(const std::string& s, const std::string& key, const std::string& src, std::int64_t& out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || errno) bad_value(src, key, s, "expected an integer");
  out = v;
}
void parse(const std::string& s, const std::string& key, const std::string& src, int& out) {
  std::int64_t v;
  parse(s, key, src, v);
  if (v < INT32_MIN || v > INT32_MAX) bad_value(src, key, s, "out of range");
  out = int(v);
}
void parse(const std::string& s, const std::string& key, const std::string& src, std::uint64_t& out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end || errno) bad_value(src, key, s, "expected a non-negative integer");
  out = v;
}
void parse(const std::string& s, const std::string& key, const std::string& src, double& out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end || errno || !std::isfinite(v)) bad_value(src, key, s, "expected a finite number");
  out = v;
}
void parse(const std::string& s, const std::string& key, const std::string& src, bool& out) {
  if (s == "true" || s == "1") out = true;
  else if (s == "false" || s == "0") out = false;
  else bad_value(src, key, s, "expected true or false");
}
void parse(const std::string& s, const std::string&, const std::string&, std::string& out) { out = s; }
// A list of layer indices: "1,2,5", or "all" (stored as empty).
void parse(const std::string& s, const std::string& key, const std::string& src, std::vector<int>& out) {
  std::vector<int> v;
  if (s != "all") {
    std::size_t start = 0;
    while (start <= s.size()) {
      const std::size_t comma = std::min(s.find(',', start), s.size());
      int x = 0;
      try {
        parse(s.substr(start, comma - start), key, src, x);
      } catch (const std::invalid_argument&) {
        bad_value(src, key, s, "expected `all` or layer indices separated by commas (e.g. 1,2)");
      }
      v.push_back(x);
      start = comma + 1;
    }
  }
  out = std::move(v);
}

std::string format(std::int64_t v) { return std::to_string(v); }
std::string format(int v) { return std::to_string(v); }
std::string format(std::uint64_t v) { return std::to_string(v); }
std::string format(bool v) { return v ? "true" : "false"; }
std::string format(const std::string& v) { return v; }
std::string format(const std::vector<int>& v) {
  if (v.empty()) return "all";
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}
std::string format(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips exactly
  return buf;
}

struct Key {
  std::string name;
  std::function<void(TrainConfig&, const std::string&, const std::string&)> set;
  std::function<std::string(const TrainConfig&)> get;
};

#define SF_KEY(NAME, FIELD) \
  Key { NAME, [](TrainConfig& c, const std::string& v, const std::string& src) { parse(v, NAME, src, c.FIELD); }, [](const TrainConfig& c) { return format(c.FIELD); } }

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      SF_KEY("model.n_layer", model.n_layer),
      SF_KEY("model.n_head", model.n_head),
      SF_KEY("model.n_embd", model.n_embd),
      SF_KEY("model.block_size", model.block_size),
      SF_KEY("model.vocab_size", model.vocab_size),
      SF_KEY("model.padded_vocab_size", model.padded_vocab_size),
      SF_KEY("model.bias", model.bias),
      SF_KEY("model.init_std", model.init_std),
      Key{"optim.name",
          [](TrainConfig& c, const std::string& v, const std::string& src) {
            const auto k = optim::parse_optimizer(v);
            if (!k) bad_value(src, "optim.name", v, "expected adamw or muon");
            c.optim.kind = *k;
          },
          [](const TrainConfig& c) { return std::string(optim::to_string(c.optim.kind)); }},
      SF_KEY("optim.lr", optim.lr),
      SF_KEY("optim.min_lr", optim.min_lr),
      SF_KEY("optim.warmup_steps", optim.warmup_steps),
      SF_KEY("optim.decay_steps", optim.decay_steps),
      SF_KEY("optim.beta1", optim.beta1),
      SF_KEY("optim.beta2", optim.beta2),
      SF_KEY("optim.eps", optim.eps),
      SF_KEY("optim.weight_decay", optim.weight_decay),
      SF_KEY("optim.grad_clip", optim.grad_clip),
      SF_KEY("optim.muon_momentum", optim.muon_momentum),
      SF_KEY("optim.muon_nesterov", optim.muon_nesterov),
      SF_KEY("optim.muon_ns_steps", optim.muon_ns_steps),
      SF_KEY("train.steps", train.steps),
      SF_KEY("train.batch_size", train.batch_size),
      SF_KEY("train.seq_len", train.seq_len),
      SF_KEY("train.grad_accum", train.grad_accum),
      SF_KEY("train.seed", train.seed),
      SF_KEY("train.val_every", train.val_every),
      SF_KEY("train.val_batches", train.val_batches),
      SF_KEY("train.checkpoint_every", train.checkpoint_every),
      SF_KEY("train.keep_checkpoints", train.keep_checkpoints),
      SF_KEY("train.deterministic", train.deterministic),
      SF_KEY("train.overlap_optimizer", train.overlap_optimizer),
      SF_KEY("train.cuda_graph", train.cuda_graph),
      SF_KEY("train.probe_every", train.probe_every),
      SF_KEY("probe.layers", probe.layers),
      SF_KEY("probe.attention_every", probe.attention_every),
      SF_KEY("probe.sigma_every", probe.sigma_every),
      SF_KEY("probe.sequences", probe.sequences),
      SF_KEY("probe.rows", probe.rows),
      SF_KEY("probe.spike_loss_factor", probe.spike_loss_factor),
      SF_KEY("probe.spike_sigma_factor", probe.spike_sigma_factor),
      SF_KEY("probe.spike_window", probe.spike_window),
      SF_KEY("probe.spike_captures", probe.spike_captures),
      SF_KEY("data.dir", data.dir),
      SF_KEY("data.train_split", data.train_split),
      SF_KEY("data.val_split", data.val_split),
      SF_KEY("dist.zero_stage", dist.zero_stage),
      SF_KEY("dist.bucket_mb", dist.bucket_mb),
      SF_KEY("dist.split_embedding", dist.split_embedding),
  };
  return table;
}
#undef SF_KEY

// The attention knobs a layer sets (the rest of attention::option_names() the trainer decides:
// causal always, the device and deterministic from the run).
const std::vector<std::string>& attention_keys() {
  static const std::vector<std::string> k = {"numerics", "policy", "beta", "eps", "tile_q", "tile_k", "normalizer", "round_bits", "delta_source"};
  return k;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Resolves one layer's settings into the model's LayerAttention; `where` prefixes errors. The knobs
// go through the attention library's one text parser (attention::set_option); `standard` numerics
// is the trainer's own: the materialized FP32 attention instead of a flash kernel.
model::LayerAttention resolve(const AttentionSettings& s, const std::string& where) {
  model::LayerAttention la;
  for (const auto& [key, value] : s) {
    if (key == "numerics") {
      if (value == "standard") {
        la.kind = model::AttentionKind::standard;
        continue;
      }
      if (value != "paper" && value != "fused") bad_value(where, "numerics", value, "expected standard, paper or fused");
    }
    attention::set_option(la.options, key, value, where);
  }
  la.options.causal = true;
  return la;
}

// Flattens nested tables into dotted keys with their values as text.
void flatten_json(const nlohmann::json& j, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out,
                  const std::string& source) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    const auto& v = it.value();
    if (v.is_object()) flatten_json(v, key, out, source);
    else if (v.is_string()) out.emplace_back(key, v.get<std::string>());
    else if (v.is_boolean()) out.emplace_back(key, v.get<bool>() ? "true" : "false");
    else if (v.is_number_integer()) out.emplace_back(key, std::to_string(v.get<std::int64_t>()));
    else if (v.is_number_unsigned()) out.emplace_back(key, std::to_string(v.get<std::uint64_t>()));
    else if (v.is_number_float()) out.emplace_back(key, format(v.get<double>()));
    else throw std::invalid_argument(source + ": " + key + ": expected a string, number, boolean or table");
  }
}

void flatten_toml(const toml::table& t, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out,
                  const std::string& source) {
  for (const auto& [k, node] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table()) flatten_toml(*sub, key, out, source);
    else if (const auto* s = node.as_string()) out.emplace_back(key, s->get());
    else if (const auto* b = node.as_boolean()) out.emplace_back(key, b->get() ? "true" : "false");
    else if (const auto* i = node.as_integer()) out.emplace_back(key, std::to_string(i->get()));
    else if (const auto* f = node.as_floating_point()) out.emplace_back(key, format(f->get()));
    else throw std::invalid_argument(source + ": " + key + ": expected a string, number, boolean or table");
  }
}

}  // namespace

AttentionSettings recommended_attention() {
  const auto& settings = attention::recommended_settings();
  return AttentionSettings(settings.begin(), settings.end());
}

std::string default_data_dir() { return std::string(STABLEFLASH_SOURCE_DIR) + "/.deps/corpus/shards"; }

void TrainConfig::set(const std::string& key, const std::string& value, const std::string& source) {
  if (key == "preset") throw std::invalid_argument(source + ": 'preset' is chosen with --preset, before any other setting");
  if (key == "data_dir") return set("data.dir", value, source);  // the short spelling
  for (const auto& k : keys())
    if (k.name == key) return k.set(*this, value, source);
  // attention.default.KEY or attention.layer.N.KEY
  const std::string def = "attention.default.", layer = "attention.layer.";
  std::string sub;
  AttentionSettings* target = nullptr;
  std::string where;
  if (key.starts_with(def)) {
    sub = key.substr(def.size());
    target = &attention_default;
    where = source + ": attention.default";
  } else if (key.starts_with(layer)) {
    const std::string rest = key.substr(layer.size());
    const auto dot = rest.find('.');
    int index = -1;
    if (dot != std::string::npos) {
      try {
        std::size_t used = 0;
        index = std::stoi(rest.substr(0, dot), &used);
        if (used != dot) index = -1;
      } catch (const std::exception&) {
        index = -1;
      }
    }
    if (index < 0) throw std::invalid_argument(source + ": " + key + ": expected attention.layer.N.KEY with a layer index N >= 0");
    sub = rest.substr(dot + 1);
    target = &attention_layer[index];
    where = source + ": attention.layer." + std::to_string(index);
  } else {
    std::vector<std::string> names;
    for (const auto& k : keys()) names.push_back(k.name);
    throw std::invalid_argument(source + ": unknown key '" + key + "'; valid keys: " + join(names) +
                                ", attention.default.KEY, attention.layer.N.KEY (KEY: " + join(attention_keys()) + ")");
  }
  if (std::find(attention_keys().begin(), attention_keys().end(), sub) == attention_keys().end())
    throw std::invalid_argument(where + ": unknown attention key '" + sub + "'; valid: " + join(attention_keys()));
  AttentionSettings trial = *target;
  trial[sub] = value;
  resolve(trial, where);  // reject a bad value now, naming where it came from
  *target = std::move(trial);
}

std::vector<std::pair<std::string, std::string>> TrainConfig::entries() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& k : keys()) out.emplace_back(k.name, k.get(*this));
  for (const auto& [k, v] : attention_default) out.emplace_back("attention.default." + k, v);
  for (const auto& [l, s] : attention_layer)
    for (const auto& [k, v] : s) out.emplace_back("attention.layer." + std::to_string(l) + "." + k, v);
  return out;
}

void TrainConfig::validate() const {
  model.validate();
  optim.validate();
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(what);
  };
  need(train.steps >= 1, "train.steps must be >= 1");
  need(train.batch_size >= 1, "train.batch_size must be >= 1");
  need(train.seq_len >= 1 && train.seq_len <= model.block_size,
       "train.seq_len must be in [1, model.block_size = " + std::to_string(model.block_size) + "] (got " + std::to_string(train.seq_len) + ")");
  need(train.grad_accum >= 1, "train.grad_accum must be >= 1");
  need(train.val_every >= 0, "train.val_every must be >= 0 (0 disables validation)");
  need(train.val_batches >= 1, "train.val_batches must be >= 1");
  need(train.checkpoint_every >= 0, "train.checkpoint_every must be >= 0 (0: only at the end)");
  need(train.keep_checkpoints >= 1, "train.keep_checkpoints must be >= 1");
  need(train.probe_every >= 0, "train.probe_every must be >= 0 (0: no probes)");
  for (int l : probe.layers)
    need(l >= 0 && l < model.n_layer, "probe.layers: layer " + std::to_string(l) + " does not exist (the model has " +
                                          std::to_string(model.n_layer) + " layers, 0-" + std::to_string(model.n_layer - 1) + ")");
  need(probe.sigma_every >= 0, "probe.sigma_every must be >= 0 (0: never)");
  need(probe.attention_every >= 0, "probe.attention_every must be >= 0 (0: never)");
  need(probe.sequences >= 1 && probe.sequences <= train.batch_size,
       "probe.sequences must be in [1, train.batch_size = " + std::to_string(train.batch_size) + "]");
  need(probe.rows >= 2, "probe.rows must be >= 2 (the similarity compares pairs of rows)");
  need(probe.spike_loss_factor == 0 || probe.spike_loss_factor > 1, "probe.spike_loss_factor must be > 1 (0: off)");
  need(probe.spike_sigma_factor == 0 || probe.spike_sigma_factor > 1, "probe.spike_sigma_factor must be > 1 (0: off)");
  need(probe.spike_window >= 3, "probe.spike_window must be >= 3");
  need(probe.spike_captures >= 0, "probe.spike_captures must be >= 0");
  need(!data.dir.empty(), "data.dir must name the folder of token shards");
  need(dist.zero_stage == 0 || dist.zero_stage == 1, "dist.zero_stage must be 0 (all-reduce) or 1 (ZeRO-1) (got " +
                                                         std::to_string(dist.zero_stage) + ")");
  need(std::isfinite(dist.bucket_mb) && dist.bucket_mb >= 0.001 && dist.bucket_mb <= 4096,
       "dist.bucket_mb must be in [0.001, 4096] (got " + std::to_string(dist.bucket_mb) + ")");
  for (const auto& [l, s] : attention_layer)
    need(l < model.n_layer, "attention.layer." + std::to_string(l) + ": the model has " + std::to_string(model.n_layer) +
                                " layers (indices 0-" + std::to_string(model.n_layer - 1) + ")");
  const auto layers = layer_attention();
  for (int l = 0; l < model.n_layer; ++l) {
    if (layers[l].kind != model::AttentionKind::flash) continue;
    attention::AttentionShape shape{train.batch_size, model.n_head, train.seq_len, train.seq_len, model.head_dim()};
    try {
      layers[l].options.validate(shape);
    } catch (const std::exception& e) {
      throw std::invalid_argument("attention.layer." + std::to_string(l) + " (from attention.default and overrides): " + e.what());
    }
  }
}

std::vector<model::LayerAttention> TrainConfig::layer_attention() const {
  std::vector<model::LayerAttention> out;
  for (int l = 0; l < model.n_layer; ++l) {
    AttentionSettings s = attention_default;
    if (auto it = attention_layer.find(l); it != attention_layer.end())
      for (const auto& [k, v] : it->second) s[k] = v;
    out.push_back(resolve(s, "attention.layer." + std::to_string(l)));
  }
  return out;
}

std::vector<int> TrainConfig::probe_layers() const {
  if (!probe.layers.empty()) return probe.layers;
  std::vector<int> all(std::size_t(model.n_layer));
  for (int l = 0; l < model.n_layer; ++l) all[std::size_t(l)] = l;
  return all;
}

std::vector<std::string> preset_names() { return {"tiny", "gpt2-124m", "gpt2-350m"}; }

TrainConfig preset(const std::string& name) {
  TrainConfig c;
  c.preset = name;
  c.data.dir = default_data_dir();
  // The paper's optimizer (docs/paper.md): AdamW (0.9, 0.95), no weight decay, clip 1.0.
  c.optim.kind = optim::OptimizerKind::adamw;
  c.optim.beta1 = 0.9, c.optim.beta2 = 0.95, c.optim.weight_decay = 0.0, c.optim.grad_clip = 1.0;
  if (name == "tiny") {
    // Learns visibly on 2 CPU cores in a few minutes (docs/training.md has the measured numbers).
    // Two heads of 64: a head dim the CUDA attention kernels have (64 and 128), so the same
    // preset trains on a GPU.
    c.model.n_layer = 4, c.model.n_head = 2, c.model.n_embd = 128, c.model.block_size = 128;
    c.optim.lr = 1e-3, c.optim.min_lr = 1e-4, c.optim.warmup_steps = 20, c.optim.decay_steps = 300;
    c.train.steps = 300, c.train.batch_size = 8, c.train.seq_len = 128, c.train.grad_accum = 1;
    c.train.val_every = 50, c.train.val_batches = 4, c.train.checkpoint_every = 100;
  } else if (name == "gpt2-124m" || name == "gpt2-350m") {
    // GPT-2 small as the paper trains it: 1e-3 peak, 2000 warm-up steps, cosine to 1e-5 over
    // 600k steps, 524,288 tokens per step (16 x 1024 x 32 accumulation on one device).
    c.model.n_layer = 12, c.model.n_head = 12, c.model.n_embd = 768, c.model.block_size = 1024;
    if (name == "gpt2-350m") c.model.n_layer = 24, c.model.n_head = 16, c.model.n_embd = 1024;
    c.optim.lr = 1e-3, c.optim.min_lr = 1e-5, c.optim.warmup_steps = 2000, c.optim.decay_steps = 600000;
    c.train.steps = name == "gpt2-350m" ? 100000 : 600000;  // the paper's horizons for S and M
    c.train.batch_size = 16, c.train.seq_len = 1024, c.train.grad_accum = 32;
    c.train.val_every = 1000, c.train.val_batches = 20, c.train.checkpoint_every = 1000, c.train.keep_checkpoints = 3;
  } else {
    throw std::invalid_argument("unknown preset '" + name + "'; valid presets: " + join(preset_names()));
  }
  return c;
}

void apply_config_file(TrainConfig& config, const std::string& path) {
  std::vector<std::pair<std::string, std::string>> entries;
  if (!std::filesystem::exists(path)) throw std::invalid_argument(path + ": config file not found");
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".toml") {
    try {
      flatten_toml(toml::parse_file(path), "", entries, path);
    } catch (const toml::parse_error& e) {
      std::ostringstream msg;
      msg << path << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
      throw std::invalid_argument(msg.str());
    }
  } else if (ext == ".json") {
    std::ifstream in(path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(path + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) throw std::invalid_argument(path + ": expected a JSON object of settings");
    flatten_json(j, "", entries, path);
  } else {
    throw std::invalid_argument(path + ": config files are .toml or .json");
  }
  for (const auto& [k, v] : entries) config.set(k, v, path);
}

void apply_assignment(TrainConfig& config, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw std::invalid_argument("--set '" + assignment + "': expected key=value");
  config.set(assignment.substr(0, eq), assignment.substr(eq + 1), "--set");
}

TrainConfig build_config(const ConfigSources& src) {
  TrainConfig config;
  if (!src.resume_run_dir.empty()) {
    if (!src.preset.empty())
      throw std::invalid_argument("--resume continues with the run's own config; drop --preset (use --set to change keys)");
    const std::string path = src.resume_run_dir + "/config.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path + " does not exist: is " + src.resume_run_dir + " a stableflash run directory?");
    std::ostringstream text;
    text << in.rdbuf();
    config = from_json(text.str(), path);
  } else {
    config = preset(src.preset.empty() ? "tiny" : src.preset);
  }
  if (!src.config_file.empty()) apply_config_file(config, src.config_file);
  for (const auto& s : src.sets) apply_assignment(config, s);
  if (src.steps > 0) config.train.steps = src.steps;
  config.validate();
  return config;
}

std::string to_json(const TrainConfig& config) {
  nlohmann::ordered_json j;
  j["preset"] = config.preset;
  for (const auto& [key, value] : config.entries()) {
    nlohmann::ordered_json* node = &j;
    std::size_t start = 0, dot;
    while ((dot = key.find('.', start)) != std::string::npos) {
      node = &(*node)[key.substr(start, dot - start)];
      start = dot + 1;
    }
    (*node)[key.substr(start)] = value;  // values as text: exact, and what --set takes
  }
  return j.dump(2) + "\n";
}

TrainConfig from_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("preset") || !j["preset"].is_string()) throw std::invalid_argument(source + ": not a stableflash train config");
  TrainConfig c = preset(j["preset"].get<std::string>());
  c.attention_default.clear();  // the file lists the full default settings
  std::vector<std::pair<std::string, std::string>> entries;
  j.erase("preset");
  flatten_json(j, "", entries, source);
  for (const auto& [k, v] : entries) c.set(k, v, source);
  return c;
}

std::vector<std::string> resume_mismatches(const TrainConfig& ckpt, const TrainConfig& run) {
  // Keys that may change on resume: how far to go, how often to report and save, where data lives,
  // whether the GPU reduces in a fixed order, whether its optimizer overlaps the forward and whether
  // it replays CUDA graphs (same bits), and how the ranks share the gradients and optimizer state
  // (same math, other summation order).
  static const std::vector<std::string> free_keys = {"train.steps", "train.val_every", "train.val_batches", "train.checkpoint_every",
                                                     "train.keep_checkpoints", "train.deterministic", "train.overlap_optimizer",
                                                     "train.cuda_graph", "train.probe_every", "data.dir", "dist.zero_stage",
                                                     "dist.bucket_mb", "dist.split_embedding"};
  std::map<std::string, std::string> a, b;
  for (const auto& [k, v] : ckpt.entries()) a[k] = v;
  for (const auto& [k, v] : run.entries()) b[k] = v;
  std::vector<std::string> out;
  // The probes only read the run (train/probes.hpp): every probe.* key may change too.
  auto fixed = [&](const std::string& k) { return !k.starts_with("probe.") && std::find(free_keys.begin(), free_keys.end(), k) == free_keys.end(); };
  for (const auto& [k, v] : a)
    if (fixed(k) && (!b.count(k) || b[k] != v)) out.push_back(k + ": checkpoint has " + v + ", this run has " + (b.count(k) ? b[k] : "(unset)"));
  for (const auto& [k, v] : b)
    if (fixed(k) && !a.count(k)) out.push_back(k + ": checkpoint has (unset), this run has " + v);
  return out;
}

}  // namespace stableflash::train
