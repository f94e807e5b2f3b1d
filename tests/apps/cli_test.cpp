// `stableflash attention` and `stableflash audit` as a user runs them.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "../data/test_files.hpp"
#include "stableflash/attention/attention.hpp"
#include "stableflash/data/safetensors.hpp"
#include "stableflash/numerics/random.hpp"

namespace stableflash {
namespace {

using data::DType;
using data::SafetensorsFile;
using data::Tensor;
using stableflash::testing::ScratchDir;

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr
};

// `prefix` runs in the same shell first (e.g. a ulimit for the program).
Result run(const std::string& args, const std::string& prefix = "") {
  const std::string cmd = prefix + std::string(STABLEFLASH_BINARY) + " " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe.get())) out.append(buf.data(), n);
  const int status = pclose(pipe.release());
  return {WEXITSTATUS(status), out};
}

std::vector<bf16> random_bf16(std::size_t n, std::uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<bf16> x(n);
  for (auto& v : x) v = bf16::from_float(float(rng.normal()));
  return x;
}

Tensor bf16_tensor(std::vector<std::int64_t> shape, std::uint64_t seed) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  const auto v = random_bf16(std::size_t(n), seed);
  return Tensor::from<bf16>(DType::bf16, std::move(shape), std::span<const bf16>(v));
}

TEST(Cli, AttentionWritesWhatTheLibraryComputes) {
  ScratchDir dir;
  SafetensorsFile in;
  // [B, T, H, D] layout, Tq != Tk, causal
  in.tensors["q"] = bf16_tensor({2, 9, 3, 64}, 1);
  in.tensors["k"] = bf16_tensor({2, 13, 3, 64}, 2);
  in.tensors["v"] = bf16_tensor({2, 13, 3, 64}, 3);
  in.tensors["do"] = bf16_tensor({2, 9, 3, 64}, 4);
  in.write(dir.file("in.safetensors"));
  const Result r = run("attention " + dir.file("in.safetensors") + " -o " + dir.file("out.safetensors") +
                       " --numerics paper --policy hashed_offset --tile 4x8 --causal --layout bthd --delta-source compensated");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile out = SafetensorsFile::read(dir.file("out.safetensors"));
  for (const char* name : {"o", "lse", "o_residual", "dq", "dk", "dv", "delta"}) ASSERT_TRUE(out.find(name)) << name;
  EXPECT_EQ(out.find("lse")->shape, (std::vector<std::int64_t>{2, 3, 9}));
  EXPECT_EQ(out.find("o")->shape, in.find("q")->shape);

  attention::AttentionOptions opt;
  opt.numerics = attention::Numerics::paper, opt.policy = attention::ShiftPolicy::hashed_offset;
  opt.tile_q = 4, opt.tile_k = 8, opt.causal = true, opt.delta_source = attention::DeltaSource::compensated;
  attention::ForwardArgs fa;
  fa.shape = {2, 3, 9, 13, 64}, fa.layout = attention::Layout::bthd;
  fa.q = in.find("q")->as<bf16>().data(), fa.k = in.find("k")->as<bf16>().data(), fa.v = in.find("v")->as<bf16>().data();
  std::vector<bf16> o(2 * 9 * 3 * 64), res(o.size());
  std::vector<float> lse(2 * 3 * 9);
  fa.o = o.data(), fa.lse = lse.data(), fa.o_residual = res.data();
  attention::attention_forward(fa, opt);
  const auto got = out.find("o")->as<bf16>();
  for (std::size_t i = 0; i < o.size(); ++i) ASSERT_EQ(got[i].bits, o[i].bits) << i;
  EXPECT_NE(r.output.find("paper numerics"), std::string::npos);
}

