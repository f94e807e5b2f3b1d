// The C ABI library (capi/, what the Python package loads): it loads with dlopen as ctypes does,
// exports the sf_* functions, reports bad input as messages that name the argument, and on the CPU
// computes exactly what attention_forward/backward compute (the ABI adds no numerics of its own).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "stableflash/attention/cuda.hpp"
#include "stableflash/attention/option_text.hpp"
#include "stableflash/capi/stableflash_c.h"
#include "attention/attention_test_util.hpp"

namespace sa = stableflash::attention;
using sa::testing::Problem;

namespace {

// The library's entry points, resolved by name from the dlopen-ed file (never linked), so a
// missing export or an unresolved dependency fails here as it would in Python.
struct Lib {
  void* handle = nullptr;
  decltype(&sf_abi_version) abi_version = nullptr;
  decltype(&sf_options_create) options_create = nullptr;
  decltype(&sf_options_destroy) options_destroy = nullptr;
  decltype(&sf_options_residual_above_keys) residual_above_keys = nullptr;
  decltype(&sf_recommended_options) recommended = nullptr;
  decltype(&sf_attention_forward) forward = nullptr;
  decltype(&sf_attention_backward) backward = nullptr;
  decltype(&sf_attention_forward_check) forward_check = nullptr;
  decltype(&sf_attention_backward_check) backward_check = nullptr;

