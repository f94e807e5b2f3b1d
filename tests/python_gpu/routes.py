"""Which route a call of stableflash.torch.attention took (tests/python_cpu/test_op_cpu.py and
tests/python_gpu/test_op.py): in plain eager mode the kernels are called directly, elsewhere the ops
go through PyTorch's dispatcher (python/stableflash/torch/_ops.py, _plain)."""
import contextlib

from stableflash.torch import _ops


class _Counted:
    """An op that counts its calls (and passes on redispatch and the rest)."""

    def __init__(self, op, counts, name):
        self.op, self.counts, self.name = op, counts, name

    def __call__(self, *args):
        self.counts[self.name] += 1
        return self.op(*args)

    def __getattr__(self, attr):
        return getattr(self.op, attr)


@contextlib.contextmanager
def count_dispatches():
    """Counts the calls of the ops through the dispatcher (_ops._FORWARD / _BACKWARD) meanwhile."""
    counts = {"forward": 0, "backward": 0}
    ops = _ops._FORWARD, _ops._BACKWARD
    _ops._FORWARD, _ops._BACKWARD = _Counted(ops[0], counts, "forward"), _Counted(ops[1], counts, "backward")
    try:
        yield counts
    finally:
        _ops._FORWARD, _ops._BACKWARD = ops
