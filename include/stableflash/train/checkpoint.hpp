// Checkpoints: RUN/checkpoints/step_NNNNNNNN/ holding
//   model.safetensors     weights with Hugging Face GPT-2 names (Conv1D [in, out] layout; zero
//                         biases written when the model has none, so GPT2LMHeadModel loads it as is)
//   config.json           the Hugging Face GPT2Config (vocab_size = the padded vocabulary)
//   optimizer.safetensors first and second moments, laid out like the flat parameters
//   trainer_state.json    step, seed, data position, replay log, the full stableflash config
//   checksums.json        size and FNV-1a 64 of each file above
// A checkpoint is built in a temporary folder and renamed into place, then RUN/checkpoints/latest
// is replaced atomically: a crash leaves the previous checkpoint intact and current.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/optimizer.hpp"
#include "stableflash/train/config.hpp"

namespace stableflash::train {

struct TrainerState {
  std::int64_t step = 0;         // optimizer steps completed; the next step to run
  std::string replay_log;        // the batch log being replayed, empty when sampling by seed
  double last_loss = 0.0;
};

// What a checkpoint holds, as host views: the CPU trainer's own buffers, or host copies of the
// GPU's (the format does not depend on the device, so a run resumes on either).
struct TrainingSnapshot {
  const model::Gpt2Config* model_config = nullptr;
  const std::vector<model::ParamTensor>* tensors = nullptr;
  std::span<const float> params;  // flat, in `tensors` order
  optim::OptimizerKind optimizer = optim::OptimizerKind::adamw;
  std::int64_t steps_taken = 0;
  std::span<const float> first_moment, second_moment;  // laid out like params
};

// Writes a checkpoint for `state.step` and returns its folder; prunes all but the newest
// `config.train.keep_checkpoints`. Throws naming the path on failure (earlier checkpoints untouched).
std::string save_checkpoint(const std::string& run_dir, const TrainConfig& config, const TrainingSnapshot& snapshot,
                            const TrainerState& state);
// The CPU model's and optimizer's own buffers as a snapshot.
TrainingSnapshot snapshot_of(const model::Gpt2<float>& model, const optim::Optimizer<float>& optimizer);

struct Checkpoint {
  std::string dir;
  TrainConfig config;
  TrainerState state;
};

// The folder named by RUN/checkpoints/latest; throws (naming the run) when there is none, or when
// `latest` names anything but a step_NNNNNNNN folder of this run (a path elsewhere, `..`).
std::string latest_checkpoint(const std::string& run_dir);
// Removes what writes cut short by a kill or a full disk leave behind: step_N.tmp-PID folders and
// `.NAME.tmp.PID` files in RUN/checkpoints and RUN. A step_N.old-PID folder is the previous copy of
// step_N, moved aside for a rewrite: it is put back when step_N is missing, else removed. Call it
// holding the run's lock (RunLock): no other writer can be using them. Returns the names removed.
std::vector<std::string> clean_up_interrupted_writes(const std::string& run_dir);
// Every checkpoint folder of a run, oldest first.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// Verifies the checksums and reads the config and trainer state. Throws naming the folder and
// the damaged or missing file; nothing on disk is changed.
Checkpoint open_checkpoint(const std::string& dir);
// Loads weights (and optimizer state) into objects built from the checkpoint's config.
void load_weights(const Checkpoint& ckpt, model::Gpt2<float>& model);
void load_optimizer(const Checkpoint& ckpt, optim::Optimizer<float>& optimizer);
// The same into flat host buffers laid out as `tensors` (errors name the file and tensor).
void load_weights(const Checkpoint& ckpt, const std::vector<model::ParamTensor>& tensors, std::span<float> params);
struct OptimizerState {
  std::int64_t steps_taken = 0;
  std::vector<float> first_moment, second_moment;
};
OptimizerState read_optimizer_state(const Checkpoint& ckpt, std::int64_t parameter_count);

// FNV-1a 64 of a file's bytes, as 16 hex digits.
std::string file_checksum(const std::string& path);

}  // namespace stableflash::train