TEST(Cli, AttentionTakesKvWithFewerHeads) {
  // grouped-query attention: k, v with 2 heads for q's 8 ([B, T, H, D]); dk, dv come back with 2
  ScratchDir dir;
  SafetensorsFile in;
  in.tensors["q"] = bf16_tensor({1, 17, 8, 64}, 1);
  in.tensors["k"] = bf16_tensor({1, 17, 2, 64}, 2);
  in.tensors["v"] = bf16_tensor({1, 17, 2, 64}, 3);
  in.tensors["do"] = bf16_tensor({1, 17, 8, 64}, 4);
  in.write(dir.file("in.safetensors"));
  const Result r = run("attention " + dir.file("in.safetensors") + " -o " + dir.file("out.safetensors") + " --causal --layout bthd");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile out = SafetensorsFile::read(dir.file("out.safetensors"));
  EXPECT_EQ(out.find("o")->shape, in.find("q")->shape);
  EXPECT_EQ(out.find("dk")->shape, in.find("k")->shape);
  EXPECT_EQ(out.find("dv")->shape, in.find("k")->shape);

  attention::AttentionOptions opt;
  opt.causal = true;
  attention::BackwardArgs ba;
  ba.shape = {1, 8, 17, 17, 64, 2}, ba.layout = attention::Layout::bthd;
  ba.q = in.find("q")->as<bf16>().data(), ba.k = in.find("k")->as<bf16>().data(), ba.v = in.find("v")->as<bf16>().data();
  ba.d_o = in.find("do")->as<bf16>().data();
  ba.o = out.find("o")->as<bf16>().data(), ba.lse = out.find("lse")->as<float>().data();
  std::vector<bf16> dq(8 * 17 * 64), dk(2 * 17 * 64), dv(dk.size());
  ba.dq = dq.data(), ba.dk = dk.data(), ba.dv = dv.data();
  attention::attention_backward(ba, opt);
  const auto got = out.find("dk")->as<bf16>();
  for (std::size_t i = 0; i < dk.size(); ++i) ASSERT_EQ(got[i].bits, dk[i].bits) << i;

  SafetensorsFile bad = in;
  bad.tensors["k"] = bf16_tensor({1, 17, 3, 64}, 2);
  bad.tensors["v"] = bf16_tensor({1, 17, 3, 64}, 3);
  bad.write(dir.file("bad.safetensors"));
  const Result e = run("attention " + dir.file("bad.safetensors") + " -o " + dir.file("o.safetensors") + " --layout bthd");
  EXPECT_NE(e.exit_code, 0);
  EXPECT_NE(e.output.find("'k' has 3 heads, which does not divide q's 8"), std::string::npos) << e.output;
}

TEST(Cli, ReferenceNumericsWritesFloat64) {
  ScratchDir dir;
  SafetensorsFile in;
  in.tensors["q"] = bf16_tensor({1, 2, 5, 64}, 1);
  in.tensors["k"] = bf16_tensor({1, 2, 5, 64}, 2);
  in.tensors["v"] = bf16_tensor({1, 2, 5, 64}, 3);
  in.write(dir.file("in.safetensors"));
  const Result r = run("attention " + dir.file("in.safetensors") + " -o " + dir.file("ref.safetensors") + " --numerics reference");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile out = SafetensorsFile::read(dir.file("ref.safetensors"));
  EXPECT_EQ(out.find("o")->dtype, DType::f64);
  EXPECT_FALSE(out.find("dq"));  // no 'do' in the input: no backward
}

