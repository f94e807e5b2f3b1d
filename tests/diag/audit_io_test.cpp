// The external audit: an export read back with our own outputs gives the audit's own numbers,
// broken files are named, and the standard error of a bias is what replicates show.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "audit_own_outputs.hpp"
#include "stableflash/diag/audit_io.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash::diag {
namespace {

using namespace stableflash::attention;
namespace fs = std::filesystem;

AuditGrid small_grid() {
  AuditGrid g = AuditGrid::default_grid();
  g.ties = {1, 2}, g.remainder = {1e-4, 1e-2}, g.logit_scale = {8.0}, g.T = {64}, g.D = {16}, g.tile = {64, 32};
  g.heads = {2}, g.numerics = {Numerics::paper, Numerics::fused};
  g.policies = {ShiftPolicy::standard, ShiftPolicy::hashed_offset}, g.delta_sources = {DeltaSource::rounded};
  return g;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("sf_audit_io_" + tag + "_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()))) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

void expect_same_bias(const Bias& a, const Bias& b, const std::string& what) {
  EXPECT_EQ(a.count, b.count) << what;
  ASSERT_EQ(a.value.has_value(), b.value.has_value()) << what;
  if (a.value) {
    EXPECT_EQ(*a.value, *b.value) << what;  // bitwise: one code path computes both
  }
  ASSERT_EQ(a.se.has_value(), b.se.has_value()) << what;
  if (a.se) {
    EXPECT_EQ(*a.se, *b.se) << what;
  }
}

TEST(AuditIo, ImportOfOurOwnOutputsGivesTheAuditsNumbersBitwise) {
  const TempDir dir("roundtrip");
  const AuditGrid g = small_grid();
  const ExportManifest m = export_audit(g, dir.str());
  ASSERT_EQ(m.cases.size(), g.cases().size());
  const std::vector<AuditVariant> variants = g.variants();
  std::vector<std::string> names;
  for (const AuditVariant& v : variants) {
    names.push_back(std::string(to_string(v.numerics)) + "-" + std::string(to_string(v.policy)));
    testing::write_own_outputs(dir.str(), names.back(), v, g.policy_params);
  }
  const std::vector<ImportedResult> imported = import_audit(dir.str(), names);
  ASSERT_EQ(imported.size(), m.cases.size() * variants.size());
  std::size_t i = 0;
  for (const ExportedCase& e : read_manifest(dir.str()).cases) {
    const std::vector<AuditResult> own = audit_case(e.c, variants, g.delta_sources, g.policy_params);
    // the delta the import measures (FP64 rowsum of the given O) from independently regenerated inputs
    const AuditInputs in = generate_audit_inputs(e.c);
    AttentionOptions opt;
    opt.tile_q = opt.tile_k = e.c.tile;
    ForwardArgs fa;
    fa.shape = in.shape, fa.q = in.q.data(), fa.k = in.k.data(), fa.v = in.v.data();
    const std::vector<double> ref_delta = rowsum_products(in.d_o, reference_forward(fa, opt).o, e.c.D);
    for (std::size_t vi = 0; vi < variants.size(); ++vi, ++i) {
      const ImportedResult& r = imported[i];
      const std::string what = e.id + " " + names[vi];
      ASSERT_EQ(r.ec.id, e.id);
      ASSERT_EQ(r.name, names[vi]);
      EXPECT_EQ(r.ec.remainder_achieved, own[vi].remainder_achieved) << what;
      expect_same_bias(r.o.o_bias, own[vi].o_bias, what + " O bias");
      EXPECT_EQ(r.o.mean_err_ulp, own[vi].mean_err_ulp) << what;
      EXPECT_EQ(r.o.rel_l2, own[vi].rel_l2) << what;
      EXPECT_EQ(r.o.nonfinite, own[vi].nonfinite) << what;
      EXPECT_EQ(r.o.zeroed_rows, own[vi].zeroed_rows) << what;
      // the imported O is bitwise ours (the O measures above say so); its delta from the files:
      const auto o_file = data::SafetensorsFile::read(output_path(dir.str(), names[vi], e.id));
      std::vector<double> o;
      for (bf16 x : o_file.find("o")->as<bf16>()) o.push_back(x.to_float());
      const DeltaMeasure d = measure_delta(DeltaSource::rounded, rowsum_products(in.d_o, o, e.c.D), ref_delta);
      expect_same_bias(r.delta.bias, d.bias, what + " delta bias");
      EXPECT_EQ(r.delta.drift, d.drift) << what;
      EXPECT_EQ(r.delta.rel_l2, d.rel_l2) << what;
    }
  }
  // the table and JSON carry every result, with a standard error
  const std::string table = format_import_table(imported);
  for (const std::string& n : names) EXPECT_NE(table.find(n), std::string::npos) << n;
  EXPECT_NE(table.find("+-"), std::string::npos);
  EXPECT_NE(to_json_line(imported[0]).find("\"o_bias_se\""), std::string::npos);
}

TEST(AuditIo, MissingOrCorruptFilesAreNamed) {
  const TempDir dir("broken");
  AuditGrid g = small_grid();
  g.ties = {2}, g.remainder = {1e-4}, g.tile = {64};
  const ExportManifest m = export_audit(g, dir.str());
  ASSERT_EQ(m.cases.size(), 1u);
  const std::string id = m.cases[0].id, path = output_path(dir.str(), "mine", id);
  auto message = [&](const std::vector<std::string>& names) {
    try {
      import_audit(dir.str(), names);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // missing
  std::string msg = message({"mine"});
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
  // truncated
  testing::write_own_outputs(dir.str(), "mine", {});
  ASSERT_EQ(message({"mine"}), "no error");
  fs::resize_file(path, fs::file_size(path) - 10);
  msg = message({"mine"});
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  // wrong tensor name and wrong shape
  data::SafetensorsFile f;
  f.tensors["out"] = data::Tensor::from<float>(data::DType::f32, {1}, std::vector<float>{0.f});
  f.write(path);
  msg = message({"mine"});
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("'o'"), std::string::npos) << msg;
  f.tensors["o"] = data::Tensor::from<float>(data::DType::f32, {1, 2}, std::vector<float>{0.f, 0.f});
  f.write(path);
  msg = message({"mine"});
  EXPECT_NE(msg.find("shape [1, 2]"), std::string::npos) << msg;
  // a manifest field
  const std::string manifest = (dir.path / "manifest.json").string();
  std::ifstream in(manifest);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const auto at = text.find("\"ties\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 6, "\"tiez\"");
  std::ofstream(manifest) << text;
  msg = message({"mine"});
  EXPECT_NE(msg.find("cases[0].params.ties: missing"), std::string::npos) << msg;
}

TEST(AuditIo, FailAboveListsExactlyTheBiasesOverTheThreshold) {
  ImportedResult a, b;
  a.name = "a", a.ec.id = "case-0000", a.o.o_bias.value = 0.5, a.delta.bias.value = -0.2;
  b.name = "b", b.ec.id = "case-0000", b.o.o_bias.value = std::nullopt, b.delta.bias.value = 0.05;
  EXPECT_EQ(biases_above({a, b}, 0.6).size(), 0u);
  EXPECT_EQ(biases_above({a, b}, 0.3).size(), 1u);
  EXPECT_EQ(biases_above({a, b}, 0.1).size(), 2u);
  EXPECT_EQ(biases_above({a, b}, 0.0).size(), 3u);
}

TEST(AuditIo, RatioStandardErrorByHand) {
  // R = 2/4; residuals a - R b = 0.5, -1.5, 1; SE = sqrt(3/2 * 3.5) / 4
  const std::vector<double> a = {1, -1, 2}, b = {1, 1, 2};
  ASSERT_TRUE(ratio_standard_error(a, b));
  EXPECT_DOUBLE_EQ(*ratio_standard_error(a, b), std::sqrt(1.5 * 3.5) / 4.0);
  EXPECT_FALSE(ratio_standard_error(std::vector<double>{1}, std::vector<double>{1}));
  EXPECT_FALSE(ratio_standard_error(std::vector<double>{0, 0}, std::vector<double>{0, 0}));
}

TEST(AuditIo, DeltaDriftAndItsStandardErrorByHand) {
  // e = 1, -1, 2 on |delta_ref| = 1, 1, 2: drift = 2/4 and the ratio SE of the example above; a
  // non-finite delta leaves its row out of both
  const std::vector<double> ref = {1, -1, 2, 5}, delta = {2, -2, 4, std::nan("")};
  const DeltaMeasure m = measure_delta(DeltaSource::rounded, delta, ref);
  EXPECT_DOUBLE_EQ(m.drift, 0.5);
  ASSERT_TRUE(m.drift_se);
  EXPECT_DOUBLE_EQ(*m.drift_se, std::sqrt(1.5 * 3.5) / 4.0);
  EXPECT_FALSE(measure_delta(DeltaSource::rounded, std::vector<double>{1}, std::vector<double>{1}).drift_se);
}

TEST(AuditIo, RatioStandardErrorMatchesTheSpreadOfReplicates) {
  // m replicates of n rows of k errors e ~ N(0.2, 1): the delta-method SE must match the standard
  // deviation of the bias across replicates. The sample SD of m draws has a relative standard error
  // of 1/sqrt(2(m-1)); allow 4 of those (the delta method's own O(1/n) error is far below).
  constexpr int m = 500, n = 400, k = 8;
  SplitMix64 rng(14);
  double sum = 0.0, sum2 = 0.0, se_sum = 0.0;
  for (int rep = 0; rep < m; ++rep) {
    std::vector<double> a(n, 0.0), b(n, 0.0);
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < k; ++j) {
        const double e = 0.2 + rng.normal();
        a[r] += e, b[r] += std::fabs(e);
      }
    double sa = 0.0, sb = 0.0;
    for (int r = 0; r < n; ++r) sa += a[r], sb += b[r];
    const double R = sa / sb;
    sum += R, sum2 += R * R, se_sum += *ratio_standard_error(a, b);
  }
  const double sd = std::sqrt((sum2 - sum * sum / m) / (m - 1)), mean_se = se_sum / m;
  EXPECT_NEAR(mean_se / sd, 1.0, 4.0 / std::sqrt(2.0 * (m - 1))) << "mean SE " << mean_se << " replicate SD " << sd;
}

}  // namespace
}  // namespace stableflash::diag
