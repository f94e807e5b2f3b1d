// GPU tests of the CUDA layer kernels (model/cuda/layer_kernels.cu, classifier_kernels.cu)
// against their CPU twins in stableflash/model/layers.hpp run in FP64 on the very values the GPU
// received (BF16 inputs widened exactly). Every tolerance is a first-order rounding-error bound
// derived in the comment beside it, with u = 2^-24 (FP32 unit roundoff) and 2^-8 (BF16 unit
// roundoff, round to nearest even); the CUDA math library bounds used are the documented maximum
// errors expf 2 ulp, logf 1 ulp, tanhf 2 ulp (an ulp of an FP32 result is at most 2u relative).
// Buffers carry guard zones that must stay intact, outputs start poisoned, any NaN fails, and
// every reducing kernel must give the same bits twice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "stableflash/model/cuda/device_array.hpp"
#include "stableflash/model/cuda/layer_kernels.hpp"
#include "stableflash/model/layers.hpp"
#include "stableflash/numerics/bf16.hpp"
#include "stableflash/numerics/random.hpp"
#include "require_gpu.hpp"

namespace {

namespace mc = stableflash::model::cuda;
namespace layers = stableflash::model::layers;
using stableflash::bf16;
using stableflash::SplitMix64;

constexpr double u = 0x1.0p-24;       // FP32 unit roundoff
constexpr double u_bf16 = 0x1.0p-8;   // BF16 unit roundoff: |BF16(x) - x| <= 2^-8 |x|

// A device copy of a host vector with kGuard elements of 0xA5 bytes on each side; the interior
// starts as the same poison, so an element a kernel should write but did not shows up as a
// mismatch. kGuard keeps the interior 16-byte aligned (the vector paths).
template <class H>
class Buf {
 public:
  static constexpr std::size_t kGuard = 64;
  explicit Buf(std::size_t n) : n_(n), arr_(n + 2 * kGuard) {
    mc::check_cuda(cudaMemset(arr_.get(), 0xA5, arr_.bytes()), "cudaMemset (poison)");
  }
  explicit Buf(const std::vector<H>& host) : Buf(host.size()) { upload(host); }
  H* get() const { return arr_.get() + kGuard; }
  void upload(const std::vector<H>& host) {
    mc::check_cuda(cudaMemcpy(get(), host.data(), n_ * sizeof(H), cudaMemcpyHostToDevice), "cudaMemcpy (upload)");
  }
  std::vector<H> download() const {
    mc::check_cuda(cudaDeviceSynchronize(), "kernel");
    std::vector<H> host(n_);
    mc::check_cuda(cudaMemcpy(host.data(), get(), n_ * sizeof(H), cudaMemcpyDeviceToHost), "cudaMemcpy (download)");
    return host;
  }
  ::testing::AssertionResult guards_intact() const {
    mc::check_cuda(cudaDeviceSynchronize(), "kernel");
    std::vector<unsigned char> all(arr_.bytes());
    mc::check_cuda(cudaMemcpy(all.data(), arr_.get(), arr_.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy (guards)");
    const std::size_t g = kGuard * sizeof(H);
    for (std::size_t i = 0; i < g; ++i) {
      if (all[i] != 0xA5) return ::testing::AssertionFailure() << "guard before the buffer overwritten at byte " << i;
      if (all[all.size() - g + i] != 0xA5) return ::testing::AssertionFailure() << "guard after the buffer overwritten at byte " << i;
    }
    return ::testing::AssertionSuccess();
  }

 private:
  std::size_t n_;
  mc::DeviceArray<H> arr_;
};

mc::bf16_t* dev(const Buf<bf16>& b) { return reinterpret_cast<mc::bf16_t*>(b.get()); }

std::vector<float> normal_f32(SplitMix64& rng, std::size_t n, double scale, double offset = 0.0) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(offset + scale * rng.normal());
  return v;
}
std::vector<bf16> normal_bf16(SplitMix64& rng, std::size_t n, double scale, double offset = 0.0) {
  std::vector<bf16> v(n);
  for (auto& x : v) x = bf16::from_float(float(offset + scale * rng.normal()));
  return v;
}
std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widen(const std::vector<bf16>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = v[i].to_float();
  return d;
}
std::vector<double> abs_of(std::vector<double> v) {
  for (auto& x : v) x = std::fabs(x);
  return v;
}

// |got - ref| <= bound element-wise; NaN in got fails. Reports the worst few.
::testing::AssertionResult within(const std::vector<double>& got, const std::vector<double>& ref,
                                  const std::vector<double>& bound, const std::string& what) {
  if (got.size() != ref.size() || ref.size() != bound.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
  int bad = 0;
  std::string report;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref[i]);
    if (std::isnan(got[i]) || !(err <= bound[i])) {
      if (++bad <= 5)
        report += "\n  [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " ref " + std::to_string(ref[i]) +
                  " err " + std::to_string(err) + " bound " + std::to_string(bound[i]);
    }
  }
  if (bad) return ::testing::AssertionFailure() << what << ": " << bad << " of " << got.size() << " out of bound" << report;
  return ::testing::AssertionSuccess();
}

// A BF16 result r = BF16(y) where the FP32 y carries error at most e: |r - ref| <= 2^-8 |y| + e
// <= 2^-8 (|ref| + e) + e.
double bf16_bound(double ref, double e) { return u_bf16 * (std::fabs(ref) + e) + e; }

template <class H>
bool bitwise_equal(const std::vector<H>& a, const std::vector<H>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(H)) == 0;
}

struct Shape {
  int N, C;
};
const Shape kOddShapes[] = {{1, 4}, {17, 20}, {97, 768}, {17, 768}, {97, 20}, {1, 768}, {300, 4}};

// ---------------------------------------------------------------------------------------------

