// The GPU standard attention (model/cuda/standard_attention.cu) against the CPU reference run in
// FP64, with an error bound derived per element from the actual inputs; plus bitwise determinism
// and guard buffers that catch writes past the end of every output.
//
// Error model (u = 2^-24, FP32 unit roundoff). A length-K FP32 dot product, in any summation order
// and with or without FMA, is off by at most K u sum_k |a_k b_k| (the gamma_K bound, first order).
// Following the GPU's steps for one head, query row i, n_i = i + 1 visible keys:
//   S_ij  = scale q_i.k_j           : dS_i    = (D + 3) u max_j scale sum_d |q_id k_jd|
//                                     (dot, alpha multiply, and the two roundings in 1/sqrtf(D))
//   P_ij  = exp(S_ij - m_i) / sum   : |dP_ij| <= P_ij eps_i, eps_i = 2 dS_i + (max_j |S_ij - m_i| + n_i + 10) u
//                                     (a shift c of all scores cancels, so input errors count
//                                      twice; the subtraction's rounding is amplified by |S - m|
//                                      through exp; expf <= 2 ulp; n_i for the sum; 1/sum and *)
//   O_id  = sum_j P_ij V_jd         : (eps_i + T u) sum_j P_ij |V_jd|
//   dV_jd = sum_i P_ij dO_id        : sum_i (P_ij eps_i + T u P_ij) |dO_id|
//   G_ij  = dO_i.V_j (dP)           : eG_ij = D u sum_d |dO_id V_jd|
//   r_i   = sum_j P_ij G_ij         : er_i  = sum_j (|dP_ij| |G_ij| + P_ij eG_ij) + (n_i + 1) u sum_j P_ij |G_ij|
//   dS_ij = scale P_ij (G_ij - r_i) : edS_ij = scale (|dP_ij| |G_ij - r_i| + P_ij (eG_ij + er_i)
//                                               + 5 u P_ij (|G_ij| + |r_i|))
//   dQ_id = sum_j dS_ij K_jd        : sum_j (edS_ij |K_jd| + T u |dS_ij K_jd|)
//   dK_jd = sum_i dS_ij Q_id        : sum_i (edS_ij |Q_id| + T u |dS_ij Q_id|)
// These are first-order bounds; the test allows twice each (kSafety) for the second-order terms
// and gamma_K = K u / (1 - K u). The FP64 reference's own error (~1e-16 relative) is negligible.
// Worst-case bounds are loose (real rounding errors grow like sqrt(K) u), yet an indexing or
// masking bug makes errors of the size of the values themselves, orders above them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "stableflash/attention/standard_fp32.hpp"
#include "stableflash/model/cuda/blas.hpp"
#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/cuda/standard_attention.hpp"
#include "stableflash/numerics/random.hpp"
#include "require_gpu.hpp"

namespace stableflash::model::cuda {
namespace {

constexpr double kU = 0x1.0p-24;
constexpr double kSafety = 2.0;
constexpr std::size_t kGuard = 64;                 // sentinel floats after every output
constexpr std::uint32_t kSentinelBits = 0x7fc0deadu;  // a quiet NaN nobody computes

struct Case {
  int batch, heads, len, head_dim;
  double logit_scale;  // q is drawn with this standard deviation: larger means peakier softmax rows
};

std::string name(const Case& c) {
  return "B" + std::to_string(c.batch) + "_H" + std::to_string(c.heads) + "_T" + std::to_string(c.len) + "_D" +
         std::to_string(c.head_dim) + "_q" + std::to_string(int(c.logit_scale));
}

// gtest prints failing parameters with this instead of a byte dump.
void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

struct Inputs {
  std::vector<float> q, k, v, d_o;  // [B, T, H, D]
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  const std::size_t n = std::size_t(c.batch) * c.len * c.heads * c.head_dim;
  Inputs in{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  SplitMix64 rng(seed);
  for (std::size_t i = 0; i < n; ++i) {
    in.q[i] = float(c.logit_scale * rng.normal());
    in.k[i] = float(rng.normal());
    in.v[i] = float(rng.normal());
    in.d_o[i] = float(rng.normal());
  }
  return in;
}

// The five outputs plus the d_probs scratch, on the host.
struct Outputs {
  std::vector<float> o, probs, dq, dk, dv, d_probs;
};

// A device buffer of n floats followed by kGuard sentinels, the whole of it pre-filled with the
// sentinel so that an output element the code forgets to write shows up as NaN.
struct Guarded {
  DeviceArray<float> buf;
  std::size_t n;

