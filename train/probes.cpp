// The trainer's probes (see probes.hpp); the metrics.jsonl fields are documented in
// docs/training.md ("Probes").
#include "probes.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "stableflash/diag/attention_probes.hpp"

namespace stableflash::train {
namespace {

std::string number(double v) {
  if (!std::isfinite(v)) return "null";  // JSON has no NaN (the metrics convention)
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Exact (17 digits) where the value is carried on: the delta running sum continues from the
// printed value on resume, bit for bit.
std::string exact(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string array(const std::vector<double>& v, std::string (*format)(double) = number) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + format(v[i]);
  return s + "]";
}

// [layer][head]; a layer without values (not captured, or `standard` attention) is null.
std::string grid(const std::vector<std::optional<std::vector<double>>>& g) {
  std::string s = "[";
  for (std::size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + (g[i] ? array(*g[i]) : std::string("null"));
  return s + "]";
}

std::string grid(const std::vector<std::vector<double>>& g) {
  std::string s = "[";
  for (std::size_t i = 0; i < g.size(); ++i) s += (i ? ", " : "") + array(g[i]);
  return s + "]";
}

void field(std::string& out, const std::string& key, const std::string& value) { out += ", \"" + key + "\": " + value; }

bool every(std::int64_t n, std::int64_t step, bool last) { return n > 0 && ((step + 1) % n == 0 || last); }

}  // namespace

TrainingProbes::TrainingProbes(const TrainConfig& config)
    : config_(config), layers_(config.probe_layers()), spectra_(config.model), delta_sum_(std::size_t(config.model.n_layer), 0.0) {}

// train.probe_every = 0 turns every probe off.
bool TrainingProbes::wq_step(std::int64_t step, bool last) const { return every(config_.train.probe_every, step, last); }
bool TrainingProbes::sigma_step(std::int64_t step, bool last) const {
  return config_.train.probe_every > 0 && every(config_.probe.sigma_every, step, last);
}
bool TrainingProbes::attention_step(std::int64_t step, bool last) const {
  return config_.train.probe_every > 0 && every(config_.probe.attention_every, step, last);
}

std::span<const float> TrainingProbes::wq_weights(TrainingEngine& engine) {
  if (!wq_host_) {
    for (const auto& v : spectra_.views(diag::SpectraScope::wq)) {
      const std::int64_t end = v.offset + std::int64_t(v.rows - 1) * v.ld + v.cols;
      if (v.name.ends_with(".wq")) wq_ranges_.emplace_back(v.offset, end);  // a layer's whole W_Q covers its heads'
      wq_host_size_ = std::max(wq_host_size_, end);
    }
    wq_host_.reset(new float[std::size_t(wq_host_size_)]);  // not value-initialized: untouched pages stay unallocated
  }
  for (const auto& [begin, end] : wq_ranges_) engine.read_parameters(begin, {wq_host_.get() + begin, std::size_t(end - begin)});
  return {wq_host_.get(), std::size_t(wq_host_size_)};
}

void TrainingProbes::request(TrainingEngine& engine, bool attention) {
  if (!attention) return;
  model::CaptureRequest r;
  r.layers = layers_;
  r.sequences = config_.probe.sequences;
  r.count_ties = true;
  engine.request_capture(r);
}

void TrainingProbes::measure(TrainingEngine& engine, StepMetrics& m, bool wq, bool sigma, bool attention) {
  if (!wq && !sigma && !attention) return;
  const auto t0 = std::chrono::steady_clock::now();
  const int L = config_.model.n_layer;
  std::string& out = m.probe_fields;

  if (wq || sigma) {
    const auto params = sigma ? engine.parameters_on_host() : wq_weights(engine);
    const auto q = spectra_.measure(params, diag::SpectraScope::wq);
    m.wq_sigma = q.wq, m.wq_sigma_heads = q.wq_heads;
    for (int l = 0; l < L; ++l) m.sigmas["h." + std::to_string(l) + ".wq"] = q.wq[std::size_t(l)];
    if (sigma) {
      const auto all = spectra_.measure(params, diag::SpectraScope::all);
      std::string s = "{";
      for (std::size_t i = 0; i < all.matrices.size(); ++i) {
        s += (i ? ", \"" : "\"") + all.matrices[i].first + "\": " + number(all.matrices[i].second);
        m.sigmas[all.matrices[i].first] = all.matrices[i].second;
      }
      field(out, "sigma", s + "}");
      field(out, "wk_sigma", array(all.wk));
      field(out, "wv_sigma", array(all.wv));
      field(out, "wk_sigma_heads", grid(all.wk_heads));
      field(out, "wv_sigma_heads", grid(all.wv_heads));
      field(out, "wo_sigma_heads", grid(all.wo_heads));
    }
  }

  if (attention) {
    const model::Capture cap = engine.take_capture();
    const auto layers = std::size_t(L);
    using Grid = std::vector<std::optional<std::vector<double>>>;  // [layer][head], null where not measured
    Grid tie(layers), rep(layers), fallback(layers);
    double counted_rows = 0;
    for (int l = 0; l < L && std::size_t(l) < cap.head_ties.size(); ++l) {
      const auto& heads = cap.head_ties[std::size_t(l)];
      if (heads.empty()) continue;
      tie[std::size_t(l)].emplace(), rep[std::size_t(l)].emplace(), fallback[std::size_t(l)].emplace();
      for (const auto& h : heads) {
        tie[std::size_t(l)]->push_back(double(h.tie_event_rows));
        rep[std::size_t(l)]->push_back(double(h.repeated_max_rows));
        fallback[std::size_t(l)]->push_back(double(h.fallback_rows));
        counted_rows = double(h.rows);
      }
    }
    field(out, "attn_rows", number(counted_rows));
    field(out, "tie_rows", grid(tie));
    field(out, "repeated_max_rows", grid(rep));
    field(out, "fallback_rows", grid(fallback));

    const auto rows = diag::sampled_rows(config_.train.seq_len, config_.probe.rows);
    Grid max_logit(layers), ones(layers), top(layers), sampled_rep(layers), similarity(layers), shadow_heads(layers);
    std::vector<double> shadow(layers, std::nan("")), shadow_sum(layers, std::nan(""));
    double sampled = 0;
    for (const auto& c : cap.layers) {
      const auto l = std::size_t(c.layer);
      max_logit[l].emplace(), ones[l].emplace(), top[l].emplace(), sampled_rep[l].emplace();
      for (const auto& h : diag::attention_row_stats(c, rows)) {
        max_logit[l]->push_back(h.rows ? h.max_logit : std::nan(""));
        ones[l]->push_back(double(h.pbar_ones));
        top[l]->push_back(h.rows ? h.top_mass : std::nan(""));
        sampled_rep[l]->push_back(double(h.repeated_max_rows));
        sampled = double(h.rows);
      }
      const auto d = diag::delta_shadow(c);
      shadow[l] = d.sum;
      delta_sum_[l] += d.sum;
      shadow_sum[l] = delta_sum_[l];
      shadow_heads[l] = d.heads;
      similarity[l] = diag::rank1_similarity(c, rows);
    }
    field(out, "sampled_rows", number(sampled));
    field(out, "max_logit", grid(max_logit));
    field(out, "pbar_ones", grid(ones));
    field(out, "top_mass", grid(top));
    field(out, "sampled_repeated_max_rows", grid(sampled_rep));
    field(out, "delta_shadow", array(shadow));
    field(out, "delta_shadow_sum", array(shadow_sum, exact));
    field(out, "delta_shadow_heads", grid(shadow_heads));
    field(out, "rank1_similarity", grid(similarity));
  }
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void TrainingProbes::restore(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("delta_shadow_sum") || !j["delta_shadow_sum"].is_array()) continue;
    const auto& sums = j["delta_shadow_sum"];
    for (std::size_t l = 0; l < sums.size() && l < delta_sum_.size(); ++l)
      if (sums[l].is_number()) delta_sum_[l] = sums[l].get<double>();
  }
}

}  // namespace stableflash::train
