// `audit --import`: another implementation's outputs for an export, measured with the audit's
// measure code (measure_output, measure_delta) against the exported FP64 references.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "stableflash/data/safetensors.hpp"
#include "stableflash/diag/audit_io.hpp"

namespace stableflash::diag {
namespace {

using json = nlohmann::json;
using namespace stableflash::attention;
namespace fs = std::filesystem;

std::string shape_string(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Tensor `name` of `file` (read from `path`) with the given shape, as FP64; errors name both.
std::vector<double> tensor_fp64(const data::SafetensorsFile& file, const std::string& path, const std::string& name,
                                const std::vector<std::int64_t>& shape) {
  const data::Tensor* t = file.find(name);
  if (!t) throw std::runtime_error(path + ": no tensor '" + name + "' (expected " + shape_string(shape) + ")");
  if (t->shape != shape)
    throw std::runtime_error(path + ": tensor '" + name + "' has shape " + shape_string(t->shape) + ", expected " +
                             shape_string(shape) + " ([1, heads, T, D], bhtd)");
  std::vector<double> out;
  out.reserve(std::size_t(t->elements()));
  switch (t->dtype) {
    case data::DType::bf16:
      for (bf16 x : t->as<bf16>()) out.push_back(x.to_float());
      break;
    case data::DType::f32:
      for (float x : t->as<float>()) out.push_back(x);
      break;
    case data::DType::f64:
      out.assign(t->as<double>().begin(), t->as<double>().end());
      break;
    default:
      throw std::runtime_error(path + ": tensor '" + name + "' has dtype " + std::string(data::dtype_name(t->dtype)) +
                               ", expected BF16, F32 or F64");
  }
  return out;
}

data::SafetensorsFile read_existing(const std::string& path, const std::string& what) {
  if (!fs::exists(path)) throw std::runtime_error(path + ": missing (" + what + ")");
  return data::SafetensorsFile::read(path);  // its errors name the file
}

std::string fmt_bias(const Bias& b) {
  char buf[40];
  if (!b.value) return "   null          ";
  if (!b.se) std::snprintf(buf, sizeof buf, "%+7.3f          ", *b.value);
  else std::snprintf(buf, sizeof buf, "%+7.3f +- %5.3f", *b.value, *b.se);
  return buf;
}

json bias_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

}  // namespace

std::vector<ImportedResult> import_audit(const std::string& dir, const std::vector<std::string>& names) {
  const ExportManifest m = read_manifest(dir);
  std::vector<ImportedResult> out;
  for (const ExportedCase& e : m.cases) {
    const AuditCase& c = e.c;
    const std::vector<std::int64_t> qshape = {1, c.heads, c.T, c.D}, rshape = {1, c.heads, c.T};
    const std::string in_path = (fs::path(dir) / e.inputs).string(), ref_path = (fs::path(dir) / e.reference).string();
    const auto inputs = read_existing(in_path, "inputs of " + e.id + " in the manifest");
    const auto reference = read_existing(ref_path, "reference of " + e.id + " in the manifest");
    const data::Tensor* d_o_t = inputs.find("do");
    if (!d_o_t || d_o_t->dtype != data::DType::bf16 || d_o_t->shape != qshape)
      throw std::runtime_error(in_path + ": tensor 'do' must be BF16 " + shape_string(qshape));
    const auto d_o = d_o_t->as<bf16>();
    const std::vector<double> o_ref = tensor_fp64(reference, ref_path, "o", qshape);
    const std::vector<double> delta_ref = tensor_fp64(reference, ref_path, "delta", rshape);
    for (const std::string& name : names) {
      const std::string path = output_path(dir, name, e.id);
      const auto theirs = read_existing(path, "implementation '" + name + "' has no output for " + e.id);
      const std::vector<double> o = tensor_fp64(theirs, path, "o", qshape);
      ImportedResult r;
      r.name = name, r.ec = e;
      r.o = measure_output(o, o_ref, c.D, e.selected_features);
      r.delta = measure_delta(DeltaSource::rounded, rowsum_products(d_o, o, c.D), delta_ref);
      out.push_back(std::move(r));
    }
  }
  return out;
}

std::string format_import_table(const std::vector<ImportedResult>& results) {
  std::ostringstream out;
  char line[512];
  const ExportedCase* prev = nullptr;
  for (const ImportedResult& r : results) {
    const AuditCase& c = r.ec.c;
    if (!prev || prev->id != r.ec.id) {
      std::snprintf(line, sizeof line,
                    "\n%s  ties=%d remainder=%g (achieved %.3g) logit_scale=%g spread=%g T=%d D=%d tile=%d%s v_neg=%g "
                    "do_neg=%g heads=%d seed=%llu\n",
                    r.ec.id.c_str(), c.ties, c.remainder, r.ec.remainder_achieved, c.logit_scale, c.spread, c.T, c.D,
                    c.tile, c.cross_tile ? " cross-tile" : "", c.v_neg, c.do_neg, c.heads,
                    static_cast<unsigned long long>(c.seed));
      out << line
          << "  implementation        O bias +- se     err ulp    rel L2 |  delta bias +- se    drift    rel L2 | nonfin zeroed\n";
    }
    std::snprintf(line, sizeof line, "  %-20s %s  %+8.3f  %8.2e | %s  %+9.2e  %8.2e | %6lld %6lld\n", r.name.c_str(),
                  fmt_bias(r.o.o_bias).c_str(), r.o.mean_err_ulp, r.o.rel_l2, fmt_bias(r.delta.bias).c_str(),
                  r.delta.drift, r.delta.rel_l2, static_cast<long long>(r.o.nonfinite),
                  static_cast<long long>(r.o.zeroed_rows));
    out << line;
    prev = &r.ec;
  }
  return out.str();
}

std::string to_json_line(const ImportedResult& r) {
  const AuditCase& c = r.ec.c;
  const json j = {{"implementation", r.name},
                  {"case", r.ec.id},
                  {"ties", c.ties},
                  {"remainder", c.remainder},
                  {"remainder_achieved", r.ec.remainder_achieved},
                  {"v_neg", c.v_neg},
                  {"do_neg", c.do_neg},
                  {"logit_scale", c.logit_scale},
                  {"spread", c.spread},
                  {"T", c.T},
                  {"D", c.D},
                  {"tile", c.tile},
                  {"cross_tile", c.cross_tile},
                  {"heads", c.heads},
                  {"seed", c.seed},
                  {"o_bias", bias_json(r.o.o_bias.value)},
                  {"o_bias_se", bias_json(r.o.o_bias.se)},
                  {"o_bias_count", r.o.o_bias.count},
                  {"delta_source", "rowsum(do * o) in FP64"},
                  {"delta_bias", bias_json(r.delta.bias.value)},
                  {"delta_bias_se", bias_json(r.delta.bias.se)},
                  {"delta_bias_count", r.delta.bias.count},
                  {"delta_drift", r.delta.drift},
                  {"delta_drift_se", bias_json(r.delta.drift_se)},
                  {"delta_rel_l2", r.delta.rel_l2},
                  {"mean_err_ulp", r.o.mean_err_ulp},
                  {"rel_l2", r.o.rel_l2},
                  {"nonfinite", r.o.nonfinite},
                  {"zeroed_rows", r.o.zeroed_rows}};
  return j.dump();
}

std::vector<std::string> biases_above(const std::vector<ImportedResult>& results, double threshold) {
  std::vector<std::string> out;
  char line[256];
  for (const ImportedResult& r : results)
    for (auto [what, b] : {std::pair{"O", &r.o.o_bias}, std::pair{"delta", &r.delta.bias}})
      if (b->value && std::fabs(*b->value) > threshold) {
        std::snprintf(line, sizeof line, "%s %s: %s bias %+.4f exceeds %g", r.name.c_str(), r.ec.id.c_str(), what,
                      *b->value, threshold);
        out.push_back(line);
      }
  return out;
}

}  // namespace stableflash::diag
