// A build without CUDA: the trainer runs on the CPU only.
#include <stdexcept>

#include "engine.hpp"

namespace stableflash::train {

std::unique_ptr<TrainingEngine> make_cuda_engine(const TrainConfig&, int, const World&) {
  throw std::runtime_error("--device cuda: this build of stableflash has no CUDA support (rebuild where nvcc exists, or use --device cpu)");
}

bool cuda_training_available() { return false; }

std::int64_t cuda_memory_in_use() { return -1; }

}  // namespace stableflash::train
