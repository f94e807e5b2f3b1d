// `audit --export`: the audit's generated inputs and FP64 references as safetensors, and a manifest
// that says what each file holds and how the biases are selected, so that an outside
// implementation can be measured exactly as the audit measures ours.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "stableflash/data/atomic_file.hpp"
#include "stableflash/data/safetensors.hpp"
#include "stableflash/diag/audit_io.hpp"

namespace stableflash::diag {
namespace {

using json = nlohmann::json;
using namespace stableflash::attention;
namespace fs = std::filesystem;

std::string case_id(std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "case-%04zu", i);
  return buf;
}

json case_json(const ExportedCase& e) {
  const AuditCase& c = e.c;
  return {{"id", e.id},
          {"inputs", e.inputs},
          {"reference", e.reference},
          {"output", "NAME/" + e.id + ".safetensors"},
          {"params",
           {{"ties", c.ties}, {"remainder", c.remainder}, {"v_neg", c.v_neg}, {"do_neg", c.do_neg},
            {"logit_scale", c.logit_scale}, {"spread", c.spread}, {"T", c.T}, {"D", c.D}, {"tile", c.tile},
            {"cross_tile", c.cross_tile}, {"heads", c.heads}, {"seed", c.seed}}},
          {"remainder_achieved", e.remainder_achieved},
          {"attention",
           {{"layout", "bhtd"}, {"batch", 1}, {"heads", c.heads}, {"q_len", c.T}, {"k_len", c.T}, {"head_dim", c.D},
            {"causal", false}, {"scale", e.scale}}},
          {"o_bias",
           {{"tensor", "o"}, {"features", {0, e.selected_features}}, {"rows", "all"},
            {"measure", "sum(e) / sum(|e|), e = o - o_ref over finite o, features [begin, end) of every row"}}},
          {"delta_bias",
           {{"rows", "all"},
            {"delta", "rowsum(do * o) in FP64 from the implementation's o; reference: delta of the reference file"},
            {"measure", "sum(e) / sum(|e|) over rows with a finite delta"}}}};
}

// The manifest's field `key` of `j`, with an error naming the file and the field's path.
template <class T>
T field(const json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw std::runtime_error(where + "." + key + ": missing");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception&) {
    throw std::runtime_error(where + "." + key + ": wrong type (" + j.at(key).dump() + ")");
  }
}

}  // namespace

std::string output_path(const std::string& dir, const std::string& name, const std::string& id) {
  return (fs::path(dir) / name / (id + ".safetensors")).string();
}

ExportManifest export_audit(const AuditGrid& grid, const std::string& dir, const std::function<void(int, int)>& progress) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw std::runtime_error(dir + ": cannot create the export folder (" + ec.message() + ")");
  ExportManifest m;
  m.grid = grid.describe();
  const std::vector<AuditCase> cases = grid.cases();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const AuditCase& c = cases[i];
    const AuditInputs in = generate_audit_inputs(c);
    const AttentionShape& s = in.shape;
    AttentionOptions opt;  // as audit_case: non-causal, the default scale
    opt.tile_q = opt.tile_k = c.tile;
    ForwardArgs fa;
    fa.shape = s;
    fa.q = in.q.data(), fa.k = in.k.data(), fa.v = in.v.data();
    const ReferenceForward ref = reference_forward(fa, opt);
    const std::vector<double> delta = rowsum_products(in.d_o, ref.o, c.D);

    ExportedCase e;
    e.id = case_id(i), e.c = c, e.remainder_achieved = in.remainder_achieved;
    e.scale = opt.resolved_scale(c.D), e.selected_features = skewed_features(c.D);
    e.inputs = e.id + ".inputs.safetensors", e.reference = e.id + ".reference.safetensors";

    const std::vector<std::int64_t> qshape = {1, c.heads, c.T, c.D}, rshape = {1, c.heads, c.T};
    data::SafetensorsFile inputs, reference;
    inputs.metadata = reference.metadata = {{"format", kExportFormat}, {"case", e.id}, {"layout", "bhtd"}};
    inputs.tensors["q"] = data::Tensor::from<bf16>(data::DType::bf16, qshape, in.q);
    inputs.tensors["k"] = data::Tensor::from<bf16>(data::DType::bf16, qshape, in.k);
    inputs.tensors["v"] = data::Tensor::from<bf16>(data::DType::bf16, qshape, in.v);
    inputs.tensors["do"] = data::Tensor::from<bf16>(data::DType::bf16, qshape, in.d_o);
    reference.tensors["o"] = data::Tensor::from<double>(data::DType::f64, qshape, ref.o);
    reference.tensors["lse"] = data::Tensor::from<double>(data::DType::f64, rshape, ref.lse);
    reference.tensors["delta"] = data::Tensor::from<double>(data::DType::f64, rshape, delta);
    inputs.write((fs::path(dir) / e.inputs).string());
    reference.write((fs::path(dir) / e.reference).string());
    m.cases.push_back(std::move(e));
    if (progress) progress(int(i + 1), int(cases.size()));
  }

  json cs = json::array();
  for (const ExportedCase& e : m.cases) cs.push_back(case_json(e));
  const json manifest = {
      {"format", kExportFormat},
      {"version", kExportVersion},
      {"grid", m.grid},
      {"tensors",
       {{"inputs", "q, k, v, do: BF16 [1, heads, T, D], row-major (bhtd)"},
        {"reference", "o: F64 [1, heads, T, D]; lse, delta: F64 [1, heads, T]; delta = rowsum(do * o_ref) in FP64"},
        {"output", "NAME/<id>.safetensors with o: [1, heads, T, D] in BF16 (F32, F64 accepted); dq, dk, dv optional, not measured"}}},
      {"cases", cs}};
  data::write_file_atomically((fs::path(dir) / "manifest.json").string(),
                              [&](std::ostream& out) { out << manifest.dump(1) << '\n'; });
  return m;
}

