"""stableflash attention for PyTorch: one changed line from SDPA (docs/python.md).

    from stableflash.torch import attention
    y = attention(q, k, v, causal=True)          # was F.scaled_dot_product_attention(q, k, v, is_causal=True)
"""
import math

import torch  # before the C library: it brings the CUDA 13 runtime that libstableflash_c.so links

from .. import _capi
from . import _layout, _ops

__all__ = ["attention", "DEFAULTS"]

# The attention stableflash recommends and the trainer uses, read from the C library's one definition
# (sf_recommended_options; docs/numerics-findings.md "Recommendation"): fused numerics, the standard
# shift, delta from the compensated output, the FP32 normalizer, 7 round bits. Name -> value text.
DEFAULTS = dict(_capi.recommended())
# the recommended knobs attention() has no argument for (normalizer, round_bits): sent with every call
_OTHER_DEFAULTS = tuple((k, v) for k, v in DEFAULTS.items() if k not in ("numerics", "policy", "delta_source"))


def _check(q, k, v, layout):
    # the common case in one expression (this runs per call); the messages below only on a failure
    bf16, tensor = torch.bfloat16, torch.Tensor
    if (isinstance(q, tensor) and isinstance(k, tensor) and isinstance(v, tensor) and q.dim() == 4 and k.dim() == 4
            and v.dim() == 4 and q.dtype is bf16 and k.dtype is bf16 and v.dtype is bf16 and q.stride(-1) == 1
            and k.stride(-1) == 1 and v.stride(-1) == 1 and (layout == "bhtd" or layout == "bthd")):
        qs, ks = q.shape, k.shape
        h = 1 if layout == "bhtd" else 2
        if (ks == v.shape and ks[0] == qs[0] and ks[3] == qs[3] and ks[h] >= 1 and qs[h] % ks[h] == 0
                and k.device == q.device and v.device == q.device):
            return
    _explain(q, k, v, layout)


def _explain(q, k, v, layout):
    """Raises the error that names what _check refused."""
    if layout not in ("bhtd", "bthd"):
        raise ValueError(f"stableflash attention: layout = {layout!r}: expected 'bhtd' ([B, H, T, D], SDPA's order) "
                         "or 'bthd' ([B, T, H, D])")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"stableflash attention: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"stableflash attention: {name} has shape {tuple(x.shape)}: expected 4 dims "
                             f"({'[B, H, T, D]' if layout == 'bhtd' else '[B, T, H, D]'})")
        if x.dtype != torch.bfloat16:
            raise ValueError(f"stableflash attention: {name} is {x.dtype}: expected torch.bfloat16 (cast with "
                             f".to(torch.bfloat16), or run under torch.autocast('cuda', dtype=torch.bfloat16))")
        if x.device != q.device:
            raise ValueError(f"stableflash attention: {name} is on {x.device}, q on {q.device}: expected one device")
        if x.stride(-1) != 1:
            raise ValueError(f"stableflash attention: {name} has stride {x.stride(-1)} along head_dim: expected 1 "
                             "(head_dim contiguous)")
    if k.shape != v.shape:
        raise ValueError(f"stableflash attention: k {tuple(k.shape)} and v {tuple(v.shape)}: expected one shape")
    # [B, H, T, D] indices of batch, heads, length, head_dim in the caller's order
    b, h, t = (0, 1, 2) if layout == "bhtd" else (0, 2, 1)
    if k.shape[b] != q.shape[b] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"stableflash attention: q {tuple(q.shape)} and k {tuple(k.shape)} ({layout}): expected the "
                         "same batch and head_dim")
    if k.shape[h] < 1 or q.shape[h] % k.shape[h] != 0:
        raise ValueError(f"stableflash attention: k has {k.shape[h]} heads, q {q.shape[h]} ({layout}): expected k's "
                         "heads to divide q's (grouped-query attention)")
    raise AssertionError("stableflash attention: _check refused what _explain accepts")  # the two disagree


def _options_text(numerics, policy, delta_source, deterministic, options):
    """The op's options string: the knobs, the other recommended settings, then `options` (the parser
    applies them in order, so these override)."""
    pairs = [("numerics", numerics), ("policy", policy), ("delta_source", delta_source), *_OTHER_DEFAULTS,
             ("deterministic", "true" if deterministic else "false")]
    for key, value in sorted((options or {}).items()):
        if any(c in f"{key}{value}" for c in ";="):
            raise ValueError(f"stableflash attention: options {{{key!r}: {value!r}}}: expected a setting name and "
                             "value without ';' or '='")
        pairs.append((str(key), str(value)))
    return ";".join(f"{key}={value}" for key, value in pairs)


_TEXTS = {}  # (numerics, policy, delta_source, deterministic) -> the options string of a call without `options`


def _text(numerics, policy, delta_source, deterministic, options):
    if options or torch.compiler.is_compiling():  # Dynamo traces the string's making (a constant)
        return _options_text(numerics, policy, delta_source, deterministic, options)
    key = (numerics, policy, delta_source, deterministic)
    text = _TEXTS.get(key)
    if text is None:
        text = _options_text(numerics, policy, delta_source, deterministic, None)
        if len(_TEXTS) < 64:
            _TEXTS[key] = text
    return text


def attention(q, k, v, causal=False, scale=None, policy=DEFAULTS["policy"], delta_source=DEFAULTS["delta_source"],
              numerics=DEFAULTS["numerics"], layout="bhtd", deterministic=False, options=None):
    """Attention softmax(q kᵀ · scale) v in BF16 with stableflash's kernels (CUDA; CPU tensors run the
    CPU implementation of the same numerics).

    q: [B, H, Tq, D], k and v: [B, H_kv, Tk, D] (H_kv dividing H: grouped-query attention) for
    layout="bhtd", SDPA's order; [B, T, H, D] for layout="bthd". BF16, head_dim contiguous, any
    other strides. causal: bottom-right aligned (the last query sees every key; SDPA's is_causal is
    top-left: the same when Tq == Tk). scale: None for 1/sqrt(D). policy, delta_source, numerics,
    deterministic and `options` (a dict of any further attention setting, e.g. {"tile_k": "256"})
    are read by the C++ option parser: the same names and values as `stableflash attention --help`;
    what is not given is the recommended attention (DEFAULTS: fused numerics, the standard shift,
    delta from the compensated output).
    Any strides: every tensor is read and written through its own (on the GPU rows must start
    16-byte aligned; a view that breaks this is copied once, docs/python.md). Returns o dense in the
    layout of q (bthd for the views of a fused qkv projection), differentiable in q, k and v.
    """
    _check(q, k, v, layout)
    if layout == "bthd":  # to the op's [B, H, T, D] order: views, no copies
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    # Each tensor goes to the kernels with its own strides (split / view / transpose views of a fused
    # qkv projection run without copies); the op itself copies only a view whose rows the CUDA kernels
    # cannot address (_layout.for_kernels): inside the op, so that torch.compile never traces the
    # storage offset it reads.
    text = _text(numerics, policy, delta_source, bool(deterministic), options)
    if scale is None:
        scale = 0.0
    elif not (math.isfinite(scale) and scale != 0):
        raise ValueError(f"stableflash attention: scale = {scale}: expected a finite non-zero number (None: 1/sqrt(D))")
    # torch.ops.stableflash.attention_forward(...)[0]; in plain eager mode without the dispatcher's round trip
    o = _ops.forward(q, k, v, bool(causal), float(scale), text)
    return o.transpose(1, 2) if layout == "bthd" else o
