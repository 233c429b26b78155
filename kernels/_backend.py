"""Backend selection shared by the public entry points (no Triton import here)."""
from __future__ import annotations

import functools
import importlib.util
import os
import warnings

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
    from .bitmask import apply_token_bitmask_, pack_bool_mask  # noqa: PLC0415 - avoids an import cycle
    from .stats import masked_stats  # noqa: PLC0415

    try:
        g = torch.Generator().manual_seed(0)
        logits = (torch.randn(4, 1000, generator=g) * 3).to(device)
        allowed = torch.rand(4, 1000, generator=g) < 0.3
        allowed[:, 7] = True
        allowed[3] = False  # a fully masked row
        bm = pack_bool_mask(allowed).to(device)
        a, b = logits.clone(), logits.clone()
        apply_token_bitmask_(a, bm, backend="triton")
        apply_token_bitmask_(b, bm, backend="torch")
        st, sr = masked_stats(logits, bm, backend="triton"), masked_stats(logits, bm, backend="torch")
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


def load_triton_module():
    """Import the @triton.jit module lazily (only called once a Triton backend is chosen)."""
    from . import triton_masking  # noqa: PLC0415 - deliberate lazy import

    return triton_masking