TEST(Cli, BadTensorsAreNamedInTheError) {
  ScratchDir dir;
  auto expect_error = [&](SafetensorsFile f, std::initializer_list<std::string> parts) {
    f.write(dir.file("bad.safetensors"));
    const Result r = run("attention " + dir.file("bad.safetensors") + " -o " + dir.file("o.safetensors"));
    EXPECT_NE(r.exit_code, 0);
    for (const auto& p : parts) EXPECT_NE(r.output.find(p), std::string::npos) << r.output << " lacks " << p;
  };
  SafetensorsFile good;
  good.tensors["q"] = bf16_tensor({1, 2, 5, 64}, 1);
  good.tensors["k"] = bf16_tensor({1, 2, 7, 64}, 2);
  good.tensors["v"] = bf16_tensor({1, 2, 7, 64}, 3);

  SafetensorsFile f = good;
  const std::vector<float> q32(1 * 2 * 5 * 64, 0.5f);
  f.tensors["q"] = Tensor::from<float>(DType::f32, {1, 2, 5, 64}, q32);
  expect_error(f, {"'q'", "F32", "expected BF16"});
  f = good;
  f.tensors["k"] = bf16_tensor({2, 7, 64}, 2);
  expect_error(f, {"'k'", "rank 4"});
  f = good;
  f.tensors["v"] = bf16_tensor({1, 2, 6, 64}, 3);
  expect_error(f, {"'v'", "[1, 2, 6, 64]"});
  f = good;
  f.tensors.erase("v");
  expect_error(f, {"missing tensor 'v'"});
  f = good;
  f.tensors["do"] = bf16_tensor({1, 2, 4, 64}, 4);
  expect_error(f, {"'do'", "q's"});
  f = good;
  f.tensors["k"] = bf16_tensor({1, 2, 7, 32}, 2);
  expect_error(f, {"'k'", "does not match q"});

  const Result flag = run("attention " + dir.file("bad.safetensors") + " -o x --policy bogus");
  EXPECT_NE(flag.exit_code, 0);
  EXPECT_NE(flag.output.find("--policy"), std::string::npos) << flag.output;
  const Result tile = run("attention " + dir.file("bad.safetensors") + " -o x --tile 12");
  EXPECT_NE(tile.output.find("--tile"), std::string::npos) << tile.output;
}

SafetensorsFile small_qkv() {
  SafetensorsFile in;
  in.tensors["q"] = bf16_tensor({1, 2, 5, 64}, 1);  // [B, H, T, D]
  in.tensors["k"] = bf16_tensor({1, 2, 7, 64}, 2);
  in.tensors["v"] = bf16_tensor({1, 2, 7, 64}, 3);
  return in;
}

TEST(Cli, AttentionRefusesToWriteOverItsInput) {
  ScratchDir dir;
  const std::string in = dir.file("in.safetensors");
  small_qkv().write(in);
  const auto before = stableflash::testing::read_bytes(in);
  std::filesystem::create_symlink(in, dir.file("alias.safetensors"));
  for (const std::string& out : {in, dir.file("alias.safetensors")}) {
    const Result r = run("attention " + in + " -o " + out);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("same file as the input"), std::string::npos) << r.output;
  }
  EXPECT_EQ(stableflash::testing::read_bytes(in), before);
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("alias.safetensors")));
}

