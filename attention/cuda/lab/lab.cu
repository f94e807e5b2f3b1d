// The kernel lab's runners: the production plan, changed where a comparison kernel is asked for,
// executed by the production execute_forward / execute_backward (entry.cu).
#include "lab/lab.hpp"

#include "execute.hpp"
#include "lab/lab_launch.hpp"
#include "launch.hpp"
#include "plan.hpp"

namespace stableflash::attention::cuda::lab {

std::optional<ForwardChoice> parse_forward_choice(std::string_view name) {
  if (name == "production") return ForwardChoice::production;
  if (name == "mma") return ForwardChoice::mma_sync;
  if (name == "wgmma-1wg") return ForwardChoice::one_warpgroup;
  if (name == "wgmma-serial") return ForwardChoice::serial;
  if (name == "wgmma-ws") return ForwardChoice::warp_specialized;
  if (name == "wgmma-ws-rounds") return ForwardChoice::warp_specialized_rounds;
  if (name == "wgmma-ws-tiles") return ForwardChoice::warp_specialized_per_tile;
  if (name == "wgmma-ws-2c") return ForwardChoice::warp_specialized_two;
  if (name == "wgmma-ws-3c") return ForwardChoice::warp_specialized_three;
  if (name == "wgmma-ws-1c") return ForwardChoice::warp_specialized_one;
  return std::nullopt;
}
std::optional<BackwardChoice> parse_backward_choice(std::string_view name) {
  if (name == "production") return BackwardChoice::production;
  if (name == "mma") return BackwardChoice::mma_sync;
  if (name == "wgmma-dqwg") return BackwardChoice::dq_warpgroup;
  if (name == "wgmma-64k") return BackwardChoice::keys64;
  if (name == "wgmma-128k") return BackwardChoice::keys128;
  return std::nullopt;
}
std::string to_string(ForwardChoice c) {
  switch (c) {
    case ForwardChoice::mma_sync: return "mma";
    case ForwardChoice::one_warpgroup: return "wgmma-1wg";
    case ForwardChoice::serial: return "wgmma-serial";
    case ForwardChoice::warp_specialized: return "wgmma-ws";
    case ForwardChoice::warp_specialized_rounds: return "wgmma-ws-rounds";
    case ForwardChoice::warp_specialized_per_tile: return "wgmma-ws-tiles";
    case ForwardChoice::warp_specialized_two: return "wgmma-ws-2c";
    case ForwardChoice::warp_specialized_three: return "wgmma-ws-3c";
    case ForwardChoice::warp_specialized_one: return "wgmma-ws-1c";
    case ForwardChoice::production: break;
  }
  return "production";
}
std::string to_string(BackwardChoice c) {
  switch (c) {
    case BackwardChoice::mma_sync: return "mma";
    case BackwardChoice::dq_warpgroup: return "wgmma-dqwg";
    case BackwardChoice::keys64: return "wgmma-64k";
    case BackwardChoice::keys128: return "wgmma-128k";
    case BackwardChoice::production: break;
  }
  return "production";
}

namespace {

void forward_with(ForwardChoice choice, const ForwardArgs& a, const AttentionOptions& options) {
  const AttentionOptions opt = options.for_shape(a.shape);  // as each production entry point does
  check_supported_args(a, opt);
  ForwardPlan plan = plan_forward(a, opt, multiprocessors());
  if (choice == ForwardChoice::mma_sync) {
    plan.tensor_maps = false;  // cp.async loads and element-wise stores
    execute_forward(a, opt, plan, [&](const ForwardParams& p, cudaStream_t stream) {
      with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_mma_forward<D, kPaper>(p, plan.policy, stream); });
    });
    return;
  }
  if (choice == ForwardChoice::warp_specialized || choice == ForwardChoice::warp_specialized_rounds ||
      choice == ForwardChoice::warp_specialized_per_tile ||
      choice == ForwardChoice::warp_specialized_two || choice == ForwardChoice::warp_specialized_three ||
      choice == ForwardChoice::warp_specialized_one) {
    if (plan.walk == ForwardWalk::pipelined) {
      plan.kernel = ForwardKernel::warp_specialized;
      plan.ws_consumers = ws_consumers_for(a.shape, opt.causal, plan.sms);
      if (plan.head_dim == 64 && choice == ForwardChoice::warp_specialized_two) plan.ws_consumers = 2;
      if (plan.head_dim == 64 && choice == ForwardChoice::warp_specialized_three) plan.ws_consumers = 3;
      if (choice == ForwardChoice::warp_specialized_one) plan.ws_consumers = 1;
      // the last round's items and the lone-block pairs follow the consumer count (a tile's rows)
      plan.ws_tail = ws_tail_for(a.shape, opt.causal, plan.sms, plan.ws_consumers);
      plan.ws_lone_pairs = ws_lone_pairs_for(a.shape, opt.causal, plan.ws_consumers, plan.ws_tail.group > 0);
    }
    if (choice == ForwardChoice::warp_specialized_rounds) plan.schedule = TileSchedule::rounds;
    if (choice == ForwardChoice::warp_specialized_per_tile) plan.schedule = TileSchedule::per_cta;
  } else if (choice != ForwardChoice::production) {
    plan.kernel = ForwardKernel::one_warpgroup;
  }
  if (choice == ForwardChoice::serial && plan.walk == ForwardWalk::pipelined) plan.walk = ForwardWalk::steps;
  execute_forward(a, opt, plan, [&](const ForwardParams& p, cudaStream_t stream) {
    with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_forward<D, kPaper>(p, plan, stream); });
  });
}