TEST(EncoderGpu, ForwardMatchesCpu) {
  SF_REQUIRE_GPU();
  struct Case { int B, T, C; };
  for (const Case k : {Case{1, 1, 4}, Case{1, 17, 20}, Case{3, 33, 768}, Case{1, 97, 4}, Case{2, 9, 24}}) {
    SCOPED_TRACE("B=" + std::to_string(k.B) + " T=" + std::to_string(k.T) + " C=" + std::to_string(k.C));
    SplitMix64 rng(11, k.C * 1000 + k.T);
    const int V = 37, N = k.B * k.T;
    std::vector<int> tokens(N);
    for (auto& t : tokens) t = int(rng.next() % V);
    const auto wte = normal_f32(rng, std::size_t(V) * k.C, 0.02);
    const auto wpe = normal_f32(rng, std::size_t(k.T + 3) * k.C, 0.01);
    Buf<float> x(std::size_t(N) * k.C), d_wte(wte), d_wpe(wpe);
    Buf<int> d_tok(tokens);
    mc::encoder_forward(x.get(), d_tok.get(), d_wte.get(), d_wpe.get(), k.B, k.T, k.C, nullptr);
    std::vector<double> ref(std::size_t(N) * k.C);
    const auto wte64 = widen(wte), wpe64 = widen(wpe);
    layers::embedding_forward<double>(ref.data(), tokens.data(), wte64.data(), wpe64.data(), k.B, k.T, k.C);
    // One FP32 addition of two FP32 values, correctly rounded: |err| <= u |exact|.
    std::vector<double> bound(ref.size());
    for (std::size_t i = 0; i < ref.size(); ++i) bound[i] = u * std::fabs(ref[i]);
    EXPECT_TRUE(within(widen(x.download()), ref, bound, "x"));
    EXPECT_TRUE(x.guards_intact());
  }
}

// The host's grouping of rows by token (what the trainer stages): distinct tokens ascending, each
// group's rows ascending; group u's rows are rows[offsets[u], offsets[u + 1]).
struct TokenGroups {
  std::vector<int> ids, offsets{0}, rows;
};
TokenGroups group_by_token(const std::vector<int>& tokens) {
  std::map<int, std::vector<int>> groups;
  for (int n = 0; n < int(tokens.size()); ++n) groups[tokens[n]].push_back(n);
  TokenGroups g;
  for (const auto& [tok, rs] : groups) {
    g.ids.push_back(tok);
    g.rows.insert(g.rows.end(), rs.begin(), rs.end());
    g.offsets.push_back(int(g.rows.size()));
  }
  return g;
}

TEST(EncoderGpu, BackwardRepeatedTokensMatchesCpuAndIsDeterministic) {
  SF_REQUIRE_GPU();
  struct Case { int B, T, C, V; };
  // The last case has more (group, column) pairs (about 3200 x 1024) than the capped grid has
  // threads (8192 x 256): its threads loop.
  for (const Case k : {Case{1, 1, 4, 3}, Case{2, 17, 20, 5}, Case{4, 64, 768, 37}, Case{3, 97, 24, 2}, Case{4, 1024, 1024, 8000}}) {
    SCOPED_TRACE("B=" + std::to_string(k.B) + " T=" + std::to_string(k.T) + " C=" + std::to_string(k.C));
    SplitMix64 rng(12, k.C * 1000 + k.T);
    const int N = k.B * k.T;
    std::vector<int> tokens(N);
    for (auto& t : tokens) t = int(rng.next() % k.V);  // small vocabulary: many repeats
    const auto [ids, offsets, rows] = group_by_token(tokens);
    const auto dx = normal_f32(rng, std::size_t(N) * k.C, 1.0);
    const auto wte0 = normal_f32(rng, std::size_t(k.V) * k.C, 0.5);  // nonzero: the kernel accumulates
    const auto wpe0 = normal_f32(rng, std::size_t(k.T) * k.C, 0.5);
    Buf<float> d_dx(dx), d_wte(wte0), d_wpe(wpe0);
    Buf<int> d_ids(ids), d_off(offsets), d_rows(rows), d_distinct(std::vector<int>{int(ids.size())});
    auto run = [&] {
      d_wte.upload(wte0), d_wpe.upload(wpe0);
      mc::encoder_backward(d_wte.get(), d_wpe.get(), d_dx.get(), d_ids.get(), d_off.get(), d_rows.get(), d_distinct.get(),
                           k.B, k.T, k.C, nullptr);
      return std::pair{d_wte.download(), d_wpe.download()};
    };
    const auto [wte1, wpe1] = run();
    const auto [wte2, wpe2] = run();
    EXPECT_TRUE(bitwise_equal(wte1, wte2)) << "dwte differs between runs";
    EXPECT_TRUE(bitwise_equal(wpe1, wpe2)) << "dwpe differs between runs";

    auto ref_wte = widen(wte0), ref_wpe = widen(wpe0);
    const auto dx64 = widen(dx);
    layers::embedding_backward<double>(ref_wte.data(), ref_wpe.data(), dx64.data(), tokens.data(), k.B, k.T, k.C);
    // sum|terms| per element: the same twin on |dx| starting from |initial value|.
    auto abs_wte = abs_of(widen(wte0)), abs_wpe = abs_of(widen(wpe0));
    const auto abs_dx = abs_of(dx64);
    layers::embedding_backward<double>(abs_wte.data(), abs_wpe.data(), abs_dx.data(), tokens.data(), k.B, k.T, k.C);
    // A recursive FP32 sum of m terms errs by at most (m - 1) u sum|terms| (first order). dwpe
    // adds B rows and the initial value: m = B + 1; a dwte row adds its token's count + 1.
    std::vector<int> count(k.V, 0);
    for (int t : tokens) ++count[t];
    std::vector<double> b_wte(ref_wte.size()), b_wpe(ref_wpe.size());
    for (std::size_t i = 0; i < b_wte.size(); ++i) b_wte[i] = count[i / k.C] * u * abs_wte[i];
    for (std::size_t i = 0; i < b_wpe.size(); ++i) b_wpe[i] = k.B * u * abs_wpe[i];
    EXPECT_TRUE(within(widen(wte1), ref_wte, b_wte, "dwte"));
    EXPECT_TRUE(within(widen(wpe1), ref_wpe, b_wpe, "dwpe"));
    EXPECT_TRUE(d_wte.guards_intact());
    EXPECT_TRUE(d_wpe.guards_intact());
  }
}

