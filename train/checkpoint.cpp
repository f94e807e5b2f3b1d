// Checkpoint writing, verification and loading (see checkpoint.hpp).
#include "stableflash/train/checkpoint.hpp"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/data/safetensors.hpp"

namespace stableflash::train {
namespace fs = std::filesystem;
using data::DType;
using data::SafetensorsFile;
using data::Tensor;

namespace {

const char* const kFiles[] = {"model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"};

std::string step_dir_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const std::string& path, const std::string& text) {
  data::write_file_atomically(path, [&](std::ostream& o) { o << text; });
}

std::string hf_config(const model::Gpt2Config& c) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = c.padded_vocab_size;  // wte has the padded rows
  j["n_positions"] = c.block_size;
  j["n_ctx"] = c.block_size;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = c.layernorm_eps;
  j["initializer_range"] = c.init_std;
  j["tie_word_embeddings"] = true;
  j["bos_token_id"] = 50256;
  j["eos_token_id"] = 50256;
  return j.dump(2) + "\n";
}

// The Hugging Face tensors a bias-free model lacks (GPT-2 always has them): zeros of these shapes.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> absent_biases(const model::Gpt2Config& c) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  if (c.bias) return out;
  const std::int64_t C = c.n_embd;
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    out.push_back({p + "ln_1.bias", {C}});
    out.push_back({p + "attn.c_attn.bias", {3 * C}});
    out.push_back({p + "attn.c_proj.bias", {C}});
    out.push_back({p + "ln_2.bias", {C}});
    out.push_back({p + "mlp.c_fc.bias", {4 * C}});
    out.push_back({p + "mlp.c_proj.bias", {C}});
  }
  out.push_back({"transformer.ln_f.bias", {C}});
  return out;
}

// The files of a checkpoint, written into `tmp` (see checkpoint.hpp).
void write_checkpoint_files(const fs::path& tmp, const TrainConfig& config, const TrainingSnapshot& snap, const TrainerState& state) {
  SafetensorsFile weights;
  weights.metadata["format"] = "pt";  // transformers checks this
  const auto params = snap.params;
  for (const auto& t : *snap.tensors)
    weights.tensors[t.name] = Tensor::from<float>(DType::f32, t.shape, params.subspan(std::size_t(t.offset), std::size_t(t.size)));
  for (const auto& [bias_name, shape] : absent_biases(*snap.model_config)) {
    const std::vector<float> zeros(static_cast<std::size_t>(shape[0]), 0.0f);
    weights.tensors[bias_name] = Tensor::from<float>(DType::f32, shape, std::span<const float>(zeros));
  }
  weights.write((tmp / "model.safetensors").string());
  write_text((tmp / "config.json").string(), hf_config(*snap.model_config));

  SafetensorsFile opt;
  const std::int64_t n = std::int64_t(params.size());
  opt.tensors["first_moment"] = Tensor::from<float>(DType::f32, {n}, snap.first_moment);
  opt.tensors["second_moment"] = Tensor::from<float>(DType::f32, {n}, snap.second_moment);
  opt.metadata["optimizer"] = std::string(optim::to_string(snap.optimizer));
  opt.metadata["steps_taken"] = std::to_string(snap.steps_taken);
  opt.write((tmp / "optimizer.safetensors").string());

  nlohmann::ordered_json st;
  st["step"] = state.step;
  st["seed"] = config.train.seed;
  st["data_position"] = {{"next_step", state.step},
                         {"sampler", state.replay_log.empty() ? "seeded: windows of step s drawn from SplitMix64(seed, s)" : "replay"},
                         {"replay_log", state.replay_log}};
  st["last_loss"] = state.last_loss;
  st["config"] = nlohmann::json::parse(to_json(config));
  write_text((tmp / "trainer_state.json").string(), st.dump(2) + "\n");

  nlohmann::ordered_json sums;
  for (const char* f : kFiles) sums[f] = {{"bytes", fs::file_size(tmp / f)}, {"fnv1a64", file_checksum((tmp / f).string())}};
  write_text((tmp / "checksums.json").string(), sums.dump(2) + "\n");

}

}  // namespace

