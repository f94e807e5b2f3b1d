// `paper` numerics against its own definition: an independent, deliberately plain step-by-step
// emulation of docs/numerics-contract.md ("Modes: paper", steps 1-7 and the backward), written from the text,
// materializing each key tile. The library must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "attention_test_util.hpp"

namespace stableflash::attention {
namespace {

float bf(float x) { return bf16::from_float(x).to_float(); }
float bf_bits(float x, int bits) { return round_to_bits_rne(x, bits); }

// FP32-dot: the exactly accumulated dot product rounded once to FP32 (the oracle's definition).
float fp32_dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return float(s);
}

// The shift m' of docs/numerics-contract.md / docs/paper.md for one tile row, written from the text.
float shift_from_text(ShiftPolicy policy, const std::vector<float>& s, float r_m, float beta, float eps, RowId row) {
  switch (policy) {
    case ShiftPolicy::standard: return r_m;
    case ShiftPolicy::paper: {
      int r_s = 0;
      const float threshold = bf(r_m - eps);  // BF16 tensor arithmetic in their code
      for (float x : s) r_s += x >= threshold;
      if (r_s > 1 && r_m > 0) return bf(beta * r_m);
      if (r_s > 1 && r_m < 0) return 0.0f;
      return r_m;
    }
    case ShiftPolicy::hashed_offset: {
      const float m = bf(r_m + hashed_row_offset(row));
      return m > r_m ? m : r_m;  // falls back to standard where BF16 m cannot hold the offset
    }
    case ShiftPolicy::fixed_offset: {
      const float m = bf(r_m + FixedOffsetShift::kOffset);
      return m > r_m ? m : r_m;
    }
  }
  return r_m;
}

struct PaperOut {
  std::vector<float> o, lse;
};

PaperOut emulate_paper_forward(const testing::Problem& p, const AttentionOptions& opt) {
  const AttentionShape& sh = p.shape;
  const int D = sh.head_dim, bc = opt.resolved_tile_k();
  const float scale = opt.resolved_scale(D);
  PaperOut out{std::vector<float>(p.q.size()), std::vector<float>(std::size_t(sh.rows()))};
  auto row_of = [&](const std::vector<bf16>& x, int b, int h, int t, int len) {
    std::vector<float> r(D);
    for (int d = 0; d < D; ++d) r[d] = x[((std::size_t(b) * sh.heads + h) * len + t) * D + d].to_float();
    return r;
  };
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads; ++h)
      for (int i = 0; i < sh.q_len; ++i) {
        const std::vector<float> qi = row_of(p.q, b, h, i, sh.q_len);
        const int last = opt.causal ? std::min(i + sh.k_len - sh.q_len, sh.k_len - 1) : sh.k_len - 1;
        const std::size_t row = (std::size_t(b) * sh.heads + h) * sh.q_len + i;
        float m = -std::numeric_limits<float>::infinity(), l = 0;
        std::vector<float> o(D, 0.0f);
        for (int j0 = 0; j0 <= last; j0 += bc) {  // tiles wholly masked for this row are skipped
          std::vector<float> s, vcols;
          std::vector<std::vector<float>> vt;
          for (int j = j0; j < std::min(j0 + bc, last + 1); ++j) {  // step 1 (masked keys never win)
            s.push_back(bf(bf(fp32_dot(qi, row_of(p.k, b, h, j, sh.k_len))) * scale));
            vt.push_back(row_of(p.v, b, h, j, sh.k_len));
          }
          float r_m = s[0];  // step 2
          for (float x : s) r_m = std::max(r_m, x);
          const float m_new = std::max(m, shift_from_text(opt.policy, s, r_m, opt.policy_params.beta, opt.policy_params.eps,
                                                          RowId{std::uint32_t(b), std::uint32_t(h), std::uint32_t(i)}));
          double l_sum = 0;  // steps 3-4
          std::vector<float> pb(s.size());
          for (std::size_t j = 0; j < s.size(); ++j) {
            const float pbar = std::exp(bf(s[j] - m_new));
            l_sum += pbar;
            pb[j] = bf(pbar);
          }
          const float l_tile = std::max(float(l_sum), 1e-10f);
          const float c = std::exp(bf(m - m_new));  // step 6
          for (int d = 0; d < D; ++d) {
            double acc = 0;  // step 5
            for (std::size_t j = 0; j < s.size(); ++j) acc += double(pb[j]) * vt[j][d];
            const float o_tile = bf_bits(float(acc), opt.round_bits);
            const float scaled = bf_bits(o[d] * c, opt.round_bits);
            o[d] = bf_bits(scaled + o_tile, opt.round_bits);
          }
          const float cl = c * l;
          l = bf(cl + l_tile);
          m = m_new;
        }
        for (int d = 0; d < D; ++d) out.o[row * D + d] = last < 0 ? 0.0f : bf_bits(o[d] / l, opt.round_bits);  // step 7
        out.lse[row] = last < 0 ? std::numeric_limits<float>::infinity() : std::log(l) + m;
      }
  return out;
}

struct PaperCase {
  int t, d, tile;
  bool causal;
  ShiftPolicy policy;
  int round_bits;
};