// The token embedding split of data-parallel training: the lookup rows written apart and added
// later leave encoder_backward's bits (the same per-row sum, then the same one FP32 addition).
TEST(EncoderGpu, SplitRowsAddedLaterAreEncoderBackwardBitwise) {
  SF_REQUIRE_GPU();
  struct Case { int B, T, C, V; };
  for (const Case k : {Case{1, 1, 4, 3}, Case{2, 17, 20, 5}, Case{4, 64, 768, 37}}) {
    SCOPED_TRACE("B=" + std::to_string(k.B) + " T=" + std::to_string(k.T) + " C=" + std::to_string(k.C));
    SplitMix64 rng(13, k.C * 1000 + k.T);
    const int N = k.B * k.T;
    std::vector<int> tokens(N);
    for (auto& t : tokens) t = int(rng.next() % k.V);
    const auto [ids, offsets, rows] = group_by_token(tokens);
    const int distinct = int(ids.size());
    const auto dx = normal_f32(rng, std::size_t(N) * k.C, 1.0);
    const auto wte0 = normal_f32(rng, std::size_t(k.V) * k.C, 0.5);  // the classifier's part, already there
    const auto wpe0 = normal_f32(rng, std::size_t(k.T) * k.C, 0.5);
    Buf<float> d_dx(dx), d_wte(wte0), d_wpe(wpe0), d_split(wte0), d_rows(std::vector<float>(std::size_t(distinct) * k.C, -1.0f));
    Buf<int> d_ids(ids), d_off(offsets), d_grp(rows), d_distinct(std::vector<int>{distinct});
    mc::encoder_backward(d_wte.get(), d_wpe.get(), d_dx.get(), d_ids.get(), d_off.get(), d_grp.get(), d_distinct.get(), k.B, k.T, k.C,
                         nullptr);
    mc::embedding_rows_backward(d_rows.get(), d_dx.get(), d_off.get(), d_grp.get(), distinct, k.C, nullptr);
    // Added in two calls (the rows of two senders): the rows are independent.
    const int half = distinct / 2;
    mc::add_embedding_rows(d_split.get(), d_rows.get(), d_ids.get(), half, k.C, nullptr);
    mc::add_embedding_rows(d_split.get(), d_rows.get() + std::size_t(half) * k.C, d_ids.get() + half, distinct - half, k.C, nullptr);
    EXPECT_TRUE(bitwise_equal(d_split.download(), d_wte.download())) << "split rows differ from encoder_backward's";
    EXPECT_TRUE(d_rows.guards_intact());
    EXPECT_TRUE(d_split.guards_intact());
  }
}

// ---------------------------------------------------------------------------------------------