std::string file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::uint64_t h = 0xcbf29ce484222325ull;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ std::uint8_t(buf[i])) * 0x100000001b3ull;
  }
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::string> out;
  const fs::path dir = fs::path(run_dir) / "checkpoints";
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.starts_with("step_") && name.find('.') == std::string::npos) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TrainingSnapshot snapshot_of(const model::Gpt2<float>& model, const optim::Optimizer<float>& optimizer) {
  TrainingSnapshot snap;
  snap.model_config = &model.config();
  snap.tensors = &model.tensors();
  snap.params = model.params();
  snap.optimizer = optimizer.config().kind;
  snap.steps_taken = optimizer.steps_taken();
  snap.first_moment = optimizer.first_moment();
  snap.second_moment = optimizer.second_moment();
  return snap;
}


std::string save_checkpoint(const std::string& run_dir, const TrainConfig& config, const TrainingSnapshot& snap,
                            const TrainerState& state) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const std::string name = step_dir_name(state.step);
  const fs::path final_dir = root / name;
  const fs::path tmp = root / (name + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    write_checkpoint_files(tmp, config, snap, state);
  } catch (...) {
    // A full disk: give the space back; the previous checkpoint and `latest` are untouched.
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }

  // Swap into place. An existing folder of the same step (a resumed run passing it again) is
  // moved aside first and removed only once the new one is in place.
  const fs::path aside = root / (name + ".old-" + std::to_string(::getpid()));
  if (fs::exists(final_dir)) fs::rename(final_dir, aside);
  fs::rename(tmp, final_dir);
  write_text((root / "latest").string(), name + "\n");
  fs::remove_all(aside);

  auto all = list_checkpoints(run_dir);
  const std::size_t keep = std::size_t(config.train.keep_checkpoints);
  for (std::size_t i = 0; i + keep < all.size(); ++i)
    if (fs::path(all[i]).filename() != name) fs::remove_all(all[i]);
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& run_dir) {
  const fs::path pointer = fs::path(run_dir) / "checkpoints" / "latest";
  if (!fs::exists(pointer)) throw std::runtime_error(run_dir + ": no checkpoint to resume from (" + pointer.string() + " does not exist)");
  std::string name = read_text(pointer.string());
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
  // Only a folder of this run: a pointer elsewhere (../../x, /abs/path) would load and later prune
  // files that are not the run's.
  const bool digits = name.size() >= 13 && name.find_first_not_of("0123456789", 5) == std::string::npos;
  if (!name.starts_with("step_") || !digits)
    throw std::runtime_error(pointer.string() + " names '" + name.substr(0, 200) +
                             "'; expected the name of a checkpoint folder in " + (fs::path(run_dir) / "checkpoints").string() +
                             " (step_NNNNNNNN, e.g. step_00000300)");
  return (fs::path(run_dir) / "checkpoints" / name).string();
}

std::vector<std::string> clean_up_interrupted_writes(const std::string& run_dir) {
  std::vector<std::string> removed;
  // NAME.tmp-PID / NAME.old-PID / .NAME.tmp.PID: a known marker followed by digits only.
  auto pid_suffix = [](const std::string& name, const std::string& marker) -> std::string {
    const auto at = name.rfind(marker);
    if (at == std::string::npos || at == 0 || at + marker.size() == name.size()) return {};
    if (name.find_first_not_of("0123456789", at + marker.size()) != std::string::npos) return {};
    return name.substr(0, at);
  };
  for (const fs::path& dir : {fs::path(run_dir), fs::path(run_dir) / "checkpoints"}) {
    if (!fs::is_directory(dir)) continue;
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(dir)) entries.push_back(e.path());
    std::sort(entries.begin(), entries.end());
    for (const auto& path : entries) {
      const std::string name = path.filename().string();
      std::string aside_of = pid_suffix(name, ".old-");
      if (!aside_of.starts_with("step_")) aside_of.clear();  // not one of ours
      if (!aside_of.empty() && !fs::exists(dir / aside_of)) {
        fs::rename(path, dir / aside_of);  // killed between moving it aside and putting the new one in place
        continue;
      }
      const bool temp = !aside_of.empty() || pid_suffix(name, ".tmp-").starts_with("step_") ||
                        (name.starts_with(".") && !pid_suffix(name, ".tmp.").empty());
      if (!temp) continue;
      fs::remove_all(path);
      removed.push_back(name);
    }
  }
  return removed;
}

