// `stableflash audit`: the rounding-bias audit over a grid a user can read (--show-grid) and
// override flag by flag (comma-separated lists).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "commands.hpp"
#include "stableflash/attention/attention.hpp"
#include "stableflash/attention/modes.hpp"
#include "stableflash/diag/audit.hpp"
#include "stableflash/diag/audit_io.hpp"

namespace stableflash::cli {
namespace {

using namespace stableflash::attention;
using diag::AuditGrid;

struct AuditCommand {
  std::string grid = "default";
  std::string ties, remainder, v_neg, do_neg, logit_scale, spread, T, D, tile, cross_tile, heads;
  std::string numerics, policy, normalizer, round_bits, delta_source;
  std::string beta, eps, seed, device = "cpu";
  bool json = false, show_grid = false;
  std::string export_dir, import_dir, names, fail_above;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

template <class T, class Parse>
void override_list(std::vector<T>& dst, const std::string& flag, const std::string& value, Parse parse) {
  if (value.empty()) return;
  dst.clear();
  for (const std::string& item : split(value)) {
    try {
      dst.push_back(parse(item));
    } catch (const std::exception& e) {
      throw std::invalid_argument(flag + ": bad value '" + item + "'" + (std::string(e.what()).empty() ? "" : " (" + std::string(e.what()) + ")"));
    }
  }
  if (dst.empty()) throw std::invalid_argument(flag + ": empty list");
}

template <class E>
auto enum_parser(std::optional<E> (*parse)(std::string_view), std::string valid) {
  return [parse, valid](const std::string& s) {
    const auto v = parse(s);
    if (!v) throw std::invalid_argument("expected one of: " + valid);
    return *v;
  };
}

int to_int(const std::string& s) {
  std::size_t used = 0;
  const int v = std::stoi(s, &used);
  if (used != s.size()) throw std::invalid_argument("not an integer");
  return v;
}

double to_double(const std::string& s) {
  std::size_t used = 0;
  const double v = std::stod(s, &used);
  if (used != s.size()) throw std::invalid_argument("not a number");
  return v;
}

AuditGrid build_grid(const AuditCommand& c) {
  if (c.grid != "default" && c.grid != "full") throw std::invalid_argument("--grid: expected 'default' or 'full', got '" + c.grid + "'");
  AuditGrid g = c.grid == "full" ? AuditGrid::full_grid() : AuditGrid::default_grid();
  override_list(g.ties, "--ties", c.ties, to_int);
  override_list(g.remainder, "--remainder", c.remainder, to_double);
  override_list(g.v_neg, "--v-neg", c.v_neg, to_double);
  override_list(g.do_neg, "--do-neg", c.do_neg, to_double);
  override_list(g.logit_scale, "--logit-scale", c.logit_scale, to_double);
  override_list(g.spread, "--spread", c.spread, to_double);
  override_list(g.T, "--T", c.T, to_int);
  override_list(g.D, "--D", c.D, to_int);
  override_list(g.tile, "--tile", c.tile, to_int);
  override_list(g.heads, "--heads", c.heads, to_int);
  override_list(g.round_bits, "--round-bits", c.round_bits, to_int);
  override_list(g.cross_tile, "--cross-tile", c.cross_tile, [](const std::string& s) {
    if (s == "yes" || s == "true") return true;
    if (s == "no" || s == "false") return false;
    throw std::invalid_argument("expected yes or no");
  });
  override_list(g.numerics, "--numerics", c.numerics, enum_parser(parse_numerics, valid_names_numerics()));
  override_list(g.policies, "--policy", c.policy, enum_parser(parse_shift_policy, valid_names_shift_policy()));
  override_list(g.normalizers, "--normalizer", c.normalizer, enum_parser(parse_normalizer, valid_names_normalizer()));
  override_list(g.delta_sources, "--delta-source", c.delta_source, enum_parser(parse_delta_source, valid_names_delta_source()));
  for (Numerics n : g.numerics)
    if (n == Numerics::reference) throw std::invalid_argument("--numerics: 'reference' is what the audit measures against");
  if (!c.beta.empty()) g.policy_params.beta = float(to_double(c.beta));
  if (!c.eps.empty()) g.policy_params.eps = float(to_double(c.eps));
  if (!c.seed.empty()) g.seed = std::stoull(c.seed);
  const auto device = parse_device(c.device);
  if (!device) throw std::invalid_argument("--device: expected cpu or cuda, got '" + c.device + "'");
  g.device = *device;
  return g;
}

// --import: another implementation's outputs measured against an export (diag/audit_io.hpp).
int run_import(const AuditCommand& c) {
  const std::vector<std::string> names = split(c.names);
  if (names.empty()) throw std::invalid_argument("--import needs --name NAME[,NAME...] (outputs in DIR/NAME/<case>.safetensors)");
  std::optional<double> threshold;
  if (!c.fail_above.empty()) {
    try {
      threshold = to_double(c.fail_above);
    } catch (const std::exception&) {
      throw std::invalid_argument("--fail-above: bad value '" + c.fail_above + "'");
    }
    if (!(*threshold >= 0.0)) throw std::invalid_argument("--fail-above: must be >= 0, got '" + c.fail_above + "'");
  }
  const auto results = diag::import_audit(c.import_dir, names);
  if (c.json) {
    for (const auto& r : results) std::cout << diag::to_json_line(r) << '\n';
  } else {
    std::cout << "stableflash audit --import " << c.import_dir << "  (" << diag::read_manifest(c.import_dir).grid << ")\n"
              << "O bias: mean(e)/mean|e| over the V-skewed features; delta = rowsum(dO*O) in FP64 from each O, bias over rows;\n"
              << "+- is a delta-method standard error over rows; -1..+1, 0 = unbiased\n"
              << diag::format_import_table(results);
  }
  if (threshold) {
    const auto above = diag::biases_above(results, *threshold);
    for (const std::string& line : above) std::fprintf(stderr, "audit --fail-above: %s\n", line.c_str());
    if (!above.empty()) return 3;  // not 1: a CI gate can tell a biased result from an error
  }
  return 0;
}

int run(const AuditCommand& c) {
  if (!c.import_dir.empty()) {
    if (!c.export_dir.empty()) throw std::invalid_argument("--export and --import are separate runs");
    return run_import(c);
  }
  if (!c.names.empty() || !c.fail_above.empty()) throw std::invalid_argument("--name and --fail-above go with --import");
  const AuditGrid grid = build_grid(c);
  if (c.show_grid) {
    std::printf("%s\n%zu cases x %zu variants x %zu delta sources\n", grid.describe().c_str(), grid.cases().size(),
                grid.variants().size(), grid.delta_sources.size());
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto progress = [&](int done, int total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\raudit: %d/%d cases  %.0fs elapsed, ETA %.0fs   ", done, total, s, s / done * (total - done));
    if (done == total) std::fprintf(stderr, "\n");
  };
  if (!c.export_dir.empty()) {
    const auto m = diag::export_audit(grid, c.export_dir, progress);
    std::printf("audit --export: %zu cases in %s (manifest.json; outputs go in %s/NAME/<case>.safetensors)\n",
                m.cases.size(), c.export_dir.c_str(), c.export_dir.c_str());
    return 0;
  }
  const auto results = diag::run_audit(grid, progress);
  if (c.json) {
    for (const auto& r : results)
      for (const std::string& line : diag::to_json_lines(r)) std::cout << line << '\n';
  } else {
    std::cout << "stableflash audit  (" << grid.describe() << ")\n"
              << "O bias: mean(e)/mean|e| over the V-skewed features; delta bias: over rows; -1..+1, 0 = unbiased\n"
              << diag::format_table(results);
  }
  return 0;
}

}  // namespace

Runner add_audit_command(CLI::App& app) {
  auto c = std::make_shared<AuditCommand>();
  CLI::App* sub = app.add_subcommand("audit", "Measure the rounding bias of attention numerics and shift policies");
  sub->add_option("--grid", c->grid, "Base grid: default (under a minute) or full")->capture_default_str();
  sub->add_flag("--json", c->json, "JSON Lines, one object per case x numerics x policy x delta source");
  sub->add_flag("--show-grid", c->show_grid, "Print the grid as flags and its size, then exit");
  sub->add_option("--export", c->export_dir, "Write the grid's cases (inputs, FP64 references, manifest.json) to DIR");
  sub->add_option("--import", c->import_dir, "Measure another implementation's outputs for the export in DIR");
  sub->add_option("--name", c->names, "With --import: implementation(s) whose outputs are DIR/NAME/<case>.safetensors (comma-separated)");
  sub->add_option("--fail-above", c->fail_above, "With --import: exit 3 when any |O bias| or |delta bias| exceeds X");
  const char* list = "comma-separated list overriding the grid";
  sub->add_option("--ties", c->ties, std::string("Tied maxima per row: ") + list);
  sub->add_option("--remainder", c->remainder, std::string("Softmax mass outside the ties: ") + list);
  sub->add_option("--v-neg", c->v_neg, std::string("P(V < 0) in the skewed features: ") + list);
  sub->add_option("--do-neg", c->do_neg, std::string("P(dO < 0) in the skewed features: ") + list);
  sub->add_option("--logit-scale", c->logit_scale, std::string("Typical row maximum of S: ") + list);
  sub->add_option("--spread", c->spread, std::string("Spread of row maxima: ") + list);
  sub->add_option("--T", c->T, std::string("Sequence length: ") + list);
  sub->add_option("--D", c->D, std::string("Head dim: ") + list);
  sub->add_option("--tile", c->tile, std::string("Key tile width Bc: ") + list);
  sub->add_option("--cross-tile", c->cross_tile, std::string("Tied keys in different tiles (yes/no): ") + list);
  sub->add_option("--heads", c->heads, std::string("Heads per case: ") + list);
  sub->add_option("--numerics", c->numerics, std::string("paper, fused: ") + list);
  sub->add_option("--policy", c->policy, std::string("Shift policies: ") + list);
  sub->add_option("--normalizer", c->normalizer, std::string("fused row-sum source: ") + list);
  sub->add_option("--round-bits", c->round_bits, std::string("Output significand bits: ") + list);
  sub->add_option("--delta-source", c->delta_source, std::string("Delta sources: ") + list);
  sub->add_option("--beta", c->beta, "beta of the published policy (default 2)");
  sub->add_option("--eps", c->eps, "tie tolerance of the published policy (default 1e-3)");
  sub->add_option("--seed", c->seed, "Seed of the generated inputs (default 0)");
  sub->add_option("--device", c->device, "Where the variants run: cpu, cuda (the reference stays on the CPU)")
      ->capture_default_str();
  return [c] { return run(*c); };
}

}  // namespace stableflash::cli
