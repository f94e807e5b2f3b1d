// Per-tensor strides on the GPU: a run on strided views equals, bit for bit, the GPU run on packed
// tensors (strides change addresses and tensor maps, never the arithmetic or the order of it).
// - interleaved: q, k, v in one [B, T, 3, H, D] buffer (the trainer's W_qkv product), dq, dk, dv
//   in a gradient buffer the same way, o / o_residual / do [B, T, H, D] while `layout` says bhtd;
// - transposed: every tensor its own permutation of (B, H, T), some rows padded (PyTorch views);
// - o rows 4- but not 16-byte aligned: the forward's element-wise epilogue instead of bulk stores;
// - dq rows 8- but not 16-byte aligned: the dQ conversion's 8-byte stores instead of 16-byte ones.
// Elements of the buffers that no view covers must keep their poison (no write outside a view),
// and check_supported refuses strides the kernels cannot take, naming the field.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../attention/strided_arrangements.hpp"
#include "gpu_support.hpp"

namespace stableflash::attention::gpu_test {
namespace {

using namespace strided;

struct DeviceArena {
  Arena& host;
  GuardedBuffer<bf16> dev;
  explicit DeviceArena(Arena& a) : host(a), dev(a.mem.size(), a.mem) {}
  bf16* at(const View& v) const { return dev.get() + v.offset; }
  void download() { host.mem = dev.download(); }
};

// Forward + backward on the views of `arrangement`; outputs gathered to packed bhtd.
Outputs run_strided(const Inputs& in, const AttentionOptions& options, const Arrangement& arrangement) {
  AttentionOptions opt = options;
  opt.device = Device::cuda;
  const AttentionShape& s = in.shape;
  std::vector<Arena> arenas;
  std::vector<View> v;
  arrangement.make(s, arenas, v);
  auto arena = [&](int t) -> Arena& { return arenas[std::size_t(arena_of(t))]; };
  arena(kQ).place(v[kQ], in.q), arena(kK).place(v[kK], in.k), arena(kV).place(v[kV], in.v);
  arena(kDo).place(v[kDo], in.d_o);
  for (int t : {kO, kResidual, kDq, kDk, kDv}) arena(t).own(v[std::size_t(t)]);
  std::vector<std::unique_ptr<DeviceArena>> dev;
  for (Arena& a : arenas) dev.push_back(std::make_unique<DeviceArena>(a));
  auto ptr = [&](int t) { return dev[std::size_t(arena_of(t))]->at(v[std::size_t(t)]); };
  const auto rows = std::size_t(s.rows());
  GuardedBuffer<float> lse(rows), delta(rows);
  if (opt.delta_source != DeltaSource::compensated) throw std::invalid_argument("run_strided checks o_residual too");

  ForwardArgs fa;
  fa.shape = s, fa.layout = in.layout;
  fa.q = ptr(kQ), fa.k = ptr(kK), fa.v = ptr(kV), fa.o = ptr(kO), fa.o_residual = ptr(kResidual);
  fa.lse = lse.get();
  fa.strides = {v[kQ].st, v[kK].st, v[kV].st, v[kO].st};
  attention_forward(fa, opt);
  BackwardArgs ba;
  ba.shape = s, ba.layout = in.layout;
  ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.o_residual = fa.o_residual, ba.lse = lse.get(), ba.d_o = ptr(kDo);
  ba.dq = ptr(kDq), ba.dk = ptr(kDk), ba.dv = ptr(kDv), ba.delta = delta.get();
  ba.strides = {v[kQ].st, v[kK].st, v[kV].st, v[kO].st, v[kDo].st, v[kDq].st, v[kDk].st, v[kDv].st};
  attention_backward(ba, opt);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  for (auto& d : dev) {
    EXPECT_TRUE(d->dev.intact(false));
    d->download();
  }
  for (const Arena& a : arenas) EXPECT_TRUE(a.untouched_outside_views());
  Outputs out;
  out.o = arena(kO).gather(v[kO]), out.residual = arena(kResidual).gather(v[kResidual]);
  out.dq = arena(kDq).gather(v[kDq]), out.dk = arena(kDk).gather(v[kDk]), out.dv = arena(kDv).gather(v[kDv]);
  out.lse = lse.download(), out.delta = delta.download();
  return out;
}

struct StridedCase {
  AttentionShape shape;
  const char* arrangement;
  Numerics numerics;
  bool causal, deterministic;
};

std::string name_of(const ::testing::TestParamInfo<StridedCase>& info) {
  const StridedCase& c = info.param;
  return std::string(c.arrangement) + "_Tq" + std::to_string(c.shape.q_len) + "Tk" + std::to_string(c.shape.k_len) + "D" +
         std::to_string(c.shape.head_dim) + "_" + std::string(to_string(c.numerics)) + (c.causal ? "_causal" : "_full") +
         (c.deterministic ? "_det" : "");
}

class StridedGpu : public ::testing::TestWithParam<StridedCase> {};

TEST_P(StridedGpu, EqualsThePackedGpuRunBitForBit) {
  SF_REQUIRE_GPU();
  const StridedCase& c = GetParam();
  const Arrangement arr = std::string(c.arrangement) == "interleaved" ? Arrangement{"interleaved", interleaved}
                                                                        : Arrangement{"transposed", transposed};
  const Inputs in = random_inputs(c.shape, Layout::bhtd, 5100 + c.shape.q_len);
  AttentionOptions opt;
  opt.numerics = c.numerics, opt.causal = c.causal, opt.deterministic = c.deterministic;
  opt.policy = ShiftPolicy::hashed_offset, opt.delta_source = DeltaSource::compensated;
  const Outputs packed = run_gpu(in, opt, /*backward=*/true), strided = run_strided(in, opt, arr);
  EXPECT_TRUE(same_bits(strided.o, packed.o)) << "o";
  EXPECT_TRUE(same_bits(strided.residual, packed.residual)) << "o_residual";
  EXPECT_TRUE(same_bits(strided.lse, packed.lse)) << "lse";
  EXPECT_TRUE(same_bits(strided.delta, packed.delta)) << "delta";
  // dQ is summed with atomics unless the backward is deterministic: two runs of the same layout may
  // differ in its last bits, so it is compared bit for bit in deterministic cases only.
  if (c.deterministic) {
    EXPECT_TRUE(same_bits(strided.dq, packed.dq)) << "dq";
  }
  EXPECT_TRUE(same_bits(strided.dk, packed.dk)) << "dk";
  EXPECT_TRUE(same_bits(strided.dv, packed.dv)) << "dv";
}

std::vector<StridedCase> strided_cases() {
  std::vector<StridedCase> out;
  for (Numerics n : {Numerics::fused, Numerics::paper})
    for (int d : {64, 128}) {
      out.push_back({{2, 4, 300, 300, d}, "interleaved", n, /*causal=*/true, /*deterministic=*/false});
      out.push_back({{2, 3, 200, 333, d}, "transposed", n, /*causal=*/false, /*deterministic=*/false});
      out.push_back({{2, 3, 200, 333, d}, "transposed", n, /*causal=*/false, /*deterministic=*/true});
    }
  out.push_back({{2, 4, 300, 300, 128}, "interleaved", Numerics::fused, /*causal=*/true, /*deterministic=*/true});
  out.push_back({{1, 3, 257, 130, 64}, "transposed", Numerics::fused, /*causal=*/true, /*deterministic=*/true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, StridedGpu, ::testing::ValuesIn(strided_cases()), name_of);

// o rows padded by 2 elements: 4-byte but not 16-byte aligned, so the forward stores O element-wise
// (no bulk tensor stores); same bits as the packed run.
TEST(StridedGpu, OutputRowsWithoutBulkStoreAlignmentGetTheSameBits) {
  SF_REQUIRE_GPU();
  const AttentionShape s{2, 3, 150, 150, 64};
  const Inputs in = random_inputs(s, Layout::bhtd, 5301);
  AttentionOptions opt;
  opt.numerics = Numerics::fused, opt.causal = true, opt.delta_source = DeltaSource::compensated;
  const Outputs packed = run_gpu(in, opt, /*backward=*/false);
  opt.device = Device::cuda;
  const std::int64_t P = s.head_dim + 2;  // [B, H, Tq, D + 2]
  const HeadStrides os{std::int64_t(s.heads) * s.q_len * P, std::int64_t(s.q_len) * P, P};
  const std::size_t n = std::size_t(s.batch) * s.heads * s.q_len * P;
  GuardedBuffer<bf16> q(in.q.size(), in.q), k(in.k.size(), in.k), v(in.v.size(), in.v), o(n), r(n);
  GuardedBuffer<float> lse(std::size_t(s.rows()));
  ForwardArgs fa;
  fa.shape = s, fa.q = q.get(), fa.k = k.get(), fa.v = v.get(), fa.o = o.get(), fa.o_residual = r.get(), fa.lse = lse.get();
  fa.strides.o = os;
  attention_forward(fa, opt);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(o.intact(false) && r.intact(false));
  const std::vector<bf16> o_all = o.download(), r_all = r.download();
  std::vector<bf16> o_packed(in.q.size()), r_packed(in.q.size());
  std::size_t at = 0;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h)
      for (int t = 0; t < s.q_len; ++t)
        for (int d = 0; d < s.head_dim; ++d, ++at) {
          o_packed[at] = o_all[std::size_t(os.at(b, h, t) + d)];
          r_packed[at] = r_all[std::size_t(os.at(b, h, t) + d)];
        }
  EXPECT_TRUE(same_bits(o_packed, packed.o));
  EXPECT_TRUE(same_bits(r_packed, packed.residual));
  EXPECT_TRUE(same_bits(lse.download(), packed.lse));
}

// dq, dk and dv rows 8- but not 16-byte aligned (4 elements into their buffers, rows of D + 4): the
// dQ conversion and the main kernel's dK, dV epilogue store 8 bytes at a time instead of 16; the
// gradients have the packed run's bits (deterministic, so dQ is reproducible), and no element
// between the rows is written.
TEST(StridedGpu, GradientRowsWithout16ByteAlignmentGetTheSameBits) {
  SF_REQUIRE_GPU();
  for (const int d : {64, 128}) {
    const AttentionShape s{2, 3, 150, 150, d};  // Tq = Tk: dq, dk, dv share the padded layout
    const Inputs in = random_inputs(s, Layout::bhtd, 5400 + d);
    AttentionOptions opt;
    opt.numerics = Numerics::fused, opt.causal = true, opt.deterministic = true;
    opt.delta_source = DeltaSource::compensated;
    const Outputs packed = run_gpu(in, opt, /*backward=*/true);
    opt.device = Device::cuda;
    const std::int64_t P = d + 4, offset = 4;  // [B, H, T, D + 4] from element 4: 8-byte aligned rows
    const HeadStrides padded{std::int64_t(s.heads) * s.q_len * P, std::int64_t(s.q_len) * P, P};
    const std::size_t n = std::size_t(offset + std::int64_t(s.rows()) * P);
    const BackwardInputsOnDevice dev(in, packed);
    GuardedBuffer<bf16> dq(n), dk(n), dv(n);
    GuardedBuffer<float> delta(packed.lse.size());
    BackwardArgs ba = dev.args();
    ba.dq = dq.get() + offset, ba.dk = dk.get() + offset, ba.dv = dv.get() + offset, ba.delta = delta.get();
    ba.strides.dq = ba.strides.dk = ba.strides.dv = padded;
    attention_backward(ba, opt);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(dq.intact(false) && dk.intact(false) && dv.intact(false)) << "D " << d;
    // the rows packed again, and the elements between them that were written (still poison: none)
    const auto unpadded = [&](const GuardedBuffer<bf16>& buffer, std::size_t& outside) {
      const std::vector<bf16> all = buffer.download();
      std::vector<bf16> rows;
      for (int b = 0; b < s.batch; ++b)
        for (int h = 0; h < s.heads; ++h)
          for (int t = 0; t < s.q_len; ++t) {
            for (int e = 0; e < d; ++e) rows.push_back(all[std::size_t(offset + padded.at(b, h, t) + e)]);
            for (int e = d; e < P; ++e) outside += all[std::size_t(offset + padded.at(b, h, t) + e)].bits != 0xffa5;  // poison
          }
      return rows;
    };
    for (const auto& [name, buffer, expected] : {std::tuple{"dq", &dq, &packed.dq}, std::tuple{"dk", &dk, &packed.dk},
                                                 std::tuple{"dv", &dv, &packed.dv}}) {
      std::size_t outside = 0;
      EXPECT_TRUE(same_bits(unpadded(*buffer, outside), *expected)) << name << ", D " << d;
      EXPECT_EQ(outside, 0u) << "D " << d << ": elements between " << name << "'s rows written";
    }
    EXPECT_TRUE(same_bits(delta.download(), packed.delta)) << "D " << d;
  }
}

// A stride the kernels cannot take is refused before anything runs, with the field named.
TEST(StridedGpu, UnalignedStridesAreRefusedNamingTheField) {
  SF_REQUIRE_GPU();
  const AttentionShape s{2, 3, 64, 64, 64};
  AttentionOptions opt;
  opt.device = Device::cuda;
  GuardedBuffer<bf16> x(std::size_t(s.q_elements()) * 2);
  GuardedBuffer<float> lse(std::size_t(s.rows()));
  ForwardArgs fa;
  fa.shape = s, fa.q = fa.k = fa.v = x.get(), fa.o = x.get() + s.q_elements(), fa.lse = lse.get();
  auto message = [&](const ForwardArgs& a) -> std::string {
    try {
      cuda::check_supported_args(a, opt);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(message(fa), "accepted");
  ForwardArgs bad = fa;
  bad.strides.k = HeadStrides{3 * 64 * 65, 64 * 65, 65};  // 130-byte rows
  EXPECT_NE(message(bad).find("strides.k.t = 65"), std::string::npos) << message(bad);
  bad = fa;
  bad.strides.q = HeadStrides{3 * 64 * 64, 64 * 64, 68};  // token stride 136 bytes: not a multiple of 16
  EXPECT_NE(message(bad).find("strides.q.t = 68"), std::string::npos) << message(bad);
  bad = fa;
  bad.strides.o = HeadStrides{3 * 64 * 64, 64 * 64, 63};  // odd: pairs of values would straddle
  EXPECT_NE(message(bad).find("strides.o.t = 63"), std::string::npos) << message(bad);
  bad = fa;
  bad.v = x.get() + 1;
  EXPECT_NE(message(bad).find("v must be 16-byte aligned"), std::string::npos) << message(bad);
}

}  // namespace
}  // namespace stableflash::attention::gpu_test