  Guarded(std::size_t count, cudaStream_t stream) : buf(count + kGuard), n(count) {
    float sentinel;
    std::memcpy(&sentinel, &kSentinelBits, 4);
    const std::vector<float> fill(count + kGuard, sentinel);
    buf.upload(fill.data(), fill.size(), stream);
  }
  float* get() const { return buf.get(); }
  // Downloads the n values; the test fails if any guard sentinel changed.
  std::vector<float> take(cudaStream_t stream, const char* what) const {
    std::vector<float> all(n + kGuard);
    buf.download(all.data(), all.size(), stream);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (std::size_t i = n; i < all.size(); ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, &all[i], 4);
      EXPECT_EQ(bits, kSentinelBits) << what << ": write past the end at element " << i;
    }
    all.resize(n);
    return all;
  }
};

Outputs run_gpu(const Case& c, const Inputs& in) {
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  Outputs out;
  {
    Blas blas(stream);
    const std::size_t n = in.q.size();
    const std::size_t n_probs = std::size_t(c.batch) * c.heads * c.len * c.len;
    DeviceArray<float> q(n), k(n), v(n), d_o(n);
    q.upload(in.q.data(), n, stream);
    k.upload(in.k.data(), n, stream);
    v.upload(in.v.data(), n, stream);
    d_o.upload(in.d_o.data(), n, stream);
    Guarded o(n, stream), probs(n_probs, stream), d_probs(n_probs, stream), dq(n, stream), dk(n, stream), dv(n, stream);

    const StandardAttentionShape shape{c.batch, c.heads, c.len, c.head_dim};
    standard_attention_forward(blas, shape, q.get(), k.get(), v.get(), probs.get(), o.get());
    standard_attention_backward(blas, shape, q.get(), k.get(), v.get(), probs.get(), d_o.get(), d_probs.get(), dq.get(),
                                dk.get(), dv.get());
    check_cuda(cudaStreamSynchronize(stream), "standard attention");

    out.o = o.take(stream, "o");
    out.probs = probs.take(stream, "probs");
    out.dq = dq.take(stream, "dq");
    out.dk = dk.take(stream, "dk");
    out.dv = dv.take(stream, "dv");
    out.d_probs = d_probs.take(stream, "d_probs");
  }
  check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
  return out;
}

struct Reference {
  std::vector<double> o, probs, dq, dk, dv;             // the CPU standard attention in FP64
  std::vector<double> bound_o, bound_p, bound_dq, bound_dk, bound_dv;  // allowed |gpu - ref|
};

Reference reference(const Case& c, const Inputs& in) {
  const int B = c.batch, H = c.heads, T = c.len, D = c.head_dim;
  const std::size_t n = in.q.size();
  const std::vector<double> q(in.q.begin(), in.q.end()), k(in.k.begin(), in.k.end()), v(in.v.begin(), in.v.end()),
      d_o(in.d_o.begin(), in.d_o.end());
  Reference r;
  r.o.resize(n), r.dq.resize(n), r.dk.resize(n), r.dv.resize(n);
  r.probs.resize(std::size_t(B) * H * T * T);
  attention::StandardAttentionArgs<double> args;
  args.batch = B, args.heads = H, args.len = T, args.head_dim = D;
  args.row_stride = std::int64_t(H) * D;
  args.causal = true;
  args.q = q.data(), args.k = k.data(), args.v = v.data(), args.o = r.o.data(), args.probs = r.probs.data();
  attention::standard_attention_forward(args);
  attention::standard_attention_backward(args, d_o.data(), r.dq.data(), r.dk.data(), r.dv.data());

  // The bounds of the header comment, one head at a time.
  r.bound_o.assign(n, 0.0), r.bound_dq.assign(n, 0.0), r.bound_dk.assign(n, 0.0), r.bound_dv.assign(n, 0.0);
  r.bound_p.assign(r.probs.size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(D));
  auto at = [&](int b, int t, int h) { return ((std::size_t(b) * T + t) * H + h) * D; };  // [B, T, H, D]
  std::vector<double> s(T), g(T), eg(T), ds(T), eds(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const std::size_t head = (std::size_t(b) * H + h) * T * T;  // [T, T] of this head
      for (int i = 0; i < T; ++i) {
        const double* p = &r.probs[head + std::size_t(i) * T];
        const double* qi = &q[at(b, i, h)];
        const double* gi = &d_o[at(b, i, h)];
        double ds_max = 0, m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const double* kj = &k[at(b, j, h)];
          double dot = 0, mag = 0;
          for (int d = 0; d < D; ++d) dot += qi[d] * kj[d], mag += std::abs(qi[d] * kj[d]);
          s[j] = scale * dot;
          m = std::max(m, s[j]);
          ds_max = std::max(ds_max, (D + 3) * kU * scale * mag);
        }
        double spread = 0;
        for (int j = 0; j <= i; ++j) spread = std::max(spread, std::abs(s[j] - m));
        const double eps = 2 * ds_max + (spread + (i + 1) + 10) * kU;

        // forward: probs and o
        // + 2^-126: below FP32's normal range (exp(S - m) < 2^-126) relative bounds stop holding,
        // but a subnormal's absolute error is far smaller than this.
        for (int j = 0; j <= i; ++j) r.bound_p[head + std::size_t(i) * T + j] = p[j] * eps + 0x1.0p-126;
        for (int d = 0; d < D; ++d) {
          double mag = 0;
          for (int j = 0; j <= i; ++j) mag += p[j] * std::abs(v[at(b, j, h) + d]);
          r.bound_o[at(b, i, h) + d] = (eps + T * kU) * mag;
        }

        // backward: G = dP, its row dot r_i, dS and their errors
        double ri = 0, ri_mag = 0, er = 0;
        for (int j = 0; j <= i; ++j) {
          const double* vj = &v[at(b, j, h)];
          double dot = 0, mag = 0;
          for (int d = 0; d < D; ++d) dot += gi[d] * vj[d], mag += std::abs(gi[d] * vj[d]);
          g[j] = dot;
          eg[j] = D * kU * mag;
          ri += p[j] * g[j];
          ri_mag += p[j] * std::abs(g[j]);
          er += p[j] * eps * std::abs(g[j]) + p[j] * eg[j];
        }
        er += (i + 2) * kU * ri_mag;
        for (int j = 0; j <= i; ++j) {
          ds[j] = scale * p[j] * (g[j] - ri);
          eds[j] = scale * (p[j] * eps * std::abs(g[j] - ri) + p[j] * (eg[j] + er) + 5 * kU * p[j] * (std::abs(g[j]) + std::abs(ri)));
        }
        // scatter this row's contributions into dv, dq, dk
        for (int j = 0; j <= i; ++j)
          for (int d = 0; d < D; ++d) {
            r.bound_dv[at(b, j, h) + d] += (p[j] * eps + T * kU * p[j]) * std::abs(gi[d]);
            r.bound_dq[at(b, i, h) + d] += eds[j] * std::abs(k[at(b, j, h) + d]) + T * kU * std::abs(ds[j] * k[at(b, j, h) + d]);
            r.bound_dk[at(b, j, h) + d] += eds[j] * std::abs(qi[d]) + T * kU * std::abs(ds[j] * qi[d]);
          }
      }
    }
  for (auto* bound : {&r.bound_o, &r.bound_p, &r.bound_dq, &r.bound_dk, &r.bound_dv})
    for (double& x : *bound) x *= kSafety;
  return r;
}

// Every element within its bound (NaN fails); reports the worst element and the largest
// error/bound ratio so tightening shows up in the log.
void expect_within(const char* what, const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& bound) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::size_t failures = 0, first = 0;
  double worst_ratio = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= bound[i])) {
      if (failures++ == 0) first = i;
    } else if (bound[i] > 0) {
      worst_ratio = std::max(worst_ratio, err / bound[i]);
    }
  }
  EXPECT_EQ(failures, 0u) << what << ": first bad element " << first << " got " << got[first] << " want " << want[first]
                          << " bound " << bound[first];
  ::testing::Test::RecordProperty(std::string(what) + "_err_over_bound", std::to_string(worst_ratio));
}

