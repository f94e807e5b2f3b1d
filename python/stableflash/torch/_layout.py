"""Memory of the op's tensors, logically [B, H, T, D] (the op's dim order): which views the kernels
take as they are, and the layout outputs are allocated in. "bthd" memory is a [B, H, T, D] tensor
whose storage is [B, T, H, D], as `x.view(B, T, H, D).transpose(1, 2)` gives in a transformer block.

Every tensor goes to the C++ attention with its own strides (ForwardStrides / BackwardStrides): the
CPU takes any view; the CUDA kernels need each row (b, h, t) to start aligned (cuda::check_supported_args,
docs/cuda-kernels.md "Strided tensors"). The op copies only what that check would refuse, decided
here from the strides before the call (no exception path per call): the one rule, mirrored below."""
import torch

# Bytes every row of a tensor must be aligned to on the GPU: attention/cuda/entry.cu, forward_tensors
# / backward_tensors (the C++ check). The forward writes o and o_residual in pairs; the backward reads
# them, q, k, v and do by bulk tensor copies and 16-byte loads, and writes dq, dk, dv 4 values at a
# time. tests/python/test_op_cpu.py checks this rule against the C++ check (the C ABI's
# sf_attention_*_check) on a set of arrangements.
FORWARD_ALIGN = {"q": 16, "k": 16, "v": 16, "o": 4, "o_residual": 4}
BACKWARD_ALIGN = {"q": 16, "k": 16, "v": 16, "o": 16, "o_residual": 16, "do": 16, "dq": 8, "dk": 8, "dv": 8}


def rows_aligned(x, align):
    """Whether every row (b, h, t) of x starts `align` bytes aligned, as cuda::check_supported_args decides:
    the start and the strides of b, h and t (in bytes) are non-negative multiples of `align`. A
    dimension of extent 1 is never stepped (the C++ side takes the packed stride, a multiple of D, in
    its place). The start is judged by the storage offset: PyTorch's allocators align every storage
    (CUDA's caching allocator to 512 bytes, the CPU's to 64), and a fake tensor under torch.compile has
    no address; memory from elsewhere (from_blob, DLPack) at an odd address gets the C++ check's
    ValueError, which names the tensor."""
    elems = align // x.element_size()
    if x.storage_offset() % elems != 0:
        return False
    shape, stride = x.shape, x.stride()  # once: each call is a trip into C++, and this runs per call
    return all(shape[i] == 1 or (stride[i] >= 0 and stride[i] % elems == 0) for i in range(3))


def _dense(shape, stride, dims):
    """Whether a tensor is dense with `dims` ordered outermost first, as is_contiguous decides for
    the permuted tensor (strides of extent-1 dimensions are ignored)."""
    expected = 1
    for i in reversed(dims):
        if shape[i] != 1:
            if stride[i] != expected:
                return False
            expected *= shape[i]
    return True


def order(x):
    """The dense layout closest to x: 'bhtd' or 'bthd' when x is dense in it (bhtd first), else
    'bthd' when its token stride exceeds its head stride (the views of a fused qkv projection,
    [B, T, 3, H, D]), else 'bhtd'."""
    if x.is_contiguous():
        return "bhtd"
    shape, stride = x.shape, x.stride()
    if _dense(shape, stride, (0, 2, 1, 3)):
        return "bthd"
    return "bthd" if stride[2] > stride[1] else "bhtd"


def dense_copy(x, layout):
    """A copy of x dense in `layout` (always a copy: x.contiguous() would return a dense x at an
    unaligned storage offset unchanged)."""
    if layout == "bhtd":
        return x.clone(memory_format=torch.contiguous_format)
    return x.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)


def for_kernels(x, align):
    """x as the kernels take it: x itself on the CPU (any strides) and on the GPU when its rows are
    aligned (rows_aligned), else one copy dense in the layout closest to x. The head dimension must
    be contiguous on both (the C ABI has no stride for it): dO from autograd may be an expanded
    tensor (all strides 0, e.g. the gradient of o.sum()), which is copied too."""
    if (x.stride(-1) == 1 or x.shape[-1] == 1) and (not x.is_cuda or rows_aligned(x, align)):
        return x
    return dense_copy(x, order(x))


def empty(x, layout):
    """An uninitialised tensor of x's shape [B, H, T, D], dtype and device, dense in `layout`, from
    PyTorch's caching allocator (the strides of torch.empty in that order: bthd is
    torch.empty((B, T, H, D)).transpose(1, 2))."""
    b, h, t, d = x.shape
    return x.new_empty_strided((b, h, t, d), (h * t * d, t * d, d, 1) if layout == "bhtd" else (t * h * d, d, h * d, 1))