  Lib() {
    handle = dlopen(STABLEFLASH_C_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return;
    abi_version = reinterpret_cast<decltype(abi_version)>(dlsym(handle, "sf_abi_version"));
    options_create = reinterpret_cast<decltype(options_create)>(dlsym(handle, "sf_options_create"));
    options_destroy = reinterpret_cast<decltype(options_destroy)>(dlsym(handle, "sf_options_destroy"));
    residual_above_keys = reinterpret_cast<decltype(residual_above_keys)>(dlsym(handle, "sf_options_residual_above_keys"));
    recommended = reinterpret_cast<decltype(recommended)>(dlsym(handle, "sf_recommended_options"));
    forward = reinterpret_cast<decltype(forward)>(dlsym(handle, "sf_attention_forward"));
    backward = reinterpret_cast<decltype(backward)>(dlsym(handle, "sf_attention_backward"));
    forward_check = reinterpret_cast<decltype(forward_check)>(dlsym(handle, "sf_attention_forward_check"));
    backward_check = reinterpret_cast<decltype(backward_check)>(dlsym(handle, "sf_attention_backward_check"));
  }
};

const Lib& lib() {
  static const Lib l;
  return l;
}

using Kv = std::vector<std::pair<std::string, std::string>>;

struct Options {
  sf_options* handle = nullptr;
  std::string error;
  explicit Options(const Kv& kv) {
    std::vector<const char*> keys, values;
    for (const auto& [k, v] : kv) keys.push_back(k.c_str()), values.push_back(v.c_str());
    char err[1024] = "";
    handle = lib().options_create(keys.data(), values.data(), int(kv.size()), err, sizeof err);
    error = err;
  }
  ~Options() { lib().options_destroy(handle); }
  Options(const Options&) = delete;
  Options& operator=(const Options&) = delete;
};

sf_tensor tensor_of(const void* data, sa::Layout layout, int heads, int len, int head_dim) {
  const sa::HeadStrides s = sa::HeadStrides::of(layout, heads, len, head_dim);
  return {const_cast<void*>(data), s.b, s.h, s.t};
}

}  // namespace

TEST(CApi, LoadsAndExportsItsFunctions) {
  ASSERT_NE(lib().handle, nullptr) << dlerror();
  for (const char* name : {"sf_abi_version", "sf_options_create", "sf_options_destroy", "sf_options_residual_above_keys",
                           "sf_recommended_options", "sf_attention_forward", "sf_attention_backward", "sf_attention_forward_check",
                           "sf_attention_backward_check"})
    EXPECT_NE(dlsym(lib().handle, name), nullptr) << name;
  EXPECT_EQ(lib().abi_version(), SF_C_ABI_VERSION);
  // hidden visibility: the C++ library inside is not exported (it would clash with other copies)
  EXPECT_EQ(dlsym(lib().handle, "_ZN11stableflash9attention10set_optionERNS0_16AttentionOptionsESt17basic_string_viewIcSt11char_traitsIcEES5_S5_"), nullptr);
}

TEST(CApi, BadOptionsAreMessagesNamingTheSetting) {
  Options bad_value(Kv{{"policy", "nope"}});
  EXPECT_EQ(bad_value.handle, nullptr);
  EXPECT_NE(bad_value.error.find("policy = 'nope': expected one of"), std::string::npos) << bad_value.error;
  Options bad_name(Kv{{"polcy", "standard"}});
  EXPECT_EQ(bad_name.handle, nullptr);
  EXPECT_NE(bad_name.error.find("unknown attention setting 'polcy'"), std::string::npos) << bad_name.error;
  Options good(Kv{{"delta_source", "compensated"}, {"device", "cpu"}});
  ASSERT_NE(good.handle, nullptr) << good.error;
  EXPECT_EQ(lib().residual_above_keys(good.handle), 0);  // every call
  Options rounded(Kv{{"device", "cpu"}});
  EXPECT_EQ(lib().residual_above_keys(rounded.handle), INT32_MAX);  // none
  Options automatic(Kv{{"delta_source", "auto"}, {"device", "cpu"}});
  EXPECT_EQ(lib().residual_above_keys(automatic.handle), sa::kAutoExactMaxKeys);
  Options automatic_paper(Kv{{"delta_source", "auto"}, {"numerics", "paper"}, {"device", "cpu"}});
  EXPECT_EQ(lib().residual_above_keys(automatic_paper.handle), 0);
}

TEST(CApi, BadTensorsAreMessagesNamingTheArgument) {
  Options opt(Kv{{"device", "cpu"}});
  ASSERT_NE(opt.handle, nullptr);
  const sf_shape shape{1, 2, 0, 5, 7, 64};
  Problem p({1, 2, 5, 7, 64}, 1);
  std::vector<stableflash::bf16> o(p.q.size());
  std::vector<float> lse(10);
  sf_tensor q = tensor_of(p.q.data(), sa::Layout::bhtd, 2, 5, 64), k = tensor_of(p.k.data(), sa::Layout::bhtd, 2, 7, 64);
  sf_tensor v = tensor_of(p.v.data(), sa::Layout::bhtd, 2, 7, 64), out = tensor_of(o.data(), sa::Layout::bhtd, 2, 5, 64);
  char err[1024] = "";
  sf_tensor null_q = q;
  null_q.data = nullptr;
  EXPECT_EQ(lib().forward(&shape, opt.handle, nullptr, &null_q, &k, &v, &out, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_STREQ(err, "q: required, got NULL");
  std::vector<stableflash::bf16> res(p.q.size());
  sf_tensor res_bthd = tensor_of(res.data(), sa::Layout::bthd, 2, 5, 64);
  Options compensated_opt(Kv{{"device", "cpu"}, {"delta_source", "compensated"}});
  EXPECT_EQ(lib().forward(&shape, compensated_opt.handle, nullptr, &q, &k, &v, &out, lse.data(), &res_bthd, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err).find("o_residual: element strides (b, h, t) (640, 64, 128) differ from o's (640, 320, 64)"),
            std::string::npos) << err;
  EXPECT_EQ(lib().forward(&shape, opt.handle, nullptr, &q, &k, &v, &out, nullptr, nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_STREQ(err, "lse: required, got NULL");
  const sf_shape no_rows{1, 2, 0, 0, 7, 64};
  EXPECT_EQ(lib().forward(&no_rows, opt.handle, nullptr, &q, &k, &v, &out, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err).find("q_len 0"), std::string::npos) << err;
  const sf_shape bad_group{1, 2, 3, 5, 7, 64};  // 3 KV heads do not divide 2 query heads
  EXPECT_EQ(lib().forward(&bad_group, opt.handle, nullptr, &q, &k, &v, &out, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err).find("kv_heads"), std::string::npos) << err;
  Options compensated(Kv{{"device", "cpu"}, {"delta_source", "compensated"}});
  EXPECT_NE(lib().forward(&shape, compensated.handle, nullptr, &q, &k, &v, &out, lse.data(), nullptr, err, sizeof err),
            SF_OK);
  EXPECT_NE(std::string(err).find("o_residual"), std::string::npos) << err;
  EXPECT_EQ(lib().forward(&shape, nullptr, nullptr, &q, &k, &v, &out, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  // a short buffer gets the message's start, terminated
  char tiny[6] = "xxxxx";
  lib().forward(&shape, opt.handle, nullptr, &null_q, &k, &v, &out, lse.data(), nullptr, tiny, sizeof tiny);
  EXPECT_STREQ(tiny, "q: re");
}

TEST(CApi, WithoutAGpuTheCudaPathIsAnErrorNotACrash) {
  if (sa::cuda::has_device()) GTEST_SKIP() << "a GPU is present (the GPU tests cover the CUDA path)";
  Options opt(Kv{{"device", "cuda"}});
  ASSERT_NE(opt.handle, nullptr);
  Problem p({1, 1, 3, 3, 64}, 2);
  std::vector<stableflash::bf16> o(p.q.size());
  std::vector<float> lse(3);
  const sf_shape shape{1, 1, 0, 3, 3, 64};
  sf_tensor q = tensor_of(p.q.data(), sa::Layout::bhtd, 1, 3, 64), k = tensor_of(p.k.data(), sa::Layout::bhtd, 1, 3, 64);
  sf_tensor v = tensor_of(p.v.data(), sa::Layout::bhtd, 1, 3, 64), out = tensor_of(o.data(), sa::Layout::bhtd, 1, 3, 64);
  char err[1024] = "";
  EXPECT_NE(lib().forward(&shape, opt.handle, nullptr, &q, &k, &v, &out, lse.data(), nullptr, err, sizeof err), SF_OK);
  EXPECT_GT(std::strlen(err), 0u);
}

// The recommended attention through the ABI is the library's one definition (what the trainer's
// default reads too), pair for pair, and parses into the C++ recommended_options().
TEST(CApi, RecommendedOptionsAreTheLibrarysOneDefinition) {
  ASSERT_NE(lib().recommended, nullptr);
  const std::string text = lib().recommended();
  Kv pairs;
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t end = std::min(text.find(';', start), text.size()), eq = text.find('=', start);
    ASSERT_LT(eq, end) << text;
    pairs.emplace_back(text.substr(start, eq - start), text.substr(eq + 1, end - eq - 1));
    start = end + 1;
  }
  const auto& want = sa::recommended_settings();
  EXPECT_EQ(pairs, Kv(want.begin(), want.end())) << text;
  pairs.emplace_back("device", "cpu");
  Options opt(pairs);
  ASSERT_NE(opt.handle, nullptr) << opt.error;
  EXPECT_EQ(lib().residual_above_keys(opt.handle), sa::recommended_options().residual_above_keys());
  EXPECT_EQ(lib().recommended(), lib().recommended());  // the same static text every call
}

// Both layouts, grouped-query heads, compensated delta: the ABI's outputs are the C++ entry points'.
TEST(CApi, CpuResultsAreTheEntryPointsBitForBit) {
  for (sa::Layout layout : {sa::Layout::bhtd, sa::Layout::bthd}) {
    SCOPED_TRACE(std::string(sa::to_string(layout)));
    const sa::AttentionShape s{2, 4, 33, 45, 64, /*kv_heads=*/2};
    Problem p(s, 7, 1.0, layout);
    sa::AttentionOptions cpp;
    cpp.numerics = sa::Numerics::fused, cpp.policy = sa::ShiftPolicy::hashed_offset;
    cpp.delta_source = sa::DeltaSource::compensated, cpp.causal = true;
    const sa::testing::FlashRun want = sa::testing::run_flash(p, cpp);

    Options opt(Kv{{"device", "cpu"}, {"policy", "hashed_offset"}, {"delta_source", "compensated"}, {"causal", "true"}});
    ASSERT_NE(opt.handle, nullptr) << opt.error;
    const sf_shape shape{s.batch, s.heads, s.kv_heads, s.q_len, s.k_len, s.head_dim};
    std::vector<stableflash::bf16> o(p.q.size()), res(p.q.size()), dq(p.q.size()), dk(p.k.size()), dv(p.k.size());
    std::vector<float> lse(std::size_t(s.rows()));
    auto qt = [&](const void* d) { return tensor_of(d, layout, s.heads, s.q_len, s.head_dim); };
    auto kt = [&](const void* d) { return tensor_of(d, layout, s.kv_heads, s.k_len, s.head_dim); };
    sf_tensor q = qt(p.q.data()), k = kt(p.k.data()), v = kt(p.v.data()), out = qt(o.data()), r = qt(res.data());
    sf_tensor d_o = qt(p.d_o.data()), gq = qt(dq.data()), gk = kt(dk.data()), gv = kt(dv.data());
    char err[1024] = "";
    ASSERT_EQ(lib().forward(&shape, opt.handle, nullptr, &q, &k, &v, &out, lse.data(), &r, err, sizeof err), SF_OK) << err;
    ASSERT_EQ(lib().backward(&shape, opt.handle, nullptr, &q, &k, &v, &out, lse.data(), &r, &d_o, &gq, &gk, &gv, err,
                             sizeof err), SF_OK) << err;
    const auto same = [](const auto& a, const auto& b) { return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof a[0]) == 0; };
    EXPECT_TRUE(same(o, want.o));
    EXPECT_TRUE(same(res, want.residual));
    EXPECT_TRUE(same(lse, want.lse));
    EXPECT_TRUE(same(dq, want.dq));
    EXPECT_TRUE(same(dk, want.dk));
    EXPECT_TRUE(same(dv, want.dv));
  }
}

// Each tensor's own strides go through: q, k, v, dq, dk, dv as views of one interleaved
// [B, T, 3, H, D] buffer (a fused qkv projection), o and do in [B, T, H, D], give the bits of the
// packed call.
TEST(CApi, StridedViewsGiveThePackedResultsBitForBit) {
  const sa::AttentionShape s{2, 3, 40, 40, 64};
  const int B = s.batch, H = s.heads, T = s.q_len, D = s.head_dim, C = H * D;
  Problem p(s, 11);
  Options opt(Kv{{"device", "cpu"}, {"policy", "hashed_offset"}, {"delta_source", "compensated"}, {"causal", "true"}});
  ASSERT_NE(opt.handle, nullptr) << opt.error;
  const sf_shape shape{B, H, 0, T, T, D};
  char err[1024] = "";
  // packed bhtd
  std::vector<stableflash::bf16> o(p.q.size()), res(p.q.size()), dq(p.q.size()), dk(p.k.size()), dv(p.k.size());
  std::vector<float> lse(std::size_t(s.rows())), lse2(lse.size());
  auto packed = [&](const void* d) { return tensor_of(d, sa::Layout::bhtd, H, T, D); };
  sf_tensor q = packed(p.q.data()), k = packed(p.k.data()), v = packed(p.v.data()), out = packed(o.data());
  sf_tensor r = packed(res.data()), d_o = packed(p.d_o.data()), gq = packed(dq.data()), gk = packed(dk.data()),
            gv = packed(dv.data());
  ASSERT_EQ(lib().forward(&shape, opt.handle, nullptr, &q, &k, &v, &out, lse.data(), &r, err, sizeof err), SF_OK) << err;
  ASSERT_EQ(lib().backward(&shape, opt.handle, nullptr, &q, &k, &v, &out, lse.data(), &r, &d_o, &gq, &gk, &gv, err,
                           sizeof err), SF_OK) << err;
  // interleaved views
  std::vector<stableflash::bf16> qkv(std::size_t(B) * T * 3 * C), grad(qkv.size()), o2(p.q.size()), res2(p.q.size()),
      do2(p.q.size());
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < D; ++d) {
          const std::size_t src = ((std::size_t(b) * H + h) * T + t) * D + d;
          const std::size_t dst = (std::size_t(b) * T + t) * 3 * C + std::size_t(h) * D + d;
          qkv[dst] = p.q[src], qkv[dst + C] = p.k[src], qkv[dst + 2 * C] = p.v[src];
          do2[(std::size_t(b) * T + t) * C + std::size_t(h) * D + d] = p.d_o[src];
        }
  auto view = [&](void* base, std::int64_t offset) { return sf_tensor{static_cast<stableflash::bf16*>(base) + offset, std::int64_t(T) * 3 * C, D, 3 * C}; };
  auto bthd = [&](void* d) { return tensor_of(d, sa::Layout::bthd, H, T, D); };
  sf_tensor q2 = view(qkv.data(), 0), k2 = view(qkv.data(), C), v2 = view(qkv.data(), 2 * C), out2 = bthd(o2.data());
  sf_tensor r2 = bthd(res2.data()), d_o2 = bthd(do2.data());
  sf_tensor gq2 = view(grad.data(), 0), gk2 = view(grad.data(), C), gv2 = view(grad.data(), 2 * C);
  ASSERT_EQ(lib().forward(&shape, opt.handle, nullptr, &q2, &k2, &v2, &out2, lse2.data(), &r2, err, sizeof err), SF_OK) << err;
  ASSERT_EQ(lib().backward(&shape, opt.handle, nullptr, &q2, &k2, &v2, &out2, lse2.data(), &r2, &d_o2, &gq2, &gk2, &gv2,
                           err, sizeof err), SF_OK) << err;
  EXPECT_EQ(std::memcmp(lse.data(), lse2.data(), lse.size() * sizeof(float)), 0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t)
        for (int d = 0; d < D; ++d) {
          const std::size_t src = ((std::size_t(b) * H + h) * T + t) * D + d;
          const std::size_t dst = (std::size_t(b) * T + t) * 3 * C + std::size_t(h) * D + d;
          const std::size_t row = (std::size_t(b) * T + t) * C + std::size_t(h) * D + d;
          ASSERT_EQ(o[src].bits, o2[row].bits) << "o " << src;
          ASSERT_EQ(res[src].bits, res2[row].bits) << "o_residual " << src;
          ASSERT_EQ(dq[src].bits, grad[dst].bits) << "dq " << src;
          ASSERT_EQ(dk[src].bits, grad[dst + C].bits) << "dk " << src;
          ASSERT_EQ(dv[src].bits, grad[dst + 2 * C].bits) << "dv " << src;
        }
}

// The check functions say what the call would say, without running it: on the CPU any strides,
// with device = cuda the CUDA path's alignment rules (cuda::check_supported_args), no GPU needed.
TEST(CApi, ChecksSayWhatTheCallWouldWithoutRunning) {
  const int B = 1, H = 2, T = 16, D = 64;
  const sf_shape shape{B, H, 0, T, T, D};
  alignas(64) static stableflash::bf16 mem[4 * B * H * T * D + 64];
  std::vector<float> lse(B * H * T);
  char err[1024] = "";
  auto t = [&](std::int64_t offset, std::int64_t sb, std::int64_t sh, std::int64_t st) {
    return sf_tensor{mem + offset, sb, sh, st};
  };
  const std::int64_t n = std::int64_t(B) * H * T * D;
  sf_tensor q = t(0, H * T * D, T * D, D), k = t(n, H * T * D, T * D, D), v = t(2 * n, H * T * D, T * D, D);
  sf_tensor o = t(3 * n, H * T * D, T * D, D);
  sf_tensor odd_t = t(n, H * T * (D + 4), T * (D + 4), D + 4);  // rows 68 elements apart
  Options cpu(Kv{{"device", "cpu"}});
  EXPECT_EQ(lib().forward_check(&shape, cpu.handle, &q, &odd_t, &v, &o, lse.data(), nullptr, err, sizeof err), SF_OK) << err;
  sf_tensor null_k{};
  EXPECT_EQ(lib().forward_check(&shape, cpu.handle, &q, &null_k, &v, &o, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_STREQ(err, "k: required, got NULL");
  if (!sa::cuda::built()) GTEST_SKIP() << "built without CUDA: the CUDA rules are not in this library";
  Options gpu(Kv{{"device", "cuda"}});
  EXPECT_EQ(lib().forward_check(&shape, gpu.handle, &q, &k, &v, &o, lse.data(), nullptr, err, sizeof err), SF_OK) << err;
  EXPECT_EQ(lib().forward_check(&shape, gpu.handle, &q, &odd_t, &v, &o, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err).find("strides.k.t = 68 must be a multiple of 8 elements"), std::string::npos) << err;
  sf_tensor shifted_v = t(2 * n + 4, H * T * D, T * D, D);  // 8 bytes off a 16-byte boundary
  EXPECT_EQ(lib().forward_check(&shape, gpu.handle, &q, &k, &shifted_v, &o, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err).find("v must be 16-byte aligned"), std::string::npos) << err;
  // the backward's o is read in 16-byte pieces; the forward writes o in pairs
  sf_tensor o_pairs = t(3 * n + 2, H * T * D, T * D, D);
  EXPECT_EQ(lib().forward_check(&shape, gpu.handle, &q, &k, &v, &o_pairs, lse.data(), nullptr, err, sizeof err), SF_OK) << err;
  EXPECT_EQ(lib().backward_check(&shape, gpu.handle, &q, &k, &v, &o_pairs, lse.data(), nullptr, &o, &q, &k, &v, err,
                                 sizeof err), SF_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err).find("o must be 16-byte aligned"), std::string::npos) << err;
}