TEST(LayerNormGpu, ForwardMatchesCpuAndIsDeterministic) {
  SF_REQUIRE_GPU();
  int variant = 0;
  for (const Shape s : kOddShapes) {
    for (const bool fused : {true, false}) {
      const bool with_bias = (variant++ % 3) != 1;
      const int N = s.N, C = s.C;
      SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " fused=" + std::to_string(fused) +
                   " bias=" + std::to_string(with_bias));
      SplitMix64 rng(21, variant);
      const std::size_t NC = std::size_t(N) * C;
      const auto res = normal_f32(rng, NC, 1.0, 0.7);  // an offset mean exercises the two-pass variance
      const auto branch = normal_bf16(rng, NC, 0.8);
      const auto w = normal_f32(rng, C, 0.1, 1.0);
      const auto b = normal_f32(rng, C, 0.1);
      const float eps = 1e-5f;
      Buf<float> d_res(res), d_out_res(NC), d_w(w), d_b(b), d_mean(N), d_rstd(N);
      Buf<bf16> d_branch(branch), d_ln(NC);
      auto run = [&] {
        mc::layernorm_forward(dev(d_ln), d_mean.get(), d_rstd.get(), fused ? d_out_res.get() : nullptr, d_res.get(),
                              fused ? dev(d_branch) : nullptr, d_w.get(), with_bias ? d_b.get() : nullptr, N, C, eps, nullptr);
        return std::tuple{d_ln.download(), d_mean.download(), d_rstd.download(), d_out_res.download()};
      };
      const auto [ln1, mean1, rstd1, r1] = run();
      const auto [ln2, mean2, rstd2, r2] = run();
      EXPECT_TRUE(bitwise_equal(ln1, ln2) && bitwise_equal(mean1, mean2) && bitwise_equal(rstd1, rstd2)) << "not deterministic";

      // Exact LayerNorm input r (FP64 sum of an FP32 and a BF16 value).
      std::vector<double> r = widen(res);
      if (fused) {
        const auto br = widen(branch);
        for (std::size_t i = 0; i < NC; ++i) r[i] += br[i];
      }
      const auto w64 = widen(w), b64 = widen(b);
      std::vector<double> ref(NC), ref_mean(N), ref_rstd(N);
      layers::layernorm_forward<double>(ref.data(), ref_mean.data(), ref_rstd.data(), r.data(), w64.data(),
                                        with_bias ? b64.data() : nullptr, N, C, double(eps));
      if (fused) {
        // residual_out: one correctly rounded FP32 addition: |err| <= u |r|.
        std::vector<double> bound(NC);
        for (std::size_t i = 0; i < NC; ++i) bound[i] = u * std::fabs(r[i]);
        EXPECT_TRUE(within(widen(r1), r, bound, "residual_out"));
        EXPECT_TRUE(d_out_res.guards_intact());
      }
      // Error budget per row, M = max|r| (first order):
      //   r: |dr| <= u M (the fused add; 0 otherwise, bounded the same);
      //   mean = fl(sum r)/C: |dm| <= u M + (C - 1) u M + u M <= (C + 2) u M;
      //   d = fl(r - m), |d| <= 2M: |dd| <= |dr| + |dm| + u |d| <= (C + 5) u M;
      //   var = fl(sum d^2)/C: per term 2|d||dd| + u d^2 <= 4(C + 5) u M^2 + 4 u M^2, the sum
      //     (C - 1) u * 4 M^2 after /C, the division u * 4 M^2: |dvar| <= 8 (C + 3) u M^2;
      //   rstd = 1/sqrt(var + eps): relative |ds|/s <= |dvar| / (2 (var + eps)) + 4u (+eps, sqrt, /, /C);
      //   y = fl(fl(d s) w) + b: |dy| <= |w| (s |dd| + |d| s rel_s + u |d s|) + u |d s w| + u |y|.
      // ln_out is BF16(y): bf16_bound. mean and rstd (FP32) are checked against |dm| and s rel_s.
      std::vector<double> b_ln(NC), b_mean(N), b_rstd(N);
      for (int n = 0; n < N; ++n) {
        double M = 0;
        for (int c = 0; c < C; ++c) M = std::max(M, std::fabs(r[std::size_t(n) * C + c]));
        const double dm = (C + 2) * u * M, dd = (C + 5) * u * M, dvar = 8.0 * (C + 3) * u * M * M;
        const double s_ref = ref_rstd[n], var = 1.0 / (s_ref * s_ref) - eps;
        const double rel_s = dvar / (2.0 * (var + eps)) + 4 * u;
        b_mean[n] = dm;
        b_rstd[n] = s_ref * rel_s;
        for (int c = 0; c < C; ++c) {
          const std::size_t i = std::size_t(n) * C + c;
          const double d = r[i] - ref_mean[n], ds = std::fabs(d * s_ref), aw = std::fabs(w64[c]);
          const double dy = aw * (s_ref * dd + ds * rel_s + u * ds) + u * ds * aw + u * std::fabs(ref[i]);
          b_ln[i] = bf16_bound(ref[i], dy);
        }
      }
      EXPECT_TRUE(within(widen(ln1), ref, b_ln, "ln_out"));
      EXPECT_TRUE(within(widen(mean1), ref_mean, b_mean, "mean"));
      EXPECT_TRUE(within(widen(rstd1), ref_rstd, b_rstd, "rstd"));
      EXPECT_TRUE(d_ln.guards_intact() && d_mean.guards_intact() && d_rstd.guards_intact());
    }
  }
}

