"""Probes that count what a step costs besides the model: host reads of tensors (each one a
host-device sync on a GPU) and new canvas-sized buffers. They work on CPU too, so the count a GPU
would see is pinned by tests on any machine.

:func:`model_section` marks the model's forward (the loops' ``Clock.model()`` enters it): what
happens inside is not counted.

Example::

    >>> import torch
    >>> from dgemma_struct.engine.profiling import HostSyncProbe, model_section
    >>> x = torch.arange(4)
    >>> with HostSyncProbe() as probe:
    ...     _ = x.tolist(), bool(x[0]), x[x > 1]
    ...     with model_section():
    ...         _ = x.sum().item()            # inside the forward: not counted
    >>> probe.total, sorted(probe.counts)
    (3, ['__bool__', '__getitem__[bool]', 'tolist'])
"""
from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HostSyncProbe", "AllocationProbe", "model_section", "in_model"]

_state = threading.local()

# calls that hand a tensor's value to Python (a device -> host copy and a wait on a GPU)
_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "__array__",
                    "numpy", "cpu", "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
                    "equal", "allclose", "nonzero_static"})


@contextmanager
def model_section() -> Iterator[None]:
    """Marks the model's forward: probes do not count what happens inside."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def in_model() -> bool:
    """Whether the calling thread is inside :func:`model_section`."""
    return getattr(_state, "depth", 0) > 0


def _has_bool_index(index: Any) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _is_cpu_target(args: tuple, kwargs: dict) -> bool:
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)):
            return torch.device(a).type == "cpu"
    return False


def _read_kind(func: Any, args: tuple, kwargs: dict) -> str | None:
    name = getattr(func, "__name__", "")
    if name in _READS:
        return name
    if name in ("__getitem__", "__setitem__", "index_put", "index_put_") and len(args) > 1 and _has_bool_index(args[1]):
        return f"{name}[bool]"
    if name == "where" and len(args) == 1 and not kwargs:   # torch.where(cond): a nonzero
        return "where[nonzero]"
    if name == "to" and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu" \
            and _is_cpu_target(args, kwargs):
        return "to[cpu]"
    return None


class HostSyncProbe(TorchFunctionMode):
    """Counts host reads of tensors outside :func:`model_section`: ``.item()``, ``.tolist()``,
    ``bool()`` / ``int()`` / ``float()``, ``nonzero`` (and ``torch.where(cond)``, ``masked_select``,
    ``unique``), boolean-mask indexing (``x[mask]``, ``x[mask] = v``), ``.cpu()``, ``.numpy()``,
    ``torch.equal``. ``counts``: per kind; ``total``: all of them."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        """Host reads counted so far."""
        return sum(self.counts.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not in_model():
            kind = _read_kind(func, args, kwargs)
            if kind is not None:
                self.counts[kind] += 1
        return func(*args, **kwargs)


def _storages(x: Any, out: set) -> None:
    if isinstance(x, torch.Tensor):
        try:
            out.add(x.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # pragma: no cover - tensors without storage
            pass
    elif isinstance(x, (list, tuple)):
        for y in x:
            _storages(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _storages(y, out)


class AllocationProbe(TorchDispatchMode):
    """Counts new tensors created outside :func:`model_section` (an op's outputs whose storage
    none of its inputs shares: in-place ops and views are free). ``unit``: one canvas row's size
    (``L * V`` elements). ``count``: new tensors of at least ``unit`` elements; ``canvas_rows``:
    the elements of every new tensor of at least ``min_numel`` (default: ``unit // 256``, about
    one vocabulary row) in units of ``unit`` -- a full-canvas temporary of B rows counts B;
    ``ops``: which operators made them (their ``canvas_rows``)."""

    def __init__(self, unit: int, min_numel: int | None = None) -> None:
        super().__init__()
        self.unit = int(unit)
        self.min_numel = int(min_numel) if min_numel is not None else max(1, self.unit // 256)
        self.count = 0
        self.canvas_rows = 0.0
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if in_model():
            return out
        outs = out if isinstance(out, (tuple, list)) else (out,)
        big = [o for o in outs if isinstance(o, torch.Tensor) and o.numel() >= self.min_numel]
        if big:
            seen: set = set()
            _storages(args, seen)
            _storages(kwargs, seen)
            for o in big:
                if o.untyped_storage().data_ptr() not in seen:
                    self.count += o.numel() >= self.unit
                    self.canvas_rows += o.numel() / self.unit
                    self.ops[str(func.overloadpacket.__name__)] += o.numel() / self.unit
        return out
