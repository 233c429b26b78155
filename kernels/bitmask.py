"""Packed token bitmasks (llguidance / xgrammar layout) and the in-place masking entry point.

Layout: ``int32[R, W]`` with ``W = ceil(V / 32)``; bit ``j`` of word ``w`` is set iff token
``32 * w + j`` is allowed. Bits past ``V`` are ignored. Words are read as little-endian bytes by
the torch path (every platform torch ships for is little-endian). The layout helpers live in
:mod:`._torch`; this module validates and dispatches to the torch or Triton path.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._backend import load_triton_module, resolve_backend
from ._torch import (BitmaskLike, apply_bitmask_torch_, as_2d, as_bitmask_tensor, bitmask_width,  # noqa: F401
                     pack_bool_mask, unpack_bits)

__all__ = [
    "bitmask_width",
    "pack_bool_mask",
    "unpack_bitmask",
    "apply_token_bitmask_",
    "as_bitmask_tensor",
]


def unpack_bitmask(bitmask: BitmaskLike, vocab_size: int) -> torch.Tensor:
    """Inverse of :func:`pack_bool_mask`: ``int32[R, W]`` -> ``bool[R, vocab_size]``.

    Example::

        >>> unpack_bitmask(torch.tensor([[8, 0]], dtype=torch.int32), 40).nonzero().tolist()
        [[0, 3]]
    """
    bm = as_bitmask_tensor(bitmask)
    return unpack_bits(bm, int(vocab_size)).clone()


def _check_indices(indices, n_mask_rows: int, n_rows: int, device) -> Optional[torch.Tensor]:
    if indices is None:
        if n_mask_rows != n_rows:
            raise ValueError(f"bitmask has {n_mask_rows} rows but logits has {n_rows} (pass indices=)")
        return None
    if not isinstance(indices, torch.Tensor):
        indices = torch.as_tensor(indices)
    indices = indices.to(device=device, dtype=torch.long).reshape(-1)
    if indices.numel() != n_mask_rows:
        raise ValueError(f"indices has {indices.numel()} entries but bitmask has {n_mask_rows} rows")
    return indices


def apply_token_bitmask_(
    logits: torch.Tensor,
    bitmask: BitmaskLike,
    indices: Optional[torch.Tensor] = None,
    backend: str = "auto",
) -> None:
    """Set disallowed logits to ``-inf`` in place.

    ``logits`` is ``[R, V]`` (float32/bf16/fp16; last dim contiguous) or ``[V]``. ``bitmask`` is
    ``int32[R', W]`` (torch or numpy). Without ``indices`` ``R' == R`` and row ``r`` of the bitmask
    masks logits row ``r``; with ``indices`` (``LongTensor[R']``) row ``k`` of the bitmask masks
    logits row ``indices[k]`` and all other rows are untouched (unlike xgrammar, the bitmask is
    *compact*: one row per index). Indices must be unique. ``backend``: ``"auto"`` (Triton iff
    CUDA + triton installed), ``"torch"`` or ``"triton"``.

    Example::

        >>> logits = torch.zeros(2, 40)
        >>> bm = pack_bool_mask(torch.arange(40).expand(1, 40) < 3)
        >>> apply_token_bitmask_(logits, bm, indices=torch.tensor([1]))
        >>> torch.isinf(logits).sum(dim=1).tolist()
        [0, 37]
    """
    logits2 = as_2d(logits)
    if logits2.stride(-1) != 1:
        raise ValueError("logits must be contiguous along the vocabulary dimension")
    bm = as_bitmask_tensor(bitmask, device=logits2.device)
    idx = _check_indices(indices, bm.shape[0], logits2.shape[0], logits2.device)
    if bm.shape[1] * 32 < logits2.shape[1]:
        raise ValueError(f"bitmask width {bm.shape[1]} too small for vocab {logits2.shape[1]}")
    if bm.shape[0] == 0:
        return
    if resolve_backend(backend, logits2) == "triton":
        load_triton_module().apply_token_bitmask_triton_(logits2, bm, idx)
    else:
        apply_bitmask_torch_(logits2, bm, idx)
