// ZeRO-1 on one GPU: CudaOptimizer sharded over W emulated ranks in one process against the
// unsharded optimizer, bit for bit. The ranks' optimizers see the same summed gradients (what the
// reduce-scatter leaves them); the all-gather is emulated by copying each rank's owned pieces.
// AdamW is element-wise and Muon runs whole matrices (replicated buckets), so every bit must agree
// once the clipping factor is the same; the norm itself only differs in the FP64 summation order.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/gpt2.hpp"
#include "stableflash/optim/cuda_optimizer.hpp"
#include "stableflash/optim/sharding.hpp"
#include "require_gpu.hpp"

namespace stableflash::optim {
namespace {

using model::ParamRole;
using model::ParamTensor;
using model::cuda::Blas;
using model::cuda::check_cuda;
using model::cuda::DeviceArray;

// A tiny GPT-2 with biases plus an odd-sized AdamW matrix and an odd tall Muon matrix, so buckets,
// pieces and the replicated tail meet tensor edges at odd places.
std::vector<ParamTensor> test_layout() {
  model::Gpt2Config c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 64, c.padded_vocab_size = 64, c.bias = true;
  auto t = model::parameter_layout(c);
  auto append = [&](std::string name, std::vector<std::int64_t> shape, ParamRole role) {
    const std::int64_t offset = t.back().offset + t.back().size;
    t.push_back({std::move(name), shape, offset, shape[0] * (shape.size() > 1 ? shape[1] : 1), role});
  };
  append("test.odd_matrix", {257, 31}, ParamRole::embedding);
  append("test.odd_tall", {97, 33}, ParamRole::hidden_matrix);
  append("test.odd_vector", {7}, ParamRole::vector);
  return t;
}

std::vector<float> normal_floats(std::int64_t n, std::uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<float> out(std::size_t(n), 0.0f);
  for (auto& x : out) x = float(dist(rng));
  return out;
}

template <class T>
std::vector<T> download(const DeviceArray<T>& a) {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (test)");
  std::vector<T> out(a.size());
  check_cuda(cudaMemcpy(out.data(), a.get(), a.size() * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy (test)");
  return out;
}
template <class T>
void upload(DeviceArray<T>& a, const std::vector<T>& v) {
  ASSERT_EQ(a.size(), v.size());
  check_cuda(cudaMemcpy(a.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy (test)");
}
std::uint16_t bits(__nv_bfloat16 x) {
  std::uint16_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// One emulated rank (or the unsharded reference): its optimizer and its copy of the weights.
struct Rank {
  Rank(const OptimizerConfig& cfg, const std::vector<ParamTensor>& t, Blas& blas, const ShardPlan* plan, int rank, std::int64_t n)
      : optimizer(cfg, t, blas, plan, rank), params(std::size_t(n)), grads(std::size_t(n)), params16(std::size_t(n)) {}
  CudaOptimizer optimizer;
  DeviceArray<float> params, grads;
  DeviceArray<__nv_bfloat16> params16;
};

struct Case {
  OptimizerKind kind;
  int world;
  std::int64_t bucket;
};

class ShardedOptimizerGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedOptimizerGpu, MatchesUnshardedBitwiseAndStateGathersBack) {
  SF_REQUIRE_GPU();
  const Case c = GetParam();
  const auto tensors = test_layout();
  const std::int64_t n = tensors.back().offset + tensors.back().size;
  OptimizerConfig cfg;
  cfg.kind = c.kind;
  cfg.weight_decay = 0.1;
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  {
    Blas blas(stream);
    const ShardPlan plan = ShardPlan::make(tensors, c.kind, c.world, c.bucket);
    ASSERT_GT(plan.buckets().size(), 2u) << "the case should cut several buckets";
    Rank ref(cfg, tensors, blas, nullptr, 0, n);
    std::vector<std::unique_ptr<Rank>> ranks;
    for (int r = 0; r < c.world; ++r) ranks.push_back(std::make_unique<Rank>(cfg, tensors, blas, &plan, r, n));
    EXPECT_EQ(ranks[0]->optimizer.state_count(), plan.owned_count());
    auto set_all_params = [&](const std::vector<float>& p) {
      upload(ref.params, p);
      to_bf16(ref.params16.get(), ref.params.get(), n, stream);
      for (auto& r : ranks) {
        upload(r->params, p);
        to_bf16(r->params16.get(), r->params.get(), n, stream);
      }
    };
    set_all_params(normal_floats(n, 7, 0.1));

    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const auto g = normal_floats(n, 100 + step, 1.0);
      upload(ref.grads, g);
      for (auto& r : ranks) upload(r->grads, g);
      // The norm from the ranks' parts, added in rank order, is the unsharded one up to FP64 order.
      const double ref_sum = ref.optimizer.grad_sum_of_squares(ref.grads.get());
      double sum = 0;
      for (auto& r : ranks) sum += r->optimizer.grad_sum_of_squares(r->grads.get());
      EXPECT_NEAR(sum, ref_sum, 1e-12 * ref_sum);
      const double max_norm = step == 1 ? 1e9 : 0.5 * std::sqrt(sum);  // clipped on steps 0 and 2
      ref.optimizer.clip_with_sum_of_squares(sum, max_norm);
      for (auto& r : ranks) r->optimizer.clip_with_sum_of_squares(sum, max_norm);

      const auto before = download(ranks[0]->params);
      ref.optimizer.step(ref.params.get(), ref.params16.get(), ref.grads.get(), 0.01);
      for (int r = 0; r < c.world; ++r) {
        std::vector<int> called;
        ranks[std::size_t(r)]->optimizer.step(ranks[std::size_t(r)]->params.get(), ranks[std::size_t(r)]->params16.get(),
                                               ranks[std::size_t(r)]->grads.get(), 0.01, [&](int b) { called.push_back(b); });
        ASSERT_EQ(called.size(), plan.buckets().size()) << "rank " << r;
        for (std::size_t b = 0; b < called.size(); ++b) EXPECT_EQ(called[b], int(b)) << "rank " << r << ": buckets in ascending order";
      }
      // Each rank wrote its owned ranges and nothing else.
      const auto want = download(ref.params);
      const auto want16 = download(ref.params16);
      std::vector<float> gathered(static_cast<std::size_t>(n));
      for (int r = 0; r < c.world; ++r) {
        const auto p = download(ranks[std::size_t(r)]->params);
        const auto p16 = download(ranks[std::size_t(r)]->params16);
        std::vector<bool> owned(std::size_t(n), false);
        for (const FlatRange& o : plan.owned(r))
          for (std::int64_t i = o.begin; i < o.end; ++i) owned[std::size_t(i)] = true;
        std::int64_t wrong = 0, first = -1;
        for (std::int64_t i = 0; i < n; ++i) {
          const std::size_t k = std::size_t(i);
          const bool ok = owned[k] ? std::memcmp(&p[k], &want[k], sizeof(float)) == 0 && bits(p16[k]) == bits(want16[k])
                                   : std::memcmp(&p[k], &before[k], sizeof(float)) == 0;
          if (!ok && wrong++ == 0) first = i;
          if (owned[k]) gathered[k] = p[k];
        }
        EXPECT_EQ(wrong, 0) << "rank " << r << ": first wrong element " << first << (first >= 0 && owned[std::size_t(first)] ? " (owned)" : " (not owned)");
      }
      EXPECT_EQ(std::memcmp(gathered.data(), want.data(), want.size() * sizeof(float)), 0);
      set_all_params(gathered);  // the all-gather and the BF16 cast of the received pieces
    }

    // Checkpoint: the shards gathered are the unsharded state, bit for bit.
    std::vector<float> m_ref(static_cast<std::size_t>(n)), v_ref(m_ref.size()), m(m_ref.size(), -1.0f), v(m_ref.size(), -1.0f);
    ref.optimizer.download_state(m_ref, v_ref);
    for (int r = 0; r < c.world; ++r) {
      std::vector<float> ms(std::size_t(plan.owned_count())), vs(ms.size());
      ranks[std::size_t(r)]->optimizer.download_state(ms, vs);
      put_shard(plan, r, ms, m);
      put_shard(plan, r, vs, v);
    }
    EXPECT_EQ(std::memcmp(m.data(), m_ref.data(), m.size() * sizeof(float)), 0) << "first moment";
    EXPECT_EQ(std::memcmp(v.data(), v_ref.data(), v.size() * sizeof(float)), 0) << "second moment";

    // Resume on this world size from the unsharded state (a checkpoint of one GPU): the next step
    // continues bit for bit.
    const auto p_now = download(ref.params);
    const auto g = normal_floats(n, 999, 1.0);
    upload(ref.grads, g);
    ref.optimizer.step(ref.params.get(), ref.params16.get(), ref.grads.get(), 0.005);
    const auto want = download(ref.params);
    for (int r = 0; r < c.world; ++r) {
      Rank fresh(cfg, tensors, blas, &plan, r, n);
      std::vector<float> ms(std::size_t(plan.owned_count())), vs(ms.size());
      take_shard(plan, r, m_ref, ms);
      take_shard(plan, r, v_ref, vs);
      fresh.optimizer.load_state(ref.optimizer.steps_taken() - 1, ms, vs);
      upload(fresh.params, p_now);
      upload(fresh.grads, g);
      fresh.optimizer.step(fresh.params.get(), fresh.params16.get(), fresh.grads.get(), 0.005);
      const auto p = download(fresh.params);
      for (const FlatRange& o : plan.owned(r))
        EXPECT_EQ(std::memcmp(p.data() + o.begin, want.data() + o.begin, std::size_t(o.size()) * sizeof(float)), 0)
            << "rank " << r << " after resuming, range [" << o.begin << ", " << o.end << ")";
    }
  }
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

INSTANTIATE_TEST_SUITE_P(Plans, ShardedOptimizerGpu,
                         ::testing::Values(Case{OptimizerKind::adamw, 2, 1000}, Case{OptimizerKind::adamw, 3, 777},
                                           Case{OptimizerKind::muon, 2, 1000}, Case{OptimizerKind::muon, 4, 500},
                                           Case{OptimizerKind::adamw, 1, 1000}),
                         [](const auto& test) {
                           return std::string(to_string(test.param.kind)) + "_world" + std::to_string(test.param.world) + "_bucket" +
                                  std::to_string(test.param.bucket);
                         });

TEST(ShardedOptimizerGpuErrors, APlanThatSplitsAMuonMatrixIsRefusedNamingTheRank) {
  SF_REQUIRE_GPU();
  const auto tensors = test_layout();
  OptimizerConfig cfg;
  cfg.kind = OptimizerKind::muon;
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  {
    Blas blas(stream);
    const ShardPlan adamw_plan = ShardPlan::make(tensors, OptimizerKind::adamw, 2, 1000);  // shards the matrices too
    try {
      CudaOptimizer o(cfg, tensors, blas, &adamw_plan, 1);
      ADD_FAILURE() << "no error";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
  }
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

}  // namespace
}  // namespace stableflash::optim