TEST(LayerNormGpu, BackwardMatchesCpuAndIsDeterministic) {
  SF_REQUIRE_GPU();
  // kOddShapes, then widths that pick every instance of the one-pass kernel (16-byte path with
  // 1..4 chunks of 256 columns per row; scalar path (C % 8 != 0) with 1, 8 and 24 chunks of 32)
  // and the two-kernel path for rows wider than 1024, over several 64-row partitions.
  std::vector<Shape> shapes(std::begin(kOddShapes), std::end(kOddShapes));
  for (const Shape s : {Shape{200, 512}, Shape{130, 1024}, Shape{129, 100}, Shape{65, 700}, Shape{70, 1032}, Shape{3, 2052},
                        Shape{64, 768}, Shape{128, 256}})
    shapes.push_back(s);
  int variant = 0;
  for (const Shape s : shapes) {
    ++variant;
    const bool with_dbias = variant % 3 != 0, with_bf16 = variant % 2 == 1;
    const int N = s.N, C = s.C;
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C) + " dbias=" + std::to_string(with_dbias) +
                 " dx_bf16=" + std::to_string(with_bf16));
    SplitMix64 rng(31, variant);
    const std::size_t NC = std::size_t(N) * C;
    const auto x = normal_f32(rng, NC, 1.3, -0.4);
    const auto g = normal_bf16(rng, NC, 0.5);  // d_ln: a BF16 product's output
    const auto w = normal_f32(rng, C, 0.1, 1.0);
    const auto dx0 = normal_f32(rng, NC, 0.3);  // nonzero: dx, dweight, dbias accumulate
    const auto dw0 = normal_f32(rng, C, 0.3);
    const auto db0 = normal_f32(rng, C, 0.3);
    // mean and rstd are inputs: the FP64 statistics rounded to FP32 (the reference uses the same values).
    std::vector<float> mean(N), rstd(N);
    {
      const auto x64 = widen(x);
      std::vector<double> ones(C, 1.0), tmp(NC), m64(N), s64(N);
      layers::layernorm_forward<double>(tmp.data(), m64.data(), s64.data(), x64.data(), ones.data(), nullptr, N, C, 1e-5);
      for (int n = 0; n < N; ++n) mean[n] = float(m64[n]), rstd[n] = float(s64[n]);
    }
    Buf<float> d_x(x), d_w(w), d_mean(mean), d_rstd(rstd), d_dx(dx0), d_dw(dw0), d_db(db0);
    Buf<bf16> d_g(g), d_dx16(NC);
    Buf<float> scratch(std::size_t(mc::reduction_scratch_floats(N, C)));  // exactly the promised size: guards catch overruns
    auto run = [&] {
      d_dx.upload(dx0), d_dw.upload(dw0), d_db.upload(db0);
      mc::layernorm_backward(d_dx.get(), with_bf16 ? dev(d_dx16) : nullptr, d_dw.get(), with_dbias ? d_db.get() : nullptr,
                             dev(d_g), d_x.get(), d_w.get(), d_mean.get(), d_rstd.get(), N, C, scratch.get(), nullptr);
      return std::tuple{d_dx.download(), d_dw.download(), d_db.download(), d_dx16.download()};
    };
    const auto [dx1, dw1, db1, dx16_1] = run();
    const auto [dx2, dw2, db2, dx16_2] = run();
    EXPECT_TRUE(bitwise_equal(dx1, dx2) && bitwise_equal(dw1, dw2) && bitwise_equal(db1, db2)) << "not deterministic";

    const auto x64 = widen(x), g64 = widen(g), w64 = widen(w), m64 = widen(mean), s64 = widen(rstd);
    auto ref_dx = widen(dx0), ref_dw = widen(dw0), ref_db = widen(db0);
    layers::layernorm_backward<double>(ref_dx.data(), ref_dw.data(), ref_db.data(), g64.data(), x64.data(), w64.data(),
                                       m64.data(), s64.data(), N, C);
    // dx, per row (s = rstd, norm_c = (x_c - mean) s exact, G = max|w g|, Nm = max|norm|,
    // mdn = mean(w g), mdnn = mean(w g norm), T_c = |w g| + |mdn| + |norm_c mdnn|), first order:
    //   GPU norm = fl(fl(x - m) s): relative 2u; fl(w g): u;
    //   mean_dnorm: C terms summed, /C: |e| <= (C + 1) u G;
    //   mean_dnorm_norm: terms carry 4u, the sum (C - 1) u, /C u: |e| <= (C + 4) u G Nm;
    //   expr = w g - mdn - norm mdnn: |e| <= (C + 1) u G + (C + 4) u G Nm^2 + 6 u T_c
    //     (u|wg|, 2u|norm mdnn| from norm and the product, two subtractions 2u T_c);
    //   dx = dx0 + fl(expr s): + u s T_c + u (|dx0| + s T_c).
    std::vector<double> b_dx(NC);
    for (int n = 0; n < N; ++n) {
      const double sr = s64[n];
      double G = 0, Nm = 0, mdn = 0, mdnn = 0;
      for (int c = 0; c < C; ++c) {
        const std::size_t i = std::size_t(n) * C + c;
        const double wg = w64[c] * g64[i], norm = (x64[i] - m64[n]) * sr;
        G = std::max(G, std::fabs(wg)), Nm = std::max(Nm, std::fabs(norm));
        mdn += wg / C, mdnn += wg * norm / C;
      }
      for (int c = 0; c < C; ++c) {
        const std::size_t i = std::size_t(n) * C + c;
        const double norm = (x64[i] - m64[n]) * sr;
        const double T = std::fabs(w64[c] * g64[i]) + std::fabs(mdn) + std::fabs(norm * mdnn);
        b_dx[i] = sr * ((C + 1) * u * G + (C + 4) * u * G * Nm * Nm + 6 * u * T) + u * sr * T +
                  u * (std::fabs(dx0[i]) + sr * T);
      }
    }
    EXPECT_TRUE(within(widen(dx1), ref_dx, b_dx, "dx"));
    // dweight: terms fl(fl(fl(x - m) s) g) carry 3u, N + 1 terms with dweight0 summed in a fixed
    // tree (each path at most N additions): |e| <= (N + 3) u (|dw0| + sum|terms|). dbias: (N + 1) u.
    std::vector<double> b_dw(C), b_db(C);
    for (int c = 0; c < C; ++c) {
      double aw = std::fabs(dw0[c]), ab = std::fabs(db0[c]);
      for (int n = 0; n < N; ++n) {
        const std::size_t i = std::size_t(n) * C + c;
        aw += std::fabs((x64[i] - m64[n]) * s64[n] * g64[i]);
        ab += std::fabs(g64[i]);
      }
      b_dw[c] = (N + 3) * u * aw, b_db[c] = (N + 1) * u * ab;
    }
    EXPECT_TRUE(within(widen(dw1), ref_dw, b_dw, "dweight"));
    if (with_dbias) {
      EXPECT_TRUE(within(widen(db1), ref_db, b_db, "dbias"));
    } else {
      EXPECT_TRUE(bitwise_equal(db1, db0)) << "dbias written although null was passed";
    }
    if (with_bf16) {
      // dx_bf16 is BF16 of the very FP32 dx the kernel stored: exact, round to nearest even.
      std::vector<bf16> expect(NC);
      for (std::size_t i = 0; i < NC; ++i) expect[i] = bf16::from_float(dx1[i]);
      EXPECT_TRUE(bitwise_equal(dx16_1, expect)) << "dx_bf16 != BF16(dx)";
      EXPECT_TRUE(d_dx16.guards_intact());
    }
    EXPECT_TRUE(d_dx.guards_intact() && d_dw.guards_intact() && d_db.guards_intact());
    EXPECT_TRUE(scratch.guards_intact()) << "scratch overrun: reduction_scratch_floats too small";
  }
}

// ---------------------------------------------------------------------------------------------