class StandardAttentionGpu : public ::testing::TestWithParam<Case> {};

TEST_P(StandardAttentionGpu, MatchesFp64ReferenceWithinDerivedBound) {
  SF_REQUIRE_GPU();
  const Case c = GetParam();
  const Inputs in = make_inputs(c, /*seed=*/0x5eed0000u + c.len);
  const Outputs got = run_gpu(c, in);
  const Reference want = reference(c, in);

  expect_within("probs", got.probs, want.probs, want.bound_p);
  expect_within("o", got.o, want.o, want.bound_o);
  expect_within("dq", got.dq, want.dq, want.bound_dq);
  expect_within("dk", got.dk, want.dk, want.bound_dk);
  expect_within("dv", got.dv, want.dv, want.bound_dv);

  // The mask is exact: nothing above the diagonal of probs or of dS.
  const int T = c.len;
  std::size_t nonzero = 0;
  for (std::size_t row = 0; row < got.probs.size() / T; ++row)
    for (int j = int(row % T) + 1; j < T; ++j) nonzero += got.probs[row * T + j] != 0.0f || got.d_probs[row * T + j] != 0.0f;
  EXPECT_EQ(nonzero, 0u) << "entries above the diagonal";
}

INSTANTIATE_TEST_SUITE_P(Shapes, StandardAttentionGpu,
                         ::testing::Values(Case{2, 3, 17, 8, 1.0}, Case{1, 2, 64, 64, 1.0}, Case{2, 4, 128, 32, 1.0},
                                           Case{1, 1, 1, 4, 1.0},     // a single key: probs are exactly 1
                                           Case{1, 3, 97, 16, 1.0},   // odd length, rows not a multiple of a block
                                           Case{2, 2, 33, 64, 8.0}),  // large logits: peaky rows
                         [](const ::testing::TestParamInfo<Case>& info) { return name(info.param); });

TEST(StandardAttentionGpuDeterminism, TwoRunsAreBitwiseEqual) {
  SF_REQUIRE_GPU();
  for (const Case& c : {Case{2, 4, 128, 32, 1.0}, Case{1, 3, 97, 16, 4.0}}) {
    const Inputs in = make_inputs(c, /*seed=*/42);
    const Outputs a = run_gpu(c, in), b = run_gpu(c, in);
    auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same(a.probs, b.probs)) << name(c) << " probs";
    EXPECT_TRUE(same(a.o, b.o)) << name(c) << " o";
    EXPECT_TRUE(same(a.d_probs, b.d_probs)) << name(c) << " d_probs";
    EXPECT_TRUE(same(a.dq, b.dq)) << name(c) << " dq";
    EXPECT_TRUE(same(a.dk, b.dk)) << name(c) << " dk";
    EXPECT_TRUE(same(a.dv, b.dv)) << name(c) << " dv";
  }
}

}  // namespace
}  // namespace stableflash::model::cuda
