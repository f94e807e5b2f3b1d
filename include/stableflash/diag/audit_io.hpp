// The external audit (docs/numerics-findings.md "Auditing another implementation"): the audit's cases
// written out as safetensors with a manifest, and another implementation's outputs for them read
// back and measured with the audit's own measure code.
//
// An export folder DIR holds
//   manifest.json                       every case: parameters, attention call, files, selections
//   <id>.inputs.safetensors             q, k, v, do: BF16 [1, heads, T, D] (bhtd, row-major)
//   <id>.reference.safetensors          o: F64 [1, heads, T, D], lse and delta: F64 [1, heads, T]
// and an implementation NAME puts its outputs in
//   NAME/<id>.safetensors               o: [1, heads, T, D] in BF16 (or F32/F64); dq, dk, dv ignored
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "stableflash/diag/audit.hpp"

namespace stableflash::diag {

inline constexpr const char* kExportFormat = "stableflash-audit-export";
inline constexpr int kExportVersion = 1;

// One case of an export as the manifest describes it.
struct ExportedCase {
  std::string id;         // "case-0000": the stem of its files
  AuditCase c;
  double remainder_achieved = 0.0;
  double scale = 0.0;     // softmax scale the audit uses (FP32 1/sqrt(D)), non-causal
  int selected_features = 0;  // the O bias is over features [0, selected_features) of every row
  std::string inputs, reference;  // file names relative to the export folder
};

struct ExportManifest {
  std::string grid;  // the grid as flags (AuditGrid::describe)
  std::vector<ExportedCase> cases;
};

// Writes every case of `grid` (the variants are not run) into `dir`, created if missing. Files
// are written atomically, the manifest last. `progress(done, total)` after each case.
ExportManifest export_audit(const AuditGrid& grid, const std::string& dir,
                            const std::function<void(int, int)>& progress = {});

// Reads DIR/manifest.json; errors name the file and the field.
ExportManifest read_manifest(const std::string& dir);

// The path where implementation `name` puts the outputs of case `id`.
std::string output_path(const std::string& dir, const std::string& name, const std::string& id);

// One implementation's outputs of one case, measured.
struct ImportedResult {
  std::string name;
  ExportedCase ec;
  OutputMeasure o;
  DeltaMeasure delta;  // source `rounded`: delta = rowsum(dO * O_theirs) in FP64
};

// Measures the outputs of each implementation in `names` for every case of the export in `dir`.
// A missing or malformed output file is an error naming it.
std::vector<ImportedResult> import_audit(const std::string& dir, const std::vector<std::string>& names);

// The table, grouped by case (one line per implementation), and one JSON object per result.
std::string format_import_table(const std::vector<ImportedResult>& results);
std::string to_json_line(const ImportedResult& r);

// The results whose |O bias| or |delta bias| exceeds `threshold`, as readable lines.
std::vector<std::string> biases_above(const std::vector<ImportedResult>& results, double threshold);

}  // namespace stableflash::diag