TEST(BiasBackwardGpu, MatchesCpuAndIsDeterministic) {
  SF_REQUIRE_GPU();
  for (const Shape s : {Shape{1, 4}, Shape{17, 20}, Shape{97, 768}, Shape{300, 2304}, Shape{129, 3}}) {
    const int N = s.N, C = s.C;
    SCOPED_TRACE("N=" + std::to_string(N) + " C=" + std::to_string(C));
    SplitMix64 rng(41, N * 10000 + C);
    const auto d_out = normal_bf16(rng, std::size_t(N) * C, 1.0);
    const auto db0 = normal_f32(rng, C, 0.5);
    Buf<bf16> d_d(d_out);
    Buf<float> d_db(db0), scratch(std::size_t(mc::reduction_scratch_floats(N, C)));
    auto run = [&] {
      d_db.upload(db0);
      mc::bias_backward(d_db.get(), dev(d_d), N, C, scratch.get(), nullptr);
      return d_db.download();
    };
    const auto db1 = run(), db2 = run();
    EXPECT_TRUE(bitwise_equal(db1, db2)) << "not deterministic";
    // N + 1 exact (BF16 widened) terms in a fixed tree with every path at most N additions:
    // |e| <= N u (|db0| + sum|terms|); (N + 1) u used.
    const auto g = widen(d_out);
    std::vector<double> ref(C), bound(C);
    for (int c = 0; c < C; ++c) {
      double sum = db0[c], abs_sum = std::fabs(db0[c]);
      for (int n = 0; n < N; ++n) sum += g[std::size_t(n) * C + c], abs_sum += std::fabs(g[std::size_t(n) * C + c]);
      ref[c] = sum, bound[c] = (N + 1) * u * abs_sum;
    }
    EXPECT_TRUE(within(widen(db1), ref, bound, "dbias"));
    EXPECT_TRUE(d_db.guards_intact() && scratch.guards_intact());
  }
}

// ---------------------------------------------------------------------------------------------

TEST(CastGpu, RoundsToNearestEven) {
  SF_REQUIRE_GPU();
  for (const std::size_t n : {std::size_t(1), std::size_t(17), std::size_t(1003), std::size_t(4096)}) {
    for (const std::size_t offset : {std::size_t(0), std::size_t(3)}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(offset));
      SplitMix64 rng(61, n + offset);
      auto f = normal_f32(rng, n + offset, 3.0);
      // Ties (1 + 2^-8 rounds down to even, 1 + 3 * 2^-8 up), overflow to inf, subnormals, zeros.
      const float special[] = {1.0f + 0x1.0p-8f, 1.0f + 0x3.0p-8f, -0.0f, 3.4e38f, -3.4e38f,
                               std::numeric_limits<float>::infinity(), 1e-40f, -1e-45f, 0x1.fefffep127f};
      for (std::size_t i = 0; i < std::min(n, std::size(special)); ++i) f[offset + i] = special[i];
      Buf<float> d_f(f);
      Buf<bf16> d_h(n + offset);
      mc::cast_to_bf16(dev(d_h) + offset, d_f.get() + offset, std::int64_t(n), nullptr);
      const auto h = d_h.download();
      // Round to nearest even is one exact function: the GPU must match the bit-exact host BF16.
      for (std::size_t i = offset; i < n + offset; ++i)
        ASSERT_EQ(h[i].bits, bf16::from_float(f[i]).bits) << "cast_to_bf16 at " << i << " of " << f[i];
      EXPECT_TRUE(d_h.guards_intact());
    }
  }
}

// ---------------------------------------------------------------------------------------------

struct CeCase {
  int rows, Vp;
  float grad_scale;
  double logit_scale;
  int masked_tail;        // trailing logits set to -inf (never the target)
  int masked_stride = 0;  // if > 0, also every masked_stride-th logit -inf (never the target)
};

