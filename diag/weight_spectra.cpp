// Spectral norms of every weight matrix and of the attention heads (see weight_spectra.hpp).
#include "stableflash/diag/weight_spectra.hpp"

#include <algorithm>
#include <numeric>
#include <cstdio>
#include <stdexcept>

#include "stableflash/diag/spectral.hpp"

namespace stableflash::diag {
namespace {

// At most this many rounds the first time (cold start), fewer after (warm start from the last
// probe). W_Q (the paper's indicator, every probe) converges to 1e-6 within them; every matrix
// (scope `all`) gets a few rounds a probe: its large, nearly random matrices (wte) have sigma_2
// close to sigma_1 and would take the whole cap every time, so their iteration continues across
// probes instead (estimates from below that tighten as the run goes).
struct Rounds {
  int cold, warm;
};
constexpr Rounds kWqRounds{200, 50}, kAllRounds{50, 4};

std::string short_name(const std::string& hf) {  // "transformer.h.0.attn.c_attn.weight" -> "h.0.attn.c_attn"
  std::string s = hf;
  if (s.starts_with("transformer.")) s = s.substr(12);
  if (s.ends_with(".weight")) s = s.substr(0, s.size() - 7);
  return s;
}

// The layer-attention views: per layer W_Q (and with `kv_and_o`, W_K, W_V), then their heads'.
void attention_views(const model::Gpt2Config& c, std::int64_t c_attn, std::int64_t c_proj, int l, bool kv_and_o,
                     std::vector<MatrixView>& out) {
  const int C = c.n_embd, D = c.head_dim();
  const std::string p = "h." + std::to_string(l) + ".";
  const char* names[3] = {"wq", "wk", "wv"};
  for (int j = 0; j < (kv_and_o ? 3 : 1); ++j) {
    out.push_back({p + names[j], c_attn + std::int64_t(j) * C, C, C, 3 * std::int64_t(C)});
    for (int h = 0; h < c.n_head; ++h)
      out.push_back({p + names[j] + ".head." + std::to_string(h), c_attn + std::int64_t(j) * C + std::int64_t(h) * D, C, D, 3 * std::int64_t(C)});
  }
  if (kv_and_o)
    for (int h = 0; h < c.n_head; ++h)
      out.push_back({p + "wo.head." + std::to_string(h), c_proj + std::int64_t(h) * D * C, D, C, C});
}

}  // namespace

WeightSpectra::WeightSpectra(const model::Gpt2Config& config, double tolerance)
    : tolerance_(tolerance), layers_(config.n_layer), heads_(config.n_head) {
  const auto layout = model::parameter_layout(config);
  std::vector<std::int64_t> c_attn(std::size_t(config.n_layer), -1), c_proj(std::size_t(config.n_layer), -1);
  for (const auto& t : layout) {
    if (!t.is_2d()) continue;
    all_views_.push_back({short_name(t.name), t.offset, int(t.shape[0]), int(t.shape[1]), t.shape[1]});
    for (int l = 0; l < config.n_layer; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      if (t.name == p + "attn.c_attn.weight") c_attn[std::size_t(l)] = t.offset;
      if (t.name == p + "attn.c_proj.weight") c_proj[std::size_t(l)] = t.offset;
    }
  }
  for (int l = 0; l < config.n_layer; ++l) {
    attention_views(config, c_attn[std::size_t(l)], c_proj[std::size_t(l)], l, /*kv_and_o=*/false, wq_views_);
    attention_views(config, c_attn[std::size_t(l)], c_proj[std::size_t(l)], l, /*kv_and_o=*/true, all_views_);
  }
  warm_.resize(all_views_.size());
  warm_wq_.resize(wq_views_.size());
}

WeightSpectraResult WeightSpectra::measure(std::span<const float> params, SpectraScope scope) {
  const auto& views = this->views(scope);
  auto& warm = scope == SpectraScope::wq ? warm_wq_ : warm_;
  std::vector<double> sigma(views.size());
  for (const auto& v : views)
    if (v.offset < 0 || v.offset + std::int64_t(v.rows - 1) * v.ld + v.cols > std::int64_t(params.size()))
      throw std::out_of_range("WeightSpectra: " + v.name + " lies past the parameters");
  auto run = [&](std::size_t k) {
    const MatrixView& v = views[k];
    const Rounds cap = scope == SpectraScope::wq ? kWqRounds : kAllRounds;
    sigma[k] = spectral_norm(params.data() + v.offset, v.rows, v.cols, v.ld, warm[k], warm[k].empty() ? cap.cold : cap.warm, tolerance_);
  };
  // Large matrices one at a time, each split over the threads (spectral_norm); the many small
  // ones (heads) spread over the threads, one matrix each.
  std::vector<std::size_t> large, small;
  for (std::size_t k = 0; k < views.size(); ++k)
    (std::int64_t(views[k].rows) * views[k].cols >= (std::int64_t(1) << 18) ? large : small).push_back(k);
  for (std::size_t k : large) run(k);
  // Threads only for enough work: a parallel region's start costs more than a tiny model's probe.
  std::int64_t small_work = 0;
  for (std::size_t k : small) small_work += std::int64_t(views[k].rows) * views[k].cols;
#pragma omp parallel for schedule(dynamic) if (small_work >= (std::int64_t(1) << 20))
  for (std::size_t n = 0; n < small.size(); ++n) run(small[n]);

  WeightSpectraResult r;
  r.wq.assign(std::size_t(layers_), 0.0);
  r.wq_heads.assign(std::size_t(layers_), std::vector<double>(std::size_t(heads_), 0.0));
  if (scope == SpectraScope::all) {
    r.wk = r.wv = r.wq;
    r.wk_heads = r.wv_heads = r.wo_heads = r.wq_heads;
  }
  for (std::size_t k = 0; k < views.size(); ++k) {
    const std::string& name = views[k].name;
    int l = -1, h = -1;
    char kind[3] = {0, 0, 0};
    if (std::sscanf(name.c_str(), "h.%d.w%c.head.%d", &l, &kind[1], &h) == 3) {
      auto& grid = kind[1] == 'q' ? r.wq_heads : kind[1] == 'k' ? r.wk_heads : kind[1] == 'v' ? r.wv_heads : r.wo_heads;
      grid[std::size_t(l)][std::size_t(h)] = sigma[k];
    } else if (std::sscanf(name.c_str(), "h.%d.w%c", &l, &kind[1]) == 2 && name.size() == std::to_string(l).size() + 5) {
      (kind[1] == 'q' ? r.wq : kind[1] == 'k' ? r.wk : r.wv)[std::size_t(l)] = sigma[k];
    } else {
      r.matrices.emplace_back(name, sigma[k]);
    }
  }
  return r;
}

}  // namespace stableflash::diag
