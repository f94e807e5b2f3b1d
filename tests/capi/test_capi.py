#!/usr/bin/env python3
"""The Python package's C ABI loader (python/stableflash/_capi.py) without torch, on the CPU: the
library loads, bad options and tensors raise ValueError naming them, and a call computes the one
case whose answer is exact (a single key: o = v). Exits 1 on any failure.

    STABLEFLASH_C_LIB=build/capi/libstableflash_c.so PYTHONPATH=python python3 tests/capi/test_capi.py
"""
import ctypes
import random
import struct
import sys

from stableflash import _capi

TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def bf16_bits(x):
    """BF16 bits of a float that BF16 holds exactly (the values used here)."""
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def expect_error(cls, text, fn):
    try:
        fn()
    except cls as e:
        assert text in str(e), f"message {str(e)!r} lacks {text!r}"
        return
    raise AssertionError(f"no {cls.__name__} containing {text!r}")


@test
def loads_with_its_abi_version():
    assert _capi.lib().sf_abi_version() == _capi.ABI_VERSION


@test
def recommended_options_parse_and_need_the_residual_above_one_key_block():
    # the library's one definition of the default attention (sf_recommended_options), as pairs the
    # parser takes; stableflash.torch's DEFAULTS and the trainer's default are these. delta_source
    # auto: the exact delta up to 128 keys (no residual), the compensated one above
    pairs = _capi.recommended()
    assert [k for k, _ in pairs] == ["numerics", "policy", "delta_source", "normalizer", "round_bits"], pairs
    assert dict(pairs)["delta_source"] == "auto", pairs
    opts = _capi.options(pairs + (("device", "cpu"),))
    assert not opts.needs_residual(128) and opts.needs_residual(129), opts.residual_above_keys


@test
def bad_options_raise_naming_the_setting():
    expect_error(ValueError, "policy = 'nope': expected one of", lambda: _capi.Options((("policy", "nope"),)))
    expect_error(ValueError, "unknown attention setting 'polcy'", lambda: _capi.Options((("polcy", "x"),)))
    assert _capi.options((("delta_source", "compensated"),)).needs_residual(1)
    assert not _capi.options((("delta_source", "exact"),)).needs_residual(10 ** 6)
    assert _capi.options((("device", "cpu"),)) is _capi.options((("device", "cpu"),))  # parsed once


def buffers(b, h, tq, tk, d, seed):
    rnd = random.Random(seed)
    vals = [i / 8.0 for i in range(-16, 17)]  # exact in BF16
    mk = lambda n: (ctypes.c_uint16 * n)(*[bf16_bits(rnd.choice(vals)) for _ in range(n)])
    return mk(b * h * tq * d), mk(b * h * tk * d), mk(b * h * tk * d)


def dense(buf, h, t, d):
    return _capi.Tensor(ctypes.addressof(buf), h * t * d, t * d, d)


@test
def one_key_gives_v_exactly():
    b, h, tq, tk, d = 2, 3, 5, 1, 64
    q, k, v = buffers(b, h, tq, tk, d, 1)
    o = (ctypes.c_uint16 * (b * h * tq * d))()
    lse = (ctypes.c_float * (b * h * tq))()
    # the standard shift: P-bar = exp(0) = 1 exactly (an offset policy's P-bar < 1 rounds in P-bar V)
    opts = _capi.options((("device", "cpu"), ("policy", "standard")))
    _capi.forward(_capi.Shape(b, h, h, tq, tk, d), opts, None, dense(q, h, tq, d), dense(k, h, tk, d),
                  dense(v, h, tk, d), dense(o, h, tq, d), ctypes.addressof(lse), None)
    for bh in range(b * h):
        for i in range(tq):
            row = o[(bh * tq + i) * d:(bh * tq + i + 1) * d]
            assert list(row) == list(v[bh * d:(bh + 1) * d]), f"(b*h {bh}, row {i}) != v"


@test
def bad_tensors_raise_naming_the_argument():
    b, h, t, d = 1, 2, 4, 64
    q, k, v = buffers(b, h, t, t, d, 2)
    o = (ctypes.c_uint16 * (b * h * t * d))()
    lse = (ctypes.c_float * (b * h * t))()
    opts = _capi.options((("device", "cpu"),))
    call = lambda kk, shape=_capi.Shape(b, h, h, t, t, d): _capi.forward(
        shape, opts, None, dense(q, h, t, d), kk, dense(v, h, t, d), dense(o, h, t, d), ctypes.addressof(lse), None)
    res = (ctypes.c_uint16 * (b * h * t * d))()
    bthd_res = _capi.Tensor(ctypes.addressof(res), t * h * d, d, h * d)
    expect_error(ValueError, "o_residual: element strides (b, h, t) (512, 64, 128) differ from o's (512, 256, 64)",
                 lambda: _capi.forward(_capi.Shape(b, h, h, t, t, d), _capi.options((("device", "cpu"), ("delta_source", "compensated"))),
                                       None, dense(q, h, t, d), dense(k, h, t, d), dense(v, h, t, d), dense(o, h, t, d),
                                       ctypes.addressof(lse), bthd_res))
    expect_error(ValueError, "kv_heads", lambda: call(dense(k, h, t, d), _capi.Shape(b, h, 3, t, t, d)))
    null = _capi.Tensor(0, 0, 0, 0)
    expect_error(ValueError, "k: required, got NULL", lambda: call(null))


@test
def each_tensor_has_its_own_strides():
    b, h, t, d = 1, 2, 6, 64
    q, k, v = buffers(b, h, t, t, d, 3)
    k_bthd = (ctypes.c_uint16 * len(k))()
    for hh in range(h):
        for tt in range(t):
            k_bthd[(tt * h + hh) * d:(tt * h + hh + 1) * d] = k[(hh * t + tt) * d:(hh * t + tt + 1) * d]
    opts = _capi.options((("device", "cpu"),))
    outs = []
    for kk in (dense(k, h, t, d), _capi.Tensor(ctypes.addressof(k_bthd), t * h * d, d, h * d)):
        o = (ctypes.c_uint16 * (b * h * t * d))()
        lse = (ctypes.c_float * (b * h * t))()
        _capi.forward(_capi.Shape(b, h, h, t, t, d), opts, None, dense(q, h, t, d), kk, dense(v, h, t, d),
                      dense(o, h, t, d), ctypes.addressof(lse), None)
        outs.append(list(o))
    assert outs[0] == outs[1], "k in [B, T, H, D] memory gave other bits than k in [B, H, T, D]"


def main():
    failed = 0
    for t in TESTS:
        try:
            t()
            print(f"ok      {t.__name__}")
        except Exception as e:  # report every test, then fail the run
            failed += 1
            print(f"FAILED  {t.__name__}: {type(e).__name__}: {e}")
    print(f"{len(TESTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