// Rows with Vp % 8 == 0 up to 57,344 logits take the cluster kernel: a row over 8 CTAs of 128
// threads, thread t of CTA k holding chunk j 1024 + 128 k + t of 8 logits in round j (7 rounds).
// Longer rows take the two-pass vector kernel, odd Vp the scalar one.
TEST(SoftmaxCrossEntropyGpu, MatchesCpuAndIsDeterministic) {
  SF_REQUIRE_GPU();
  const CeCase cases[] = {
      {3, 50304, 0.37f / 3, 1.0, 0},   // GPT-2 padded vocabulary; last round 144 chunks: CTA 0, 16 threads of CTA 1
      {2, 65544, 0.5f, 1.0, 0},        // wider than the cluster kernel's 57,344: the two-pass vector path
      {17, 97, 1.0f / 17, 2.0, 0},     // odd Vp: scalar path
      {1, 1000, 1.0f, 3.0, 0},         // 125 chunks: part of CTA 0 only, the other 7 CTAs empty
      {4, 50304, 1024.0f / 4, 8.0, 0}, // large logits, loss-scale-like gradient scale
      {5, 104, 0.2f, 1.0, 17},         // -inf tail: whole masked chunks
      {2, 50304, 0.0f, 1.0, 0},        // loss only: logits untouched
      // More rows than SMs (132 on the H200) and than clusters resident at once.
      {300, 50304, 0.37f / 300, 1.0, 0},
      {300, 65536, 0.5f / 300, 2.0, 8},  // two-pass vector path; a masked last chunk
      {300, 50304, 0.0f, 1.0, 0},        // loss only
      // The cluster kernel's edges.
      {7, 8, 0.5f, 1.0, 0},               // one chunk: thread 0 of CTA 0 holds the row, 1,023 threads nothing
      {13, 52520, 0.3f / 13, 2.0, 0},     // last round ends inside CTA 3 (37 threads: warp 1 partly)
      {9, 8192, 0.25f, 1.0, 7168},        // one round; CTAs 1-7 see only -inf (empty (max, sum) partials)
      {301, 57344, 0.1f / 301, 1.0, 3001},  // the widest row (7 full rounds); a partly masked chunk
      {11, 50304, 0.7f / 11, 4.0, 0, 3},  // every third logit -inf: -inf inside every chunk
  };
  for (const CeCase k : cases) {
    SCOPED_TRACE("rows=" + std::to_string(k.rows) + " Vp=" + std::to_string(k.Vp) + " scale=" + std::to_string(k.grad_scale));
    SplitMix64 rng(71, k.rows * 100000 + k.Vp);
    const std::size_t RV = std::size_t(k.rows) * k.Vp;
    auto logits = normal_bf16(rng, RV, k.logit_scale);
    std::vector<int> targets(k.rows);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < k.rows; ++r) {
      const int finite = k.Vp - k.masked_tail;
      // The last finite logit (with no tail: the row's last, in the cluster kernel's last slice),
      // the first, or anywhere.
      targets[r] = r % 3 == 0 ? finite - 1 : r % 3 == 1 ? int(rng.next() % std::uint64_t(finite)) : 0;
      for (int v = 0; v < k.Vp; ++v) {
        const bool masked = v >= finite || (k.masked_stride > 0 && v % k.masked_stride == k.masked_stride - 1);
        if (masked && v != targets[r]) logits[std::size_t(r) * k.Vp + v] = bf16::from_float(neg_inf);
      }
    }
    if (k.rows > 1) logits[std::size_t(1) * k.Vp + targets[1]] = bf16::from_float(40.0f);  // one dominant target
    Buf<bf16> d_logits(logits);
    Buf<float> d_losses(std::size_t(k.rows));
    Buf<int> d_targets(targets);
    auto run = [&] {
      d_logits.upload(logits);
      mc::softmax_cross_entropy(dev(d_logits), d_losses.get(), d_targets.get(), k.rows, k.Vp, k.grad_scale, nullptr);
      return std::pair{d_logits.download(), d_losses.download()};
    };
    const auto [g1, l1] = run();
    const auto [g2, l2] = run();
    EXPECT_TRUE(bitwise_equal(g1, g2) && bitwise_equal(l1, l2)) << "not deterministic";
    // A row's bits do not depend on the rows launched with it (nor on where its CTAs ran): the
    // first, a middle and the last row alone.
    for (const int r : {0, k.rows / 2, k.rows - 1}) {
      d_logits.upload(logits);
      const std::size_t row = std::size_t(r) * k.Vp;
      mc::softmax_cross_entropy(dev(d_logits) + row, d_losses.get() + r, d_targets.get() + r, 1, k.Vp, k.grad_scale, nullptr);
      const auto g = d_logits.download();
      const auto l = d_losses.download();
      const std::vector<bf16> g_row(g.begin() + row, g.begin() + row + k.Vp), g1_row(g1.begin() + row, g1.begin() + row + k.Vp);
      EXPECT_TRUE(bitwise_equal(g_row, g1_row) && bitwise_equal(std::vector<float>{l[r]}, std::vector<float>{l1[r]}))
          << "row " << r << " alone differs";
    }

    auto probs = widen(logits);
    std::vector<double> ref_loss(k.rows);
    layers::softmax_cross_entropy_forward<double>(probs.data(), ref_loss.data(), targets.data(), k.rows, k.Vp);
    auto ref_grad = probs;
    layers::softmax_cross_entropy_backward<double>(ref_grad.data(), targets.data(), k.rows, k.Vp, double(k.grad_scale) * k.rows);
    // Sum of exps S, relative error rel_S. A term exp(l - m) carries its exp's 4u (expf, and the
    // cluster kernel's ex2.approx, which is exp2f's instruction: 2 ulp) and the error of the rounded
    // exponents on its way to S. The two-pass kernel: expf(l - m') and rescales by expf(m' - m'') of
    // partial maxima, which telescope to at most 2u|l - m|, and per rescale 6u (expf 4u, product,
    // sum) at most ceil(Vp / 512) + 10 times after 8 terms a chunk. The cluster kernel: a thread's
    // terms 2^fl(fl(l - m_t) log2 e) with the FP32 log2 e 0.224u off (2.224u |l - m_t|) added in order
    // (at most 8 ceil(Vp / 8192) <= 56 of them, u each), then twice (warp, cluster) a rescale by
    // 2^fl(fl(m' - m'') log2 e) (2.224u |m' - m''|, exp 4u, product u) and 5 butterfly levels (u
    // each): in all 2.224u |l - m| and at most 4u + (56 + 2 (5 + 5))u, inside the two-pass count. Both:
    //   rel_S <= 4u + 2.25u avg_p|l - m| + 6u (ceil(Vp / 512) + 8 + 10) + Vp 2^-126,
    // the last term for the ex2's results below 2^-126 flushed to 0 (each term's or partial sum's
    // share of S, which is >= 1: the maximum's own term).
    // loss = fl(logf S - fl(l_t - m)): rel_S + 2u |log S| (1 ulp) + u |l_t - m| + u (|log S| + |l_t - m|).
    // grad = fl(gs fl(fl(exp(l - m) fl(1 / S)) - onehot)) (the cluster kernel: fl(exp(l - m) fl(gs fl(1 / S)))
    // off the target, the same number of roundings): p carries rel_p = rel_S + 6u + 2.25u |l - m| (the exp
    // 4u, 1 / S and the product u each) and, where the ex2 flushed, 2^-126 absolute;
    //   |e| <= |gs| (p rel_p + 2^-126 + 2u |p - onehot|); then BF16.
    std::vector<double> b_loss(k.rows), b_grad(RV);
    const double depth = std::ceil(k.Vp / 512.0) + 8 + 10;
    const double flushed = 0x1.0p-126;
    for (int r = 0; r < k.rows; ++r) {
      const std::size_t row = std::size_t(r) * k.Vp;
      double m = -INFINITY;
      for (int v = 0; v < k.Vp; ++v) m = std::max(m, double(logits[row + v].to_float()));
      double avg_gap = 0;
      for (int v = 0; v < k.Vp; ++v) {
        const double l = logits[row + v].to_float();
        if (std::isfinite(l)) avg_gap += probs[row + v] * (m - l);
      }
      const double rel_S = 4 * u + 2.25 * u * avg_gap + 6 * u * depth + k.Vp * flushed;
      const double log_S = ref_loss[r] + (double(logits[row + targets[r]].to_float()) - m);
      const double gap_t = m - logits[row + targets[r]].to_float();
      b_loss[r] = rel_S + 2 * u * std::fabs(log_S) + u * gap_t + u * (std::fabs(log_S) + gap_t);
      for (int v = 0; v < k.Vp; ++v) {
        const double l = logits[row + v].to_float(), p = probs[row + v];
        const double rel_p = rel_S + 6 * u + (std::isfinite(l) ? 2.25 * u * (m - l) : 0.0);
        const double onehot = v == targets[r] ? 1.0 : 0.0;
        const double e = std::fabs(k.grad_scale) * (p * rel_p + flushed + 2 * u * std::fabs(p - onehot));
        b_grad[row + v] = bf16_bound(ref_grad[row + v], e);
      }
    }
    EXPECT_TRUE(within(widen(l1), ref_loss, b_loss, "losses"));
    if (k.grad_scale == 0.0f) {
      EXPECT_TRUE(bitwise_equal(g1, logits)) << "grad_scale = 0 must leave the logits untouched";
    } else {
      EXPECT_TRUE(within(widen(g1), ref_grad, b_grad, "dlogits"));
    }
    EXPECT_TRUE(d_logits.guards_intact() && d_losses.guards_intact());
  }
}