class PaperDefinition : public ::testing::TestWithParam<PaperCase> {};

TEST_P(PaperDefinition, ForwardEqualsTheStepByStepEmulationBitForBit) {
  const PaperCase c = GetParam();
  // q scaled so logits reach ~ +-20: tile maxima of both signs, ties after BF16 rounding of S
  const testing::Problem p({1, 2, c.t, c.t, c.d}, 500 + c.t, /*q_sigma=*/3.0);
  AttentionOptions opt;
  opt.numerics = Numerics::paper, opt.policy = c.policy, opt.causal = c.causal, opt.round_bits = c.round_bits;
  opt.tile_q = 16, opt.tile_k = c.tile;
  const testing::FlashRun r = testing::run_flash(p, opt, false);
  const PaperOut want = emulate_paper_forward(p, opt);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < r.o.size(); ++i) mismatches += float_to_bits(r.o[i].to_float()) != float_to_bits(want.o[i]);
  for (std::size_t i = 0; i < r.lse.size(); ++i) mismatches += float_to_bits(r.lse[i]) != float_to_bits(want.lse[i]);
  EXPECT_EQ(mismatches, 0u);
}

std::string name(const ::testing::TestParamInfo<PaperCase>& i) {
  const PaperCase& c = i.param;
  char buf[96];
  std::snprintf(buf, sizeof buf, "T%d_D%d_tile%d%s%s_bits%d", c.t, c.d, c.tile, c.causal ? "_causal_" : "_",
                std::string(to_string(c.policy)).c_str(), c.round_bits);
  return buf;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PaperDefinition,
    ::testing::Values(PaperCase{97, 64, 512, false, ShiftPolicy::standard, 7}, PaperCase{97, 64, 16, true, ShiftPolicy::standard, 7},
                      PaperCase{128, 128, 32, false, ShiftPolicy::paper, 7}, PaperCase{17, 64, 4, true, ShiftPolicy::paper, 7},
                      PaperCase{97, 64, 32, true, ShiftPolicy::hashed_offset, 7},
                      PaperCase{64, 64, 64, false, ShiftPolicy::fixed_offset, 7},
                      PaperCase{97, 64, 32, false, ShiftPolicy::standard, 3}, PaperCase{1, 64, 8, false, ShiftPolicy::paper, 7}),
    name);

// The backward of docs/numerics-contract.md: delta = BF16(FP32-rowsum(dO * O)); P = exp(S - lse);
// dP = BF16(FP32-dot(dO, v)); dS = P * (dP - delta) * scale in FP32; gradients from BF16(P),
// BF16(dS) with FP32 accumulation, rounded once.
TEST(PaperDefinition, BackwardEqualsTheStepByStepEmulationBitForBit) {
  const testing::Problem p({1, 1, 33, 33, 64}, 8, 3.0);
  AttentionOptions opt;
  opt.numerics = Numerics::paper, opt.causal = true, opt.tile_k = 8;
  const testing::FlashRun r = testing::run_flash(p, opt, true);
  const int T = 33, D = 64;
  const float scale = opt.resolved_scale(D);
  auto at = [&](const std::vector<bf16>& x, int t) {
    std::vector<float> row(D);
    for (int d = 0; d < D; ++d) row[d] = x[std::size_t(t) * D + d].to_float();
    return row;
  };
  std::vector<std::vector<float>> P(T, std::vector<float>(T, 0)), dS(T, std::vector<float>(T, 0));
  for (int i = 0; i < T; ++i) {
    double rs = 0;
    for (int d = 0; d < D; ++d) rs += double(p.d_o[i * D + d].to_float()) * r.o[i * D + d].to_float();
    const float delta = bf(float(rs));
    ASSERT_EQ(float_to_bits(delta), float_to_bits(r.delta[i]));
    for (int j = 0; j <= i; ++j) {
      const float s = bf(bf(fp32_dot(at(p.q, i), at(p.k, j))) * scale);
      const float pij = std::exp(s - r.lse[i]);
      const float dp = bf(fp32_dot(at(p.d_o, i), at(p.v, j)));
      const float t1 = pij * (dp - delta);
      P[i][j] = bf(pij);
      dS[i][j] = bf(t1 * scale);
    }
  }
  std::size_t mismatches = 0;
  for (int i = 0; i < T; ++i)
    for (int d = 0; d < D; ++d) {
      double dq = 0, dk = 0, dv = 0;
      for (int j = 0; j < T; ++j) {
        dq += double(dS[i][j]) * p.k[j * D + d].to_float();
        dk += double(dS[j][i]) * p.q[j * D + d].to_float();
        dv += double(P[j][i]) * p.d_o[j * D + d].to_float();
      }
      mismatches += r.dq[i * D + d].bits != bf16::from_float(float(dq)).bits;
      mismatches += r.dk[i * D + d].bits != bf16::from_float(float(dk)).bits;
      mismatches += r.dv[i * D + d].bits != bf16::from_float(float(dv)).bits;
    }
  EXPECT_EQ(mismatches, 0u);
}

}  // namespace
}  // namespace stableflash::attention
