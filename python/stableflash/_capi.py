"""ctypes binding of libstableflash_c.so (include/stableflash/capi/stableflash_c.h). No torch here:
pointers, shapes and strides in, exceptions out. The library is found in the package's _lib/ (the
wheel puts it there) or at $STABLEFLASH_C_LIB (a build tree)."""
import collections
import ctypes
import functools
import os
import struct
import threading

ABI_VERSION = 4  # SF_C_ABI_VERSION of the header this file was written against
_OK, _INVALID_ARGUMENT = 0, 1


# The arguments of one call, as the header lays them out: sf_shape (six int32) and sf_tensor (data
# pointer, an int with 0 for NULL, and the element strides of b, h, t: four 8-byte fields). Callers
# pass plain tuples in these orders (the op builds them per call); the namedtuples name the fields
# for readers and tests.
Shape = collections.namedtuple("Shape", "batch heads kv_heads q_len k_len head_dim")
Tensor = collections.namedtuple("Tensor", "data stride_b stride_h stride_t")

# One block per thread holds a call's shape and tensors, packed in one struct.pack_into (cheaper than
# a ctypes.Structure per tensor): sf_shape at 0 (24 bytes), then sf_tensor i at 24 + 32 i (8-aligned).
_SHAPE_BYTES, _TENSOR_BYTES, _MAX_TENSORS = 24, 32, 9
_FORWARD_ARGS = struct.Struct("=6i" + "Q3q" * 5)  # shape; q, k, v, o, o_residual
_BACKWARD_ARGS = struct.Struct("=6i" + "Q3q" * 9)  # shape; q, k, v, o, o_residual, d_o, dq, dk, dv
_NO_TENSOR = (0, 0, 0, 0)  # an absent o_residual: passed as NULL


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
    lib.sf_abi_version.restype, lib.sf_abi_version.argtypes = i32, []
    lib.sf_options_create.restype = vp
    lib.sf_options_create.argtypes = [ctypes.POINTER(cp), ctypes.POINTER(cp), i32, cp, sz]
    lib.sf_options_destroy.restype, lib.sf_options_destroy.argtypes = None, [vp]
    lib.sf_options_residual_above_keys.restype, lib.sf_options_residual_above_keys.argtypes = i32, [vp]
    lib.sf_recommended_options.restype, lib.sf_recommended_options.argtypes = cp, []
    # the calls: every pointer (shape, options, stream, tensors, lse, error buffer) as an address
    lib.sf_attention_forward.restype = i32
    lib.sf_attention_forward.argtypes = [vp] * 9 + [vp, sz]
    lib.sf_attention_backward.restype = i32
    lib.sf_attention_backward.argtypes = [vp] * 13 + [vp, sz]
    lib.sf_attention_forward_check.restype = i32
    lib.sf_attention_forward_check.argtypes = [vp] * 8 + [vp, sz]
    lib.sf_attention_backward_check.restype = i32
    lib.sf_attention_backward_check.argtypes = [vp] * 12 + [vp, sz]
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


class _Block:
    """A thread's argument block and error buffer, and their addresses (the backward of a CUDA
    tensor runs on autograd's device thread, so each thread has its own)."""

    def __init__(self):
        self.args = ctypes.create_string_buffer(_SHAPE_BYTES + _TENSOR_BYTES * _MAX_TENSORS)
        self.err = ctypes.create_string_buffer(2048)
        base = ctypes.addressof(self.args)
        self.shape = base
        self.tensors = tuple(base + _SHAPE_BYTES + _TENSOR_BYTES * i for i in range(_MAX_TENSORS))
        self.err_ptr, self.err_size = ctypes.addressof(self.err), len(self.err)


def _block():
    block = getattr(_local, "block", None)
    if block is None:
        block = _local.block = _Block()
    return block


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
        buf = _block().err
        self._lib = lib()
        self.handle = self._lib.sf_options_create(keys, values, n, buf, len(buf))
        if not self.handle:
            raise ValueError(buf.value.decode('utf-8', 'replace'))  # names the setting and its source
        # calls with more keys than this write and read o_residual (sf_options_residual_above_keys)
        self.residual_above_keys = self._lib.sf_options_residual_above_keys(self.handle)

    def needs_residual(self, k_len):
        """Whether a call with k_len keys writes (forward) and reads (backward) o_residual: delta_source
        compensated, or auto above 128 keys. A symbolic k_len (torch.compile) gives a symbolic bool."""
        return k_len > self.residual_above_keys

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
    """sf_attention_forward. shape: (batch, heads, kv_heads, q_len, k_len, head_dim); q, k, v, o,
    o_residual: (data pointer, stride_b, stride_h, stride_t), o_residual None when not written;
    stream: a cudaStream_t as an int (None: the legacy default stream; ignored on the CPU)."""
    blk = _block()
    _FORWARD_ARGS.pack_into(blk.args, 0, *shape, *q, *k, *v, *o, *(o_residual or _NO_TENSOR))
    t = blk.tensors
    rc = (_lib or lib()).sf_attention_forward(blk.shape, opts.handle, stream, t[0], t[1], t[2], t[3], lse_ptr,
                                              t[4] if o_residual else None, blk.err_ptr, blk.err_size)
    if rc != _OK:
        _raise(rc, blk.err, "attention forward")


def backward(shape, opts, stream, q, k, v, o, lse_ptr, o_residual, d_o, dq, dk, dv):
    """sf_attention_backward, with the arguments of forward and d_o, dq, dk, dv."""
    blk = _block()
    _BACKWARD_ARGS.pack_into(blk.args, 0, *shape, *q, *k, *v, *o, *(o_residual or _NO_TENSOR), *d_o, *dq, *dk, *dv)
    t = blk.tensors
    rc = (_lib or lib()).sf_attention_backward(blk.shape, opts.handle, stream, t[0], t[1], t[2], t[3], lse_ptr,
                                               t[4] if o_residual else None, t[5], t[6], t[7], t[8], blk.err_ptr,
                                               blk.err_size)
    if rc != _OK:
        _raise(rc, blk.err, "attention backward")


def check(direction, shape, opts, q, k, v, o, lse_ptr, o_residual, d_o=None, dq=None, dk=None, dv=None):
    """Whether the call would be accepted, without running it (sf_attention_*_check: with options for
    device=cuda, the CUDA path's checks; no GPU needed): None, or the message the call would raise.
    Arguments as forward's and backward's."""
    blk = _block()
    t = blk.tensors
    res = t[4] if o_residual else None
    if direction == "forward":
        _FORWARD_ARGS.pack_into(blk.args, 0, *shape, *q, *k, *v, *o, *(o_residual or _NO_TENSOR))
        rc = lib().sf_attention_forward_check(blk.shape, opts.handle, t[0], t[1], t[2], t[3], lse_ptr, res,
                                              blk.err_ptr, blk.err_size)
    else:
        _BACKWARD_ARGS.pack_into(blk.args, 0, *shape, *q, *k, *v, *o, *(o_residual or _NO_TENSOR), *d_o, *dq, *dk, *dv)
        rc = lib().sf_attention_backward_check(blk.shape, opts.handle, t[0], t[1], t[2], t[3], lse_ptr, res, t[5],
                                               t[6], t[7], t[8], blk.err_ptr, blk.err_size)
    return None if rc == _OK else blk.err.value.decode("utf-8", "replace")