void backward_with(BackwardChoice choice, const BackwardArgs& a, const AttentionOptions& options) {
  if (choice == BackwardChoice::production) return cuda::backward(a, options);
  const AttentionOptions opt = options.for_shape(a.shape);  // as each production entry point does
  check_supported_args(a, opt);
  if (!a.dq || !a.dk || !a.dv) throw std::invalid_argument("attention_backward: dq, dk and dv outputs are required");
  if (choice == BackwardChoice::keys64 || choice == BackwardChoice::keys128) {
    BackwardPlan plan = plan_backward(a, opt, /*with_gradients=*/true, multiprocessors());
    if (choice == BackwardChoice::keys64) {
      if (!backward_has_64_key_ctas(a.shape, opt))
        throw std::invalid_argument("kernel lab wgmma-64k backward: head dim 128, not deterministic, more than one 128-key block (production's rule)");
      plan.key_groups = 1, plan.main_ctas = 0;
    } else if (plan.key_groups == 1) {
      plan.key_groups = 2;  // a grid of at most one 64-key CTA an SM: no persistent grid either
    }
    execute_backward(a, opt, plan, [&](const BackwardParams& p, cudaStream_t stream) {
      with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_backward_main<D, kPaper>(p, stream); });
    });
    return;
  }
  // the lab's kernels always add dQ into the workspace (no direct store), whose size also holds the
  // mma.sync kernel's row-major [B, H, Tq, D]
  BackwardPlan plan = plan_backward(a, opt);
  plan.dq_direct = false;
  plan.dq_first_store = false;  // the lab's kernels add every part into a cleared accumulator
  settle_backward_plan(plan, a, opt);
  if (choice == BackwardChoice::dq_warpgroup) {
    if (opt.deterministic) throw std::invalid_argument("kernel lab wgmma-dqwg backward: no deterministic mode (production has it)");
    execute_backward(a, opt, plan, [&](const BackwardParams& p, cudaStream_t stream) {
      with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_dqwg_backward_main<D, kPaper>(p, stream); });
    });
    return;
  }
  execute_backward(a, opt, plan, [&](const BackwardParams& p, cudaStream_t stream) {
    with_kernels(plan.head_dim, plan.paper, [&]<int D, bool kPaper>() { launch_mma_backward_main<D, kPaper>(p, stream); });
  });
}

}  // namespace

Kernels kernels(ForwardChoice forward, BackwardChoice backward) {
  Kernels k;
  k.name = "forward " + to_string(forward) + ", backward " + to_string(backward);
  k.forward = [forward](const ForwardArgs& a, const AttentionOptions& opt) { forward_with(forward, a, opt); };
  k.backward = [backward](const BackwardArgs& a, const AttentionOptions& opt) { backward_with(backward, a, opt); };
  return k;
}

}  // namespace stableflash::attention::cuda::lab
