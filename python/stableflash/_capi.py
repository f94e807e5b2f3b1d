"""ctypes binding of libstableflash_c.so (include/stableflash/capi/stableflash_c.h). No torch here:
pointers, shapes and strides in, exceptions out. The library is found in the package's _lib/ (the
wheel puts it there) or at $STABLEFLASH_C_LIB (a build tree)."""
import ctypes
import functools
import os
import threading

ABI_VERSION = 3  # SF_C_ABI_VERSION of the header this file was written against
_OK, _INVALID_ARGUMENT = 0, 1


class Shape(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int32) for n in ("batch", "heads", "kv_heads", "q_len", "k_len", "head_dim")]


class Tensor(ctypes.Structure):
    """A BF16 tensor, logically [B, H, T, D]: data pointer and element strides of b, h, t."""
    _fields_ = [("data", ctypes.c_void_p), ("stride_b", ctypes.c_int64), ("stride_h", ctypes.c_int64),
                ("stride_t", ctypes.c_int64)]


def library_path():
    env = os.environ.get("STABLEFLASH_C_LIB")
    return env if env else os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib", "libstableflash_c.so")


def _load():
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        # The usual cause on a GPU machine: libcudart.so.13 not loaded yet. PyTorch's CUDA 13 build
        # brings it, so `import torch` first (stableflash.torch does), or put it on LD_LIBRARY_PATH.
        raise ImportError(f"stableflash: cannot load the C ABI library {path}: {e}. It needs the CUDA 13 runtime "
                          "(libcudart.so.13, loaded by `import torch` of a CUDA 13 PyTorch) and libgomp.") from e
    vp, i32, sz, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
    tp = ctypes.POINTER(Tensor)
    lib.sf_abi_version.restype, lib.sf_abi_version.argtypes = i32, []
    lib.sf_options_create.restype = vp
    lib.sf_options_create.argtypes = [ctypes.POINTER(cp), ctypes.POINTER(cp), i32, cp, sz]
    lib.sf_options_destroy.restype, lib.sf_options_destroy.argtypes = None, [vp]
    lib.sf_options_needs_residual.restype, lib.sf_options_needs_residual.argtypes = i32, [vp]
    lib.sf_recommended_options.restype, lib.sf_recommended_options.argtypes = cp, []
    lib.sf_attention_forward.restype = i32
    lib.sf_attention_forward.argtypes = [ctypes.POINTER(Shape), vp, vp, tp, tp, tp, tp, vp, tp, cp, sz]
    lib.sf_attention_backward.restype = i32
    lib.sf_attention_backward.argtypes = [ctypes.POINTER(Shape), vp, vp, tp, tp, tp, tp, vp, tp, tp, tp, tp, tp, cp, sz]
    lib.sf_attention_forward_check.restype = i32
    lib.sf_attention_forward_check.argtypes = [ctypes.POINTER(Shape), vp, tp, tp, tp, tp, vp, tp, cp, sz]
    lib.sf_attention_backward_check.restype = i32
    lib.sf_attention_backward_check.argtypes = [ctypes.POINTER(Shape), vp, tp, tp, tp, tp, vp, tp, tp, tp, tp, tp, cp, sz]
    found = lib.sf_abi_version()
    if found != ABI_VERSION:
        raise ImportError(f"stableflash: {path} has C ABI version {found}, this package needs {ABI_VERSION}; "
                          "rebuild the wheel (scripts/build-wheel.sh)")
    return lib


_lib = None
_lock = threading.Lock()
_local = threading.local()


def lib():
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load()
    return _lib


def _error_buffer():
    buf = getattr(_local, "err", None)
    if buf is None:
        buf = _local.err = ctypes.create_string_buffer(2048)
    return buf


def _raise(rc, buf, what):
    message = buf.value.decode("utf-8", "replace")
    cls = ValueError if rc == _INVALID_ARGUMENT else RuntimeError
    raise cls(f"stableflash {what}: {message}")


class Options:
    """Parsed attention options (a handle of the C library; freed with the object)."""

    def __init__(self, pairs):
        n = len(pairs)
        keys = (ctypes.c_char_p * n)(*[k.encode() for k, _ in pairs])
        values = (ctypes.c_char_p * n)(*[v.encode() for _, v in pairs])
        buf = _error_buffer()
        self._lib = lib()
        self.handle = self._lib.sf_options_create(keys, values, n, buf, len(buf))
        if not self.handle:
            raise ValueError(buf.value.decode('utf-8', 'replace'))  # names the setting and its source
        self.needs_residual = bool(self._lib.sf_options_needs_residual(self.handle))

    def __del__(self):
        if getattr(self, "handle", None):
            self._lib.sf_options_destroy(self.handle)
            self.handle = None


@functools.lru_cache(maxsize=1)
def recommended():
    """The attention stableflash recommends, as (name, value) string pairs: the C++ library's one
    definition of the project's default (sf_recommended_options), read once."""
    text = lib().sf_recommended_options().decode()
    return tuple(tuple(item.split("=", 1)) for item in text.split(";") if item)


@functools.lru_cache(maxsize=256)
def options(pairs):
    """Options for a tuple of (key, value) string pairs, parsed once per distinct tuple."""
    return Options(pairs)


def forward(shape, opts, stream, q, k, v, o, lse_ptr, o_residual):
    buf = _error_buffer()
    rc = lib().sf_attention_forward(ctypes.byref(shape), opts.handle, stream, ctypes.byref(q), ctypes.byref(k),
                                    ctypes.byref(v), ctypes.byref(o), lse_ptr,
                                    ctypes.byref(o_residual) if o_residual is not None else None, buf, len(buf))
    if rc != _OK:
        _raise(rc, buf, "attention forward")


def backward(shape, opts, stream, q, k, v, o, lse_ptr, o_residual, d_o, dq, dk, dv):
    buf = _error_buffer()
    ref = ctypes.byref
    rc = lib().sf_attention_backward(ref(shape), opts.handle, stream, ref(q), ref(k), ref(v), ref(o), lse_ptr,
                                     ref(o_residual) if o_residual is not None else None, ref(d_o), ref(dq),
                                     ref(dk), ref(dv), buf, len(buf))
    if rc != _OK:
        _raise(rc, buf, "attention backward")


def check(direction, shape, opts, q, k, v, o, lse_ptr, o_residual, d_o=None, dq=None, dk=None, dv=None):
    """Whether the call would be accepted, without running it (sf_attention_*_check: with options for
    device=cuda, the CUDA path's checks; no GPU needed): None, or the message the call would raise."""
    buf = _error_buffer()
    ref = ctypes.byref
    res = ref(o_residual) if o_residual is not None else None
    if direction == "forward":
        rc = lib().sf_attention_forward_check(ref(shape), opts.handle, ref(q), ref(k), ref(v), ref(o), lse_ptr, res,
                                              buf, len(buf))
    else:
        rc = lib().sf_attention_backward_check(ref(shape), opts.handle, ref(q), ref(k), ref(v), ref(o), lse_ptr, res,
                                               ref(d_o), ref(dq), ref(dk), ref(dv), buf, len(buf))
    return None if rc == _OK else buf.value.decode("utf-8", "replace")
