"""Backend selection shared by the public entry points (no Triton import here)."""
from __future__ import annotations

import functools
import importlib.util

import torch

BACKENDS = ("auto", "torch", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when the ``triton`` package can be found (it is *not* imported)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        return False


def resolve_backend(backend: str, tensor: torch.Tensor) -> str:
    """Map ``"auto"`` to ``"triton"`` iff ``tensor`` is on CUDA and Triton is installed.

    ``"triton"`` is honoured as given (on CPU it needs ``TRITON_INTERPRET=1`` set before
    Triton is first imported); ``"torch"`` always works.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if (tensor.is_cuda and triton_available()) else "torch"
    if backend == "triton" and not triton_available():
        raise RuntimeError("backend='triton' requested but triton is not installed")
    return backend


def load_triton_module():
    """Import the @triton.jit module lazily (only called once a Triton backend is chosen)."""
    from . import triton_masking  # noqa: PLC0415 - deliberate lazy import

    return triton_masking
