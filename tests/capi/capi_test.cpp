// The C ABI library (capi/, what the Python package loads): it loads with dlopen as ctypes does,
// exports the sf_* functions, reports bad input as messages that name the argument, and on the CPU
// computes exactly what attention_forward/backward compute (the ABI adds no numerics of its own).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "stableflash/attention/cuda.hpp"
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
  decltype(&sf_options_needs_residual) needs_residual = nullptr;
  decltype(&sf_attention_forward) forward = nullptr;
  decltype(&sf_attention_backward) backward = nullptr;

  Lib() {
    handle = dlopen(STABLEFLASH_C_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return;
    abi_version = reinterpret_cast<decltype(abi_version)>(dlsym(handle, "sf_abi_version"));
    options_create = reinterpret_cast<decltype(options_create)>(dlsym(handle, "sf_options_create"));
    options_destroy = reinterpret_cast<decltype(options_destroy)>(dlsym(handle, "sf_options_destroy"));
    needs_residual = reinterpret_cast<decltype(needs_residual)>(dlsym(handle, "sf_options_needs_residual"));
    forward = reinterpret_cast<decltype(forward)>(dlsym(handle, "sf_attention_forward"));
    backward = reinterpret_cast<decltype(backward)>(dlsym(handle, "sf_attention_backward"));
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
  for (const char* name : {"sf_abi_version", "sf_options_create", "sf_options_destroy", "sf_options_needs_residual",
                           "sf_attention_forward", "sf_attention_backward"})
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
  EXPECT_EQ(lib().needs_residual(good.handle), 1);
  Options rounded(Kv{{"device", "cpu"}});
  EXPECT_EQ(lib().needs_residual(rounded.handle), 0);
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
  sf_tensor k_bthd = tensor_of(p.k.data(), sa::Layout::bthd, 2, 7, 64);
  EXPECT_EQ(lib().forward(&shape, opt.handle, nullptr, &q, &k_bthd, &v, &out, lse.data(), nullptr, err, sizeof err),
            SF_INVALID_ARGUMENT);
  EXPECT_NE(std::string(err).find("k: element strides (b, h, t) (896, 64, 128) are not the dense bhtd layout"),
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