TEST(Cli, AttentionWritesThroughASymlinkedOutput) {
  ScratchDir dir;
  small_qkv().write(dir.file("in.safetensors"));
  std::filesystem::create_symlink("real.safetensors", dir.file("out.safetensors"));
  const Result r = run("attention " + dir.file("in.safetensors") + " -o " + dir.file("out.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::is_symlink(dir.file("out.safetensors")));
  EXPECT_TRUE(SafetensorsFile::read(dir.file("real.safetensors")).find("o"));
}

TEST(Cli, NonFiniteOutputsAreCountedWarnedAndAnErrorWithStrict) {
  ScratchDir dir;
  SafetensorsFile in = small_qkv();
  const std::string clean = "attention " + dir.file("in.safetensors") + " -o " + dir.file("out.safetensors");
  in.write(dir.file("in.safetensors"));
  const Result ok = run(clean);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("non-finite outputs: 0"), std::string::npos) << ok.output;
  EXPECT_EQ(ok.output.find("warning"), std::string::npos) << ok.output;

  // One NaN in q (head 1, query 2, feature 5) poisons exactly that query's row: D = 64 values of
  // o and its one lse; the other 9 rows stay finite.
  auto q = in.find("q")->as<bf16>();
  std::vector<bf16> qv(q.begin(), q.end());
  qv[(1 * 5 + 2) * 64 + 5] = bf16{0x7fc0};
  in.tensors["q"] = Tensor::from<bf16>(DType::bf16, {1, 2, 5, 64}, qv);
  in.write(dir.file("in.safetensors"));
  const Result nan = run(clean);
  ASSERT_EQ(nan.exit_code, 0) << nan.output;
  EXPECT_NE(nan.output.find("non-finite outputs: 65"), std::string::npos) << nan.output;
  EXPECT_NE(nan.output.find("warning: 65 non-finite output values (lse 1, o 64); the input holds 1 (q 1)"), std::string::npos) << nan.output;
  EXPECT_EQ(data::count_non_finite(*SafetensorsFile::read(dir.file("out.safetensors")).find("o")), 64);

  std::filesystem::remove(dir.file("out.safetensors"));
  const Result strict = run(clean + " --strict");
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_NE(strict.output.find("--strict"), std::string::npos) << strict.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.safetensors")));

  // Finite inputs whose logits overflow FP32: q = k = 2^64 gives q.k = 64 * 2^128 > FLT_MAX.
  SafetensorsFile huge = small_qkv();
  const std::vector<bf16> big(1 * 2 * 7 * 64, bf16::from_float(0x1p64f));
  huge.tensors["q"] = Tensor::from<bf16>(DType::bf16, {1, 2, 5, 64}, std::span<const bf16>(big.data(), 1 * 2 * 5 * 64));
  huge.tensors["k"] = Tensor::from<bf16>(DType::bf16, {1, 2, 7, 64}, big);
  huge.write(dir.file("in.safetensors"));
  const Result overflow = run(clean + " --numerics paper");
  EXPECT_EQ(overflow.exit_code, 0) << overflow.output;
  EXPECT_NE(overflow.output.find("the inputs are finite, so some logits overflow FP32"), std::string::npos) << overflow.output;
}

TEST(Cli, OutOfMemoryIsSaidInWords) {
  ScratchDir dir;
  // A valid header for 2 GiB of U8 data in a sparse file (no disk used); reading it under a
  // 1 GiB address-space limit must fail with a sentence, not a bare std::bad_alloc.
  const std::uint64_t n = std::uint64_t(1) << 31;
  std::string header = R"({"q":{"dtype":"U8","shape":[)" + std::to_string(n) + R"(],"data_offsets":[0,)" + std::to_string(n) + "]}}";
  std::vector<unsigned char> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[std::size_t(i)] = static_cast<unsigned char>(std::uint64_t(header.size()) >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  stableflash::testing::write_bytes(dir.file("big.safetensors"), bytes);
  std::filesystem::resize_file(dir.file("big.safetensors"), bytes.size() + n);
  const Result r = run("attention " + dir.file("big.safetensors") + " -o " + dir.file("o.safetensors") + " 2>&1; exit $?", "ulimit -v 1048576; ");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("out of memory"), std::string::npos) << r.output;
}

TEST(Cli, AuditJsonLinesCoverTheGridAsShown) {
  const std::string grid = "--ties 1,2 --remainder 1e-4 --logit-scale 8 --T 32 --tile 32 --heads 1 --numerics paper,fused "
                           "--policy standard,hashed_offset --delta-source rounded,exact";
  const Result shown = run("audit " + grid + " --show-grid");
  ASSERT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_NE(shown.output.find("2 cases x 4 variants x 2 delta sources"), std::string::npos) << shown.output;
  const Result r = run("audit " + grid + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  int objects = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;  // progress lines go to stderr, merged here
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("o_bias") && j.contains("delta_bias") && j.contains("tie_rows"));
    ++objects;
  }
  EXPECT_EQ(objects, 2 * 4 * 2);
  const Result bad = run("audit --ties two");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--ties"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace stableflash
