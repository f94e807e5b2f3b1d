/* The C ABI of stableflash attention: plain pointers, shapes, strides, option strings and a
 * cudaStream_t, errors returned as messages. The Python package (python/stableflash) loads it with
 * ctypes, so it never compiles against PyTorch's headers and one wheel serves every PyTorch build
 * of the CUDA major version (docs/python.md). Nothing C++ crosses this boundary: every exception
 * becomes a return code and a message in the caller's buffer.
 *
 * Tensors are BF16 (uint16 bit patterns), logically [B, H, T, D]; each comes with its own element
 * strides of (b, h, t) and a head_dim stride of 1, passed through to the C++ entry points as they
 * are (any view on the CPU; on the GPU rows must be aligned: sf_attention_forward_check below,
 * docs/cuda-kernels.md "Strided tensors"). lse is FP32 [B, H, Tq], contiguous.
 * Device pointers when the options say device=cuda (the default here), host pointers for cpu. */
#ifndef STABLEFLASH_CAPI_STABLEFLASH_C_H
#define STABLEFLASH_CAPI_STABLEFLASH_C_H

#include <stddef.h>
#include <stdint.h>

/* The library is built with hidden visibility (capi/CMakeLists.txt); these are its only exports. */
#if defined(STABLEFLASH_C_BUILD)
#define SF_API __attribute__((visibility("default")))
#else
#define SF_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature or a meaning below changes; the Python loader refuses a library of
 * another. 2: every tensor's strides are passed through (1 took one dense layout for all), and the
 * *_check functions. 3: sf_recommended_options. 4: sf_options_residual_above_keys replaces
 * sf_options_needs_residual (delta_source = auto decides by the key length). */
#define SF_C_ABI_VERSION 4

/* Return codes. */
#define SF_OK 0
#define SF_INVALID_ARGUMENT 1 /* a bad shape, option, pointer or stride: the message names it */
#define SF_RUNTIME_ERROR 2    /* CUDA or another failure while running */

SF_API int sf_abi_version(void);

/* Attention options, parsed once by attention::set_option (the parser of every --flag and trainer
 * setting), so callers can keep a handle per configuration instead of parsing on every call. */
typedef struct sf_options sf_options;

/* keys[i] = values[i] for i < n, applied in order over the defaults (fused numerics, standard
 * policy, rounded delta, device cuda). NULL on error, with the message in err. */
SF_API sf_options* sf_options_create(const char* const* keys, const char* const* values, int n, char* err, size_t err_size);
SF_API void sf_options_destroy(sf_options* options);
/* Calls with more keys (k_len) than this write (forward) and read (backward) o_residual: 0 for
 * delta_source compensated (every call), 128 for auto (the exact delta up to 128 keys, the
 * compensated one above), INT32_MAX for rounded and exact (none). */
SF_API int32_t sf_options_residual_above_keys(const sf_options* options);
/* The attention stableflash recommends, as static text "name=value;name=value;...": the project's
 * one definition of its default (attention::recommended_settings; today fused numerics, the
 * standard shift, delta_source auto (the exact delta up to 128 keys, else the compensated
 * output's), the FP32 normalizer, 7 round bits;
 * docs/numerics-findings.md "Recommendation"). sf_options_create starts from the plain defaults
 * above, not from these: a caller that wants the recommended attention passes these pairs first
 * (the Python package does). Never NULL; owned by the library. */
SF_API const char* sf_recommended_options(void);

typedef struct sf_shape {
  int32_t batch, heads, kv_heads, q_len, k_len, head_dim; /* kv_heads 0: = heads */
} sf_shape;

/* A BF16 tensor, logically [B, H, T, D]: element strides of b, h and t (head_dim's is 1). */
typedef struct sf_tensor {
  void* data;
  int64_t stride_b, stride_h, stride_t;
} sf_tensor;

/* o_residual may be NULL (or have NULL data) unless delta_source = compensated. stream: a
 * cudaStream_t (NULL: the legacy default stream), ignored on the CPU. The call is asynchronous on
 * the stream: no device synchronisation, outputs are ready in stream order. */
SF_API int sf_attention_forward(const sf_shape* shape, const sf_options* options, void* stream, const sf_tensor* q,
                         const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, float* lse,
                         const sf_tensor* o_residual, char* err, size_t err_size);

/* o, lse, o_residual: what the forward wrote; dq is shaped like q, dk and dv like k and v. */
SF_API int sf_attention_backward(const sf_shape* shape, const sf_options* options, void* stream, const sf_tensor* q,
                          const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                          const sf_tensor* o_residual, const sf_tensor* d_o, const sf_tensor* dq,
                          const sf_tensor* dk, const sf_tensor* dv, char* err, size_t err_size);

/* Whether the call with these arguments would be accepted, without running anything (no GPU
 * needed): the checks of sf_attention_forward / _backward, and for options with device = cuda the
 * CUDA path's (cuda::check_supported_args: shape, options, each tensor's address and strides aligned as
 * the kernels need). Pointers are only looked at (their alignment), never read. SF_OK, or the code
 * and message the call would give. In a build without CUDA, device = cuda is SF_RUNTIME_ERROR. */
SF_API int sf_attention_forward_check(const sf_shape* shape, const sf_options* options, const sf_tensor* q,
                               const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                               const sf_tensor* o_residual, char* err, size_t err_size);
SF_API int sf_attention_backward_check(const sf_shape* shape, const sf_options* options, const sf_tensor* q,
                                const sf_tensor* k, const sf_tensor* v, const sf_tensor* o, const float* lse,
                                const sf_tensor* o_residual, const sf_tensor* d_o, const sf_tensor* dq,
                                const sf_tensor* dk, const sf_tensor* dv, char* err, size_t err_size);

#ifdef __cplusplus
}
#endif

#endif