Checkpoint open_checkpoint(const std::string& dir) {
  auto damaged = [&](const std::string& what) -> std::runtime_error {
    return std::runtime_error("checkpoint " + dir + " is damaged and was not loaded: " + what);
  };
  if (!fs::is_directory(dir)) throw std::runtime_error("checkpoint " + dir + " does not exist");
  nlohmann::json sums;
  try {
    sums = nlohmann::json::parse(read_text(dir + "/checksums.json"));
  } catch (const std::exception& e) {
    throw damaged(std::string("checksums.json unreadable (") + e.what() + ")");
  }
  for (const char* f : kFiles) {
    const std::string path = dir + "/" + f;
    if (!fs::exists(path)) throw damaged(std::string(f) + " is missing");
    if (!sums.contains(f)) throw damaged(std::string("checksums.json has no entry for ") + f);
    const auto bytes = sums[f].value("bytes", std::uint64_t(0));
    if (fs::file_size(path) != bytes)
      throw damaged(std::string(f) + " has " + std::to_string(fs::file_size(path)) + " bytes, the checksum file says " + std::to_string(bytes));
    const std::string want = sums[f].value("fnv1a64", std::string()), got = file_checksum(path);
    if (got != want) throw damaged(std::string(f) + " checksum " + got + " differs from the recorded " + want);
  }
  Checkpoint c;
  c.dir = dir;
  const auto st = nlohmann::json::parse(read_text(dir + "/trainer_state.json"));
  c.config = from_json(st.at("config").dump(), dir + "/trainer_state.json");
  c.state.step = st.at("step").get<std::int64_t>();
  c.state.replay_log = st.at("data_position").value("replay_log", std::string());
  c.state.last_loss = st.value("last_loss", 0.0);
  return c;
}

void load_weights(const Checkpoint& ckpt, model::Gpt2<float>& model) { load_weights(ckpt, model.tensors(), model.params()); }

void load_weights(const Checkpoint& ckpt, const std::vector<model::ParamTensor>& tensors, std::span<float> params) {
  const std::string path = ckpt.dir + "/model.safetensors";
  const SafetensorsFile f = SafetensorsFile::read(path);
  for (const auto& t : tensors) {
    const Tensor* x = f.find(t.name);
    if (!x) throw std::runtime_error(path + ": missing tensor " + t.name + " (a checkpoint of another model config?)");
    if (x->dtype != DType::f32 || x->shape != t.shape)
      throw std::runtime_error(path + ": tensor " + t.name + " has another dtype or shape than this model's (a checkpoint of another model config?)");
    if (t.offset + t.size > std::int64_t(params.size())) throw std::invalid_argument("load_weights: buffer smaller than the layout");
    const auto v = x->as<float>();
    std::copy(v.begin(), v.end(), params.begin() + t.offset);
  }
}

OptimizerState read_optimizer_state(const Checkpoint& ckpt, std::int64_t parameter_count) {
  const std::string path = ckpt.dir + "/optimizer.safetensors";
  const SafetensorsFile f = SafetensorsFile::read(path);
  const Tensor* m = f.find("first_moment");
  const Tensor* v = f.find("second_moment");
  if (!m || !v || m->dtype != DType::f32 || v->dtype != DType::f32) throw std::runtime_error(path + ": missing F32 first_moment/second_moment");
  const auto it = f.metadata.find("steps_taken");
  if (it == f.metadata.end()) throw std::runtime_error(path + ": metadata lacks steps_taken");
  OptimizerState st;
  try {
    st.steps_taken = std::stoll(it->second);
  } catch (const std::exception&) {
    throw std::runtime_error(path + ": steps_taken '" + it->second + "' is not an integer");
  }
  const auto first = m->as<float>(), second = v->as<float>();
  if (std::int64_t(first.size()) != parameter_count || std::int64_t(second.size()) != parameter_count)
    throw std::runtime_error(path + ": optimizer state holds " + std::to_string(first.size()) + " values, the model has " +
                             std::to_string(parameter_count) + " parameters");
  if (st.steps_taken < 0) throw std::runtime_error(path + ": negative step count");
  st.first_moment.assign(first.begin(), first.end());
  st.second_moment.assign(second.begin(), second.end());
  return st;
}

void load_optimizer(const Checkpoint& ckpt, optim::Optimizer<float>& optimizer) {
  const OptimizerState st = read_optimizer_state(ckpt, std::int64_t(optimizer.first_moment().size()));
  optimizer.load_state(st.steps_taken, st.first_moment, st.second_moment);
}

}  // namespace stableflash::train
