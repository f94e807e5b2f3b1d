// The attention probes on a capture (see attention_probes.hpp).
#include "stableflash/diag/attention_probes.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "stableflash/attention/rounding_points.hpp"
#include "stableflash/attention/shift_policies.hpp"

namespace stableflash::diag {
namespace {

using attention::Numerics;

// The FP32 dot product as the CPU oracle defines it (FP64 sum rounded once, attention/cpu_kernels_common.hpp).
float dot_fp32(const bf16* a, const bf16* b, int n) {
  double s = 0.0;
  for (int d = 0; d < n; ++d) s += double(a[d].to_float()) * double(b[d].to_float());
  return static_cast<float>(s);
}

// Row (b, i) of head h in [B, T, H, D].
struct Bthd {
  int len, heads, dim;
  std::size_t at(int b, int h, int i) const { return ((std::size_t(b) * len + std::size_t(i)) * heads + std::size_t(h)) * dim; }
};

// Scores of query row i against keys [0, last] as the layer's numerics round them.
void row_scores(const model::LayerCapture& c, const Bthd& t, int b, int h, int i, int last, std::vector<float>& s) {
  const auto& o = c.options;
  const float scale = o.resolved_scale(c.shape.head_dim);
  const int kvh = c.shape.kv_head_of(h);
  const Bthd tk{c.shape.k_len, c.shape.resolved_kv_heads(), c.shape.head_dim};
  s.resize(std::size_t(last) + 1);
  for (int j = 0; j <= last; ++j) {
    const float dot = dot_fp32(c.q.data() + t.at(b, h, i), c.k.data() + tk.at(b, kvh, j), c.shape.head_dim);
    s[std::size_t(j)] = o.numerics == Numerics::paper ? attention::paper::score(dot, scale) : attention::fused::score(dot, scale);
  }
}

template <class Policy>
void add_row(const Policy& policy, const model::LayerCapture& c, const std::vector<float>& s, int b, int h, int i, float lse,
             HeadRowStats& st) {
  const auto& o = c.options;
  const bool paper = o.numerics == Numerics::paper;
  const auto prec = paper ? attention::ShiftPrecision::bf16 : attention::ShiftPrecision::fp32;
  const int n = int(s.size()), bc = o.resolved_tile_k();
  const float row_max = *std::max_element(s.begin(), s.end());
  st.max_logit = st.rows == 0 ? row_max : std::max(st.max_logit, double(row_max));
  ++st.rows;
  st.repeated_max_rows += std::count(s.begin(), s.end(), row_max) >= 2;
  // The online softmax's running shift, tile by tile, as cpu_forward.cpp walks it.
  const attention::RowId row{std::uint32_t(b), std::uint32_t(h), std::uint32_t(i)};
  float m = -std::numeric_limits<float>::infinity();
  bool tie_event = false;
  for (int j0 = 0; j0 < n; j0 += bc) {
    const int j1 = std::min(n, j0 + bc);
    const float r_m = *std::max_element(s.begin() + j0, s.begin() + j1);
    int near = 0;
    if constexpr (Policy::needs_near_max_count) {
      const float threshold = policy.near_max_threshold(r_m, prec);
      near = int(std::count_if(s.begin() + j0, s.begin() + j1, [&](float x) { return x >= threshold; }));
    }
    m = std::max(m, policy.choose(r_m, near, row, prec).m);
    int ones = 0;
    for (int j = j0; j < j1; ++j) {
      const float p = paper ? attention::paper::pbar_operand(attention::paper::pbar(s[std::size_t(j)], m))
                            : attention::fused::pbar_operand(attention::fused::pbar(s[std::size_t(j)], m));
      ones += p == 1.0f;
    }
    st.pbar_ones += ones;
    tie_event |= ones >= 2;
  }
  st.tie_event_rows += tie_event;
  st.top_mass += std::exp(double(row_max) - double(lse));
}

}  // namespace

std::vector<int> sampled_rows(int len, int count) {
  std::vector<int> rows;
  if (count >= len) {
    for (int i = 0; i < len; ++i) rows.push_back(i);
    return rows;
  }
  for (int k = 0; k < count; ++k) rows.push_back(int((std::int64_t(k) + 1) * len / count) - 1);
  return rows;
}

std::vector<HeadRowStats> attention_row_stats(const model::LayerCapture& c, const std::vector<int>& rows) {
  const auto& sh = c.shape;
  const Bthd t{sh.q_len, sh.heads, sh.head_dim};
  std::vector<HeadRowStats> out(std::size_t(sh.heads));
  // Threads only for enough work (about rows x keys / 2 x D multiply-adds per head and sequence).
  const std::int64_t work = std::int64_t(sh.heads) * sh.batch * std::int64_t(rows.size()) * sh.k_len * sh.head_dim;
#pragma omp parallel for schedule(dynamic) if (work >= (std::int64_t(1) << 22))
  for (int h = 0; h < sh.heads; ++h) {
    std::vector<float> s;
    HeadRowStats& st = out[std::size_t(h)];
    for (int b = 0; b < sh.batch; ++b)
      for (int i : rows) {
        const int last = attention::last_visible_key(i, sh.q_len, sh.k_len, c.options.causal);
        if (last < 0) continue;
        row_scores(c, t, b, h, i, last, s);
        const float lse = c.lse[(std::size_t(b) * sh.heads + std::size_t(h)) * sh.q_len + std::size_t(i)];
        attention::with_shift_policy(c.options.policy, c.options.policy_params,
                                     [&](const auto& policy) { add_row(policy, c, s, b, h, i, lse, st); });
      }
    if (st.rows > 0) st.top_mass /= double(st.rows);
  }
  return out;
}

DeltaShadow delta_shadow(const model::LayerCapture& c) {
  const auto& sh = c.shape;
  attention::BackwardArgs a;
  a.shape = sh;
  a.layout = attention::Layout::bthd;
  a.q = c.q.data(), a.k = c.k.data(), a.v = c.v.data(), a.o = c.o.data(), a.lse = c.lse.data();
  a.o_residual = c.o_residual.data(), a.d_o = c.d_o.data();
  if (c.d_o.size() != c.o.size()) throw std::logic_error("delta_shadow: the capture holds no dO (its backward did not run)");
  std::vector<float> used(std::size_t(sh.rows()));
  attention::AttentionOptions opt = c.options;
  opt.device = attention::Device::cpu;
  attention::attention_delta(a, opt, used.data());
  DeltaShadow out;
  out.heads.assign(std::size_t(sh.heads), 0.0);
  const Bthd t{sh.q_len, sh.heads, sh.head_dim};
  for (int b = 0; b < sh.batch; ++b)
    for (int h = 0; h < sh.heads; ++h)
      for (int i = 0; i < sh.q_len; ++i) {
        if (attention::last_visible_key(i, sh.q_len, sh.k_len, opt.causal) < 0) continue;
        const std::size_t at = t.at(b, h, i);
        double fp32_output_delta = 0.0;
        for (int d = 0; d < sh.head_dim; ++d)
          fp32_output_delta += double(c.d_o[at + d].to_float()) * (double(c.o[at + d].to_float()) + double(c.o_residual[at + d].to_float()));
        const double e = double(used[(std::size_t(b) * sh.heads + std::size_t(h)) * sh.q_len + std::size_t(i)]) - fp32_output_delta;
        out.heads[std::size_t(h)] += e;
        ++out.rows;
      }
  for (double x : out.heads) out.sum += x;
  return out;
}

std::vector<double> rank1_similarity(const model::LayerCapture& c, const std::vector<int>& rows) {
  const auto& sh = c.shape;
  const int C = int(c.x.size() / (std::size_t(sh.batch) * sh.q_len));
  const Bthd t{sh.q_len, sh.heads, sh.head_dim};
  // The sampled tokens (b, i) and the cosines of their X rows, shared by every head.
  struct Token {
    int b, i;
  };
  std::vector<Token> tokens;
  for (int b = 0; b < sh.batch; ++b)
    for (int i : rows)
      if (attention::last_visible_key(i, sh.q_len, sh.k_len, c.options.causal) >= 0) tokens.push_back({b, i});
  const std::size_t n = tokens.size();
  std::vector<double> x_cos(n * n, 0.0), x_norm(n, 0.0);
  auto x_row = [&](const Token& k) { return c.x.data() + (std::size_t(k.b) * sh.q_len + std::size_t(k.i)) * std::size_t(C); };
  for (std::size_t a = 0; a < n; ++a) {
    double s = 0;
    for (int d = 0; d < C; ++d) s += double(x_row(tokens[a])[d]) * double(x_row(tokens[a])[d]);
    x_norm[a] = std::sqrt(s);
  }
  for (std::size_t a = 0; a < n; ++a)
    for (std::size_t z = a + 1; z < n; ++z) {
      double s = 0;
      for (int d = 0; d < C; ++d) s += double(x_row(tokens[a])[d]) * double(x_row(tokens[z])[d]);
      x_cos[a * n + z] = x_norm[a] > 0 && x_norm[z] > 0 ? s / (x_norm[a] * x_norm[z]) : std::nan("");
    }
  std::vector<double> out(std::size_t(sh.heads), std::nan(""));
  const std::int64_t work = std::int64_t(sh.heads) * std::int64_t(n) * sh.k_len * sh.head_dim;
#pragma omp parallel for schedule(dynamic) if (work >= (std::int64_t(1) << 22))
  for (int h = 0; h < sh.heads; ++h) {
    const int D = sh.head_dim, kvh = sh.kv_head_of(h);
    const Bthd tk{sh.k_len, sh.resolved_kv_heads(), D};
    std::vector<double> pk(n * std::size_t(D), 0.0), pk_norm(n, 0.0);
    std::vector<float> s;
    for (std::size_t a = 0; a < n; ++a) {
      const auto [b, i] = tokens[a];
      const int last = attention::last_visible_key(i, sh.q_len, sh.k_len, c.options.causal);
      row_scores(c, t, b, h, i, last, s);
      // exp(S - max S): P up to a positive factor, which the cosine ignores. Not exp(S - lse): a
      // kernel's lse can be far from the row's scores (the published rule's shift past |r_m| ~ 60
      // collapses rows; docs/numerics-findings.md), and PK then sinks into subnormals whose
      // cosines are noise (seen above 1).
      const double row_max = double(*std::max_element(s.begin(), s.end()));
      for (int j = 0; j <= last; ++j) {
        const double p = std::exp(double(s[std::size_t(j)]) - row_max);
        const bf16* kj = c.k.data() + tk.at(b, kvh, j);
        for (int d = 0; d < D; ++d) pk[a * D + d] += p * double(kj[d].to_float());
      }
      double q2 = 0;
      for (int d = 0; d < D; ++d) q2 += pk[a * D + d] * pk[a * D + d];
      pk_norm[a] = std::sqrt(q2);
    }
    double sum = 0;
    std::int64_t pairs = 0;
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t z = a + 1; z < n; ++z) {
        if (!(pk_norm[a] > 0 && pk_norm[z] > 0) || std::isnan(x_cos[a * n + z])) continue;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += pk[a * D + d] * pk[z * D + d];
        sum += x_cos[a * n + z] * dot / (pk_norm[a] * pk_norm[z]);
        ++pairs;
      }
    if (pairs > 0) out[std::size_t(h)] = sum / double(pairs);
  }
  return out;
}

}  // namespace stableflash::diag
