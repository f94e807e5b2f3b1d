// `kernel_lab --forward-timeline`: where the warp-specialized forward's time goes, step by step. The
// production kernel (forward_ws_kernel.cuh) instantiated with traits that stamp the SM's clock
// (clock64) at every phase of a consumer's step (StepMark: K there, turn taken, products issued, S
// landed, softmax done, P V landed, step over), at the producer's copies (ProducerMark) and at each
// consumer's tile (TileMark), from one thread per warpgroup. The summary gives each phase's cycles
// over every step of every CTA, the cycles a step would take at the tensor cores' peak, and a trace of
// CTA 0's first steps; the production kernel is timed beside the stamped one to show what stamping
// costs. Counters are per SM, so only differences within a CTA mean anything. Standard shift, fused,
// compensated residual, [B, H, T, D] inputs of random BF16 values in [-2, 2).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "execute.hpp"
#include "forward_ws_kernel.cuh"
#include "lab/lab_support.cuh"
#include "lab/lab.hpp"
#include "launch.hpp"
#include "plan.hpp"
#include "stableflash/attention/cuda.hpp"

namespace stableflash::attention::cuda::lab {
namespace {

// What one CTA's record holds: ring positions (its steps over all its tiles) and rounds (its tiles).
constexpr int kMaxPositions = 2048, kMaxRounds = 128;
constexpr int kStepEvents = int(StepMark::count), kProducerEvents = int(ProducerMark::count), kTileEvents = int(TileMark::count);

struct TimelineRecord {
  unsigned long long* steps;     // [cta][consumer][position][StepMark]
  unsigned long long* producer;  // [cta][position][ProducerMark]
  unsigned long long* tiles;     // [cta][consumer][round][TileMark]
};
__device__ TimelineRecord g_record;

// Where a stamp goes in each array, for the kernel that writes it and the host that reads it.
__host__ __device__ inline std::size_t step_index(int consumers, int cta, int consumer, unsigned position, int e) {
  return ((std::size_t(cta) * consumers + consumer) * kMaxPositions + position) * kStepEvents + e;
}
__host__ __device__ inline std::size_t producer_index(int cta, unsigned position, int e) {
  return (std::size_t(cta) * kMaxPositions + position) * kProducerEvents + e;
}
__host__ __device__ inline std::size_t tile_index(int consumers, int cta, int consumer, int round, int e) {
  return ((std::size_t(cta) * consumers + consumer) * kMaxRounds + round) * kTileEvents + e;
}

// The production traits plus the stamps (HasTimeline). Positions and rounds past the capacity are
// not recorded.
template <int D, int C>
struct TimelineWsTraits : WsForwardTraits<D, C> {
  __device__ static void mark_step(int e, unsigned position) {
    if (threadIdx.x % 128 != 0 || position >= unsigned(kMaxPositions)) return;
    g_record.steps[step_index(C, blockIdx.x, threadIdx.x / 128 - 1, position, e)] = clock64();
  }
  __device__ static void mark_producer(int e, unsigned position) {
    if (position >= unsigned(kMaxPositions)) return;
    g_record.producer[producer_index(blockIdx.x, position, e)] = clock64();
  }
  __device__ static void mark_tile(int e, int round) {
    if (threadIdx.x % 128 != 0 || round >= kMaxRounds) return;
    g_record.tiles[tile_index(C, blockIdx.x, threadIdx.x / 128 - 1, round, e)] = clock64();
  }
};

// BF16 values in [-2, 2) from a counter hash.
__global__ void fill_inputs_kernel(std::uint16_t* out, std::int64_t n, std::uint64_t seed) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const std::uint64_t z = counter_hash(seed, std::uint64_t(i));
  const float x = (float(std::uint32_t(z >> 40)) / 16777216.0f) * 4.0f - 2.0f;
  out[i] = std::uint16_t(__float_as_uint(x) >> 16);
}

template <int D, int C>
void launch_stamped(const ForwardParams& p, const ForwardPlan& plan, cudaStream_t stream) {
  using Traits = TimelineWsTraits<D, C>;
  constexpr auto kernel = attention_forward_ws_kernel<Traits, StandardShift>;
  static const bool configured = (allow_smem(kernel, Traits::kSmemBytes), true);
  (void)configured;
  const int tiles = blocks_of(p.q_len, Traits::kCtaRows) * p.heads * p.batch;
  kernel<<<dim3(unsigned(std::min(tiles, plan.sms))), Traits::kThreads, Traits::kSmemBytes, stream>>>(p);
  check_cuda(cudaGetLastError(), "timeline forward launch");
}

// Milliseconds a launch takes back to back, after one to warm up.
double time_ms(const std::function<void()>& launch, int repeats) {
  launch();
  check_cuda(cudaDeviceSynchronize(), "warm-up");
  return back_to_back_us(launch, repeats) / 1e3;
}

struct Stats {
  std::vector<double> v;
  void add(double x) { v.push_back(x); }
  double quantile(double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::size_t(q * double(v.size() - 1) + 0.5)];
  }
  double mean() const {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
  }
};

