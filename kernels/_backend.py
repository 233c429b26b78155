"""Backend selection shared by the public entry points, and the Triton self-check against the
torch path (Triton is imported lazily, only once a Triton backend is chosen)."""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import warnings
from types import ModuleType

import torch

from ._torch import apply_bitmask_torch_, masked_stats_torch, pack_bool_mask

BACKENDS = ("auto", "torch", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when the ``triton`` package can be found (it is *not* imported)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        return False


def resolve_backend(backend: str, tensor: torch.Tensor) -> str:
    """Map ``"auto"`` to ``"triton"`` iff ``tensor`` is on CUDA, Triton is installed and the
    kernels passed :func:`triton_self_check` on that device (``DGEMMA_STRUCT_KERNELS=torch|triton``
    overrides the choice).

    ``"triton"`` is honoured as given (on CPU it needs ``TRITON_INTERPRET=1`` set before
    Triton is first imported); ``"torch"`` always works.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        forced = os.environ.get("DGEMMA_STRUCT_KERNELS", "").strip().lower()
        if forced not in ("", "torch", "triton"):
            raise ValueError(f"DGEMMA_STRUCT_KERNELS must be 'torch' or 'triton', got {forced!r}")
        if forced == "torch":
            return "torch"
        if forced == "triton" and (tensor.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
            backend = "triton"  # (on a CPU tensor only under the interpreter; else the torch path)
        elif tensor.is_cuda and triton_available() and triton_self_check(str(tensor.device)):
            return "triton"
        else:
            return "torch"
    if backend == "triton" and not triton_available():
        raise RuntimeError("backend='triton' requested but triton is not installed")
    return backend


@functools.lru_cache(maxsize=None)
def triton_self_check(device: str) -> bool:
    """Run both Triton kernels once on ``device`` against the torch path (a few ms, once per
    device). ``"auto"`` uses Triton only where this passes, so a Triton/driver combination that
    miscompiles or fails to build degrades to the torch path with a warning, never to wrong masks."""
    try:
        g = torch.Generator().manual_seed(0)
        logits = (torch.randn(4, 1000, generator=g) * 3).to(device)
        allowed = torch.rand(4, 1000, generator=g) < 0.3
        allowed[:, 7] = True
        allowed[3] = False  # a fully masked row
        bm = pack_bool_mask(allowed).to(device)
        temp = torch.ones(4, dtype=torch.float32, device=device)
        triton_masking = load_triton_module()
        a, b = logits.clone(), logits.clone()
        triton_masking.apply_token_bitmask_triton_(a, bm, None)
        apply_bitmask_torch_(b, bm, None)
        st = triton_masking.masked_stats_triton(logits, bm, temp, gumbel=False, seed=0)
        sr = masked_stats_torch(logits, bm, temp, False, None)
        ok = (torch.equal(a, b) and torch.equal(st.argmax, sr.argmax)
              and torch.allclose(st.logsumexp, sr.logsumexp, atol=1e-4, equal_nan=True)
              and torch.allclose(st.entropy, sr.entropy, atol=1e-4))
        reason = "results differ from the torch path"
    except Exception as err:  # noqa: BLE001 - any build/launch failure means "use torch"
        ok, reason = False, f"{type(err).__name__}: {err}"
    if not ok:
        warnings.warn(f"dgemma_struct.kernels: the Triton kernels failed their self-check on {device} "
                      f"({reason}); using the torch path", RuntimeWarning, stacklevel=3)
    return ok


def load_triton_module() -> ModuleType:
    """Import the @triton.jit module lazily (only called once a Triton backend is chosen)."""
    from .triton_masking import apply_token_bitmask_triton_  # noqa: PLC0415 - deliberate lazy import

    return sys.modules[apply_token_bitmask_triton_.__module__]