ExportManifest read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "manifest.json").string();
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open (is " + dir + " an `audit --export` folder?)");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
  if (field<std::string>(j, "format", path) != kExportFormat) throw std::runtime_error(path + ".format: not " + std::string(kExportFormat));
  if (const int v = field<int>(j, "version", path); v != kExportVersion)
    throw std::runtime_error(path + ".version: " + std::to_string(v) + ", this program reads " + std::to_string(kExportVersion));
  ExportManifest m;
  m.grid = field<std::string>(j, "grid", path);
  const json cs = field<json>(j, "cases", path);
  if (!cs.is_array()) throw std::runtime_error(path + ".cases: not an array");
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const std::string where = path + ".cases[" + std::to_string(i) + "]";
    const json& cj = cs[i];
    ExportedCase e;
    e.id = field<std::string>(cj, "id", where);
    e.inputs = field<std::string>(cj, "inputs", where);
    e.reference = field<std::string>(cj, "reference", where);
    e.remainder_achieved = field<double>(cj, "remainder_achieved", where);
    const json p = field<json>(cj, "params", where);
    const std::string pw = where + ".params";
    AuditCase& c = e.c;
    c.ties = field<int>(p, "ties", pw), c.remainder = field<double>(p, "remainder", pw);
    c.v_neg = field<double>(p, "v_neg", pw), c.do_neg = field<double>(p, "do_neg", pw);
    c.logit_scale = field<double>(p, "logit_scale", pw), c.spread = field<double>(p, "spread", pw);
    c.T = field<int>(p, "T", pw), c.D = field<int>(p, "D", pw), c.tile = field<int>(p, "tile", pw);
    c.cross_tile = field<bool>(p, "cross_tile", pw), c.heads = field<int>(p, "heads", pw);
    c.seed = field<std::uint64_t>(p, "seed", pw);
    if (c.T < 1 || c.D < 1 || c.heads < 1) throw std::runtime_error(pw + ": T, D and heads must be >= 1");
    const json a = field<json>(cj, "attention", where);
    e.scale = field<double>(a, "scale", where + ".attention");
    if (field<bool>(a, "causal", where + ".attention")) throw std::runtime_error(where + ".attention.causal: the audit's cases are non-causal");
    const auto features = field<std::vector<int>>(field<json>(cj, "o_bias", where), "features", where + ".o_bias");
    if (features.size() != 2 || features[0] != 0 || features[1] < 0 || features[1] > c.D)
      throw std::runtime_error(where + ".o_bias.features: expected [0, end] with end <= D");
    e.selected_features = features[1];
    m.cases.push_back(std::move(e));
  }
  return m;
}

}  // namespace stableflash::diag