void print_row(const char* what, Stats s, const char* note) {
  std::printf("| %s | %.0f | %.0f | %.0f | %.0f | %s |\n", what, s.mean(), s.quantile(0.1), s.quantile(0.5), s.quantile(0.9), note);
}

// The production call timed beside it is the plan's kernel (it says when the plan picks another).
template <int D, int C>
void run_shape(const MaskedShape& masked, int sms) {
  constexpr int kBlockK = WsForwardTraits<D, C>::kBlockK;
  const AttentionShape& shape = masked.shape;
  if (shape.q_len != shape.k_len || shape.kv_heads != 0)
    throw std::invalid_argument("--forward-timeline: Tq = Tk and multi-head shapes only (no :kvN)");
  const bool causal = masked.causal;
  const int len = shape.q_len;
  const std::size_t elements = std::size_t(shape.q_elements());
  DeviceBuffer<std::uint16_t> q(elements), k(elements), v(elements), o(elements), residual(elements);
  DeviceBuffer<float> lse(std::size_t(shape.rows()));
  int seed = 1;
  for (auto* b : {&q, &k, &v}) {
    fill_inputs_kernel<<<unsigned((elements + 255) / 256), 256>>>(b->ptr, std::int64_t(elements), std::uint64_t(seed++));
    check_cuda(cudaGetLastError(), "fill_inputs_kernel");
  }
  ForwardArgs a;
  a.shape = shape, a.layout = Layout::bhtd;
  a.q = reinterpret_cast<const bf16*>(q.ptr), a.k = reinterpret_cast<const bf16*>(k.ptr), a.v = reinterpret_cast<const bf16*>(v.ptr);
  a.o = reinterpret_cast<bf16*>(o.ptr), a.o_residual = reinterpret_cast<bf16*>(residual.ptr), a.lse = lse.ptr;
  AttentionOptions opt;
  opt.numerics = Numerics::fused, opt.policy = ShiftPolicy::standard, opt.causal = causal;
  opt.delta_source = DeltaSource::compensated, opt.device = Device::cuda;
  check_supported_args(a, opt);
  ForwardPlan plan = plan_forward(a, opt, sms);
  if (plan.walk != ForwardWalk::pipelined) throw std::invalid_argument("--forward-timeline: this call does not take the fast path");
  const char* production_kernel = plan.kernel == ForwardKernel::warp_specialized ? "warp-specialized" : "one warpgroup";
  const int production_consumers = plan.ws_consumers;
  plan.kernel = ForwardKernel::warp_specialized, plan.ws_consumers = C, plan.schedule = TileSchedule::dynamic;

  const int tiles = blocks_of(len, 64 * C) * shape.heads * shape.batch, ctas = std::min(tiles, sms);
  DeviceBuffer<unsigned long long> steps(std::size_t(ctas) * C * kMaxPositions * kStepEvents);
  DeviceBuffer<unsigned long long> producer(std::size_t(ctas) * kMaxPositions * kProducerEvents);
  DeviceBuffer<unsigned long long> tile_marks(std::size_t(ctas) * C * kMaxRounds * kTileEvents);
  const TimelineRecord record{steps.ptr, producer.ptr, tile_marks.ptr};
  check_cuda(cudaMemcpyToSymbol(g_record, &record, sizeof(record)), "cudaMemcpyToSymbol");
  const auto stamped = [&] { execute_forward(a, opt, plan, [&](const ForwardParams& p, cudaStream_t st) { launch_stamped<D, C>(p, plan, st); }); };
  const double production_ms = time_ms([&] { cuda::forward(a, opt); }, 20);
  const double stamped_ms = time_ms(stamped, 20);
  for (auto* b : {&steps, &producer, &tile_marks}) check_cuda(cudaMemset(b->ptr, 0, b->bytes()), "cudaMemset");
  stamped();
  check_cuda(cudaDeviceSynchronize(), "timeline forward");
  const std::vector<unsigned long long> st = steps.values(), pr = producer.values(), ti = tile_marks.values();
  const auto step_at = [&](int cta, int c, int pos, StepMark e) { return st[step_index(C, cta, c, unsigned(pos), int(e))]; };
  const auto producer_at = [&](int cta, int pos, ProducerMark e) { return pr[producer_index(cta, unsigned(pos), int(e))]; };
  const auto tile_at = [&](int cta, int c, int round, TileMark e) { return ti[tile_index(C, cta, c, round, int(e))]; };

  // Phases of the steps that have a step after them in the same tile (and a P V product before
  // them: not a tile's first step).
  Stats phase[kStepEvents], period, loop_back;
  long long steps_counted = 0;
  for (int cta = 0; cta < ctas; ++cta)
    for (int c = 0; c < C; ++c)
      for (int pos = 1; pos + 1 < kMaxPositions; ++pos) {
        if (producer_at(cta, pos, ProducerMark::tile_drawn) || producer_at(cta, pos + 1, ProducerMark::tile_drawn)) continue;
        unsigned long long m[kStepEvents];
        bool complete = true;
        for (int e = 0; e < kStepEvents; ++e) complete &= (m[e] = step_at(cta, c, pos, StepMark(e))) != 0;
        const unsigned long long next = step_at(cta, c, pos + 1, StepMark::begin);
        if (!complete || next == 0) continue;
        for (int e = 1; e < kStepEvents; ++e) phase[e].add(double(m[e] - m[e - 1]));
        loop_back.add(double(next - m[int(StepMark::end)]));
        period.add(double(next - m[int(StepMark::begin)]));
        ++steps_counted;
      }
  Stats epilogue, tile_gap, producer_k_wait, producer_v_wait, epilogue_part[kTileEvents];
  for (int cta = 0; cta < ctas; ++cta) {
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < kMaxRounds; ++r) {
        const auto walked = tile_at(cta, c, r, TileMark::walk_done), stored = tile_at(cta, c, r, TileMark::stored);
        if (walked && stored) {
          epilogue.add(double(stored - walked));
          for (int e = int(TileMark::store_free); e <= int(TileMark::stored); ++e)
            epilogue_part[e].add(double(tile_at(cta, c, r, TileMark(e)) - tile_at(cta, c, r, TileMark(e - 1))));
        }
        const auto next_q = r + 1 < kMaxRounds ? tile_at(cta, c, r + 1, TileMark::q_ready) : 0;
        if (stored && next_q > stored) tile_gap.add(double(next_q - stored));
      }
    for (int pos = 1; pos < kMaxPositions; ++pos) {
      const auto v_prev = producer_at(cta, pos - 1, ProducerMark::v_issued), k_free = producer_at(cta, pos, ProducerMark::k_free);
      const auto k_issued = producer_at(cta, pos, ProducerMark::k_issued), v_free = producer_at(cta, pos, ProducerMark::v_free);
      if (v_prev && k_free && !producer_at(cta, pos, ProducerMark::tile_drawn)) producer_k_wait.add(double(k_free - v_prev));
      if (k_issued && v_free) producer_v_wait.add(double(v_free - k_issued));
    }
  }

  // A tile's whole span, one Q to the next, and what it takes beyond its steps at the median period:
  // the tile's end and its first step, which the per-step rows leave out.
  Stats tile_span, tile_overhead;
  const double median_period = period.quantile(0.5);
  for (int cta = 0; cta < ctas; ++cta) {
    std::vector<int> starts;  // the ring position of each round's first step
    for (int pos = 0; pos < kMaxPositions; ++pos)
      if (producer_at(cta, pos, ProducerMark::tile_drawn)) starts.push_back(pos);
    for (int c = 0; c < C; ++c)
      for (int r = 0; r + 1 < int(starts.size()) && r + 1 < kMaxRounds; ++r) {
        const auto a = tile_at(cta, c, r, TileMark::q_ready), b = tile_at(cta, c, r + 1, TileMark::q_ready);
        if (!a || b <= a) continue;
        tile_span.add(double(b - a));
        tile_overhead.add(double(b - a) - (starts[r + 1] - starts[r]) * median_period);
      }
  }
  const double flops = 4.0 * shape.batch * shape.heads * double(len) * len * D * (causal ? 0.5 : 1.0);
  const double peak_step = 2.0 * 2.0 * 64 * kBlockK * D / 4096.0;  // S and P V of one consumer step at 4,096 FLOP a clock and SM
  std::printf("\n### %dx%dx%dx%d %s: %d consumers, %d-key steps, %d CTAs\n\n", shape.batch, shape.heads, len, D, causal ? "causal" : "full", C,
              kBlockK, ctas);
  std::printf("production (%s%s): %.4f ms, %.1f TFLOP/s; stamped: %.4f ms, %.1f TFLOP/s (%.3fx)\n", production_kernel,
              plan.kernel == ForwardKernel::warp_specialized && production_consumers != C ? ", other consumer count" : "", production_ms,
              flops / production_ms * 1e-9, stamped_ms, flops / stamped_ms * 1e-9, production_ms / stamped_ms);
  std::printf("steps in the summary: %lld (a tile's first and last steps left out); the tensor cores at peak take %.0f cycles for one "
              "consumer step, %.0f for the %d consumers' steps\n\n",
              steps_counted, peak_step, peak_step * C, C);
  std::printf("| phase (cycles, one consumer's step) | mean | p10 | median | p90 | from the mark before |\n|---|---|---|---|---|---|\n");
  print_row("wait for K_j", phase[int(StepMark::k_ready)], "begin");
  print_row("wait for the turn", phase[int(StepMark::turn_taken)], "K_j there");
  print_row("issue S_j, P V (wait for V_(j-1))", phase[int(StepMark::issued)], "turn taken");
  print_row("S_j lands", phase[int(StepMark::s_landed)], "issued");
  print_row("softmax of S_j", phase[int(StepMark::softmax_done)], "S_j landed");
  print_row("P_(j-1) V_(j-1) lands", phase[int(StepMark::pv_landed)], "softmax done");
  print_row("rescale acc, pack P", phase[int(StepMark::end)], "P V landed");
  print_row("to the next step", loop_back, "step over");
  print_row("period (begin to next begin)", period, "");
  print_row("epilogue (per tile)", epilogue, "walk and hand-back done");
  print_row("- staging tiles free", epilogue_part[int(TileMark::store_free)], "walk and hand-back done");
  print_row("- O, residual staged", epilogue_part[int(TileMark::staged)], "staging tiles free");
  print_row("- handed to the store warp", epilogue_part[int(TileMark::synced)], "staged");
  print_row("- lse stored", epilogue_part[int(TileMark::stored)], "handed over");
  print_row("next tile's Q (per tile)", tile_gap, "outputs stored");
  print_row("tile span (per tile)", tile_span, "its Q to the next tile's");
  print_row("- beyond its steps at the median period", tile_overhead, "");
  print_row("producer: wait for a free K stage", producer_k_wait, "previous V issued");
  print_row("producer: wait for a free V stage", producer_v_wait, "K issued");
  std::printf("\nmedian period / (tensor cycles of all consumers' steps) = %.2f (1.00: the tensor cores never wait)\n",
              period.quantile(0.5) / (peak_step * C));

  // CTA 0's first steps, cycles from its first stamp.
  unsigned long long t0 = ~0ull;
  for (int c = 0; c < C; ++c)
    for (int e = 0; e < kStepEvents; ++e)
      if (const auto x = step_at(0, c, 0, StepMark(e))) t0 = std::min(t0, x);
  if (t0 == ~0ull) return;
  std::printf("\nCTA 0, its first steps (cycles after its first stamp; K, V: when the producer issued that position's copies)\n\n");
  std::printf("| pos | consumer | begin | K there | turn | issued | S landed | softmax done | P V landed | end | K, V issued |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int pos = 0; pos < std::min(kMaxPositions, 12); ++pos)
    for (int c = 0; c < C; ++c) {
      if (!step_at(0, c, pos, StepMark::begin)) continue;
      std::printf("| %d | %d |", pos, c);
      for (int e = 0; e < kStepEvents; ++e) {
        const auto x = step_at(0, c, pos, StepMark(e));
        std::printf(x ? " %lld |" : " - |", x ? (long long)(x - t0) : 0ll);
      }
      const auto ki = producer_at(0, pos, ProducerMark::k_issued), vi = producer_at(0, pos, ProducerMark::v_issued);
      std::printf(" %lld, %lld |\n", ki ? (long long)(ki - t0) : -1ll, vi ? (long long)(vi - t0) : -1ll);
    }
}

}  // namespace

int run_forward_timeline(const std::vector<MaskedShape>& shapes) {
  const int sms = multiprocessors();
  std::printf("forward timeline on %s (%d SMs): clock64 stamps by the first thread of each consumer warpgroup\n", device_name().c_str(), sms);
  for (const MaskedShape& s : shapes) {
#if SF_CUDA_HD64
    if (s.shape.head_dim == 64) {
      run_shape<64, 3>(s, sms);
      continue;
    }
#endif
#if SF_CUDA_HD128
    if (s.shape.head_dim == 128) {
      run_shape<128, 2>(s, sms);
      continue;
    }
#endif
    throw std::invalid_argument("--forward-timeline: no kernels for head dim " + std::to_string(s.shape.head_dim) + " in this build");
  }
  return 0;
}

}  // namespace stableflash::attention::cuda::lab