// A row without a finite logit (the trainer never makes one) gives a NaN loss and a NaN gradient,
// as the CPU twin does (its maximum is -inf, exp(-inf - -inf) NaN), and leaves the other rows' bits
// as they are alone: in the cluster kernel every CTA of that row merges only empty (max, sum) pairs.
TEST(SoftmaxCrossEntropyGpu, RowWithoutFiniteLogitIsNaNAndAlone) {
  SF_REQUIRE_GPU();
  for (const int Vp : {50304, 65544, 97}) {  // the cluster, two-pass vector and scalar kernels
    SCOPED_TRACE("Vp=" + std::to_string(Vp));
    constexpr int rows = 3;
    const float grad_scale = 0.5f;
    SplitMix64 rng(73, std::uint64_t(Vp));
    auto logits = normal_bf16(rng, std::size_t(rows) * Vp, 1.0);
    for (int v = 0; v < Vp; ++v) logits[std::size_t(Vp) + v] = bf16::from_float(-std::numeric_limits<float>::infinity());
    const std::vector<int> targets = {5, 7, Vp - 1};
    auto probs = widen(logits);
    std::vector<double> ref_loss(rows);
    layers::softmax_cross_entropy_forward<double>(probs.data(), ref_loss.data(), targets.data(), rows, Vp);
    ASSERT_TRUE(std::isnan(ref_loss[1])) << "the CPU twin's all -inf row";

    Buf<bf16> d_logits(logits);
    Buf<float> d_losses(static_cast<std::size_t>(rows));
    Buf<int> d_targets(targets);
    mc::softmax_cross_entropy(dev(d_logits), d_losses.get(), d_targets.get(), rows, Vp, grad_scale, nullptr);
    const auto g = d_logits.download();
    const auto l = d_losses.download();
    EXPECT_TRUE(std::isnan(l[1])) << "loss " << l[1];
    int nan_grads = 0;
    for (int v = 0; v < Vp; ++v) nan_grads += std::isnan(g[std::size_t(Vp) + v].to_float()) ? 1 : 0;
    EXPECT_EQ(nan_grads, Vp);
    for (const int r : {0, 2}) {
      d_logits.upload(logits);
      const std::size_t row = std::size_t(r) * Vp;
      mc::softmax_cross_entropy(dev(d_logits) + row, d_losses.get() + r, d_targets.get() + r, 1, Vp, grad_scale, nullptr);
      const auto g_alone = d_logits.download();
      const auto l_alone = d_losses.download();
      EXPECT_TRUE(std::isfinite(l[r]) && bitwise_equal(std::vector<float>{l_alone[r]}, std::vector<float>{l[r]}) &&
                  bitwise_equal(std::vector<bf16>(g_alone.begin() + row, g_alone.begin() + row + Vp),
                                std::vector<bf16>(g.begin() + row, g.begin() + row + Vp)))
          << "row " << r << " differs from its launch alone";
    }
    EXPECT_TRUE(d_logits.guards_intact() && d_losses.guards_intact());
  }
}

// ---------------------------------------------------------------------------------------------

TEST(SumScaledGpu, MatchesFp64AndIsDeterministic) {
  SF_REQUIRE_GPU();
  for (const std::int64_t n : {std::int64_t(0), std::int64_t(1), std::int64_t(17), std::int64_t(16384), std::int64_t(100003)}) {
    for (const bool accumulate : {false, true}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " accumulate=" + std::to_string(accumulate));
      SplitMix64 rng(81, std::uint64_t(n) * 2 + accumulate);
      const auto values = normal_f32(rng, std::size_t(n), 2.0, 10.0);
      const float scale = 1.0f / 3.0f;
      // accumulate = false must ignore the old value, so it starts as NaN there.
      const float out0 = accumulate ? 5.5f : std::numeric_limits<float>::quiet_NaN();
      Buf<float> d_v(values), d_out(std::vector<float>{out0});
      auto run = [&] {
        d_out.upload({out0});
        mc::sum_scaled(d_out.get(), d_v.get(), n, scale, accumulate, nullptr);
        return d_out.download()[0];
      };
      const float o1 = run(), o2 = run();
      EXPECT_EQ(stableflash::float_to_bits(o1), stableflash::float_to_bits(o2)) << "not deterministic";
      double sum = 0, abs_sum = 0;
      for (float v : values) sum += v, abs_sum += std::fabs(v);
      const double base = accumulate ? out0 : 0.0;
      const double ref = base + double(scale) * sum;
      // The sum of n values errs by (n - 1) u sum|v|, the product by u, the final add by u:
      // |e| <= (n + 1) u (|out0| + |scale| sum|v|).
      const double bound = (n + 1) * u * (std::fabs(base) + std::fabs(scale) * abs_sum);
      EXPECT_TRUE(within({double(o1)}, {ref}, {bound}, "sum_scaled"));
      EXPECT_TRUE(d_out.guards_intact());
    }
  }
}

}  // namespace
