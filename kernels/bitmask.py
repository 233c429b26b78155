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
    "BitmaskStaging",
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


class BitmaskStaging:
    """A step's bitmask rows and their logit-row indices, staged for :func:`apply_token_bitmask_`:
    copied into one reused host buffer (pinned when the logits live on CUDA), then each sent to a
    persistent device buffer in one non-blocking copy. Buffers grow by doubling and are kept.

    Example::

        >>> import numpy as np
        >>> stage = BitmaskStaging()
        >>> bm, idx = stage.stage([np.full((2, 2), -1, dtype=np.int32)], [3, 5], torch.device("cpu"))
        >>> bm.shape, idx.tolist()
        (torch.Size([2, 2]), [3, 5])
    """

    def __init__(self) -> None:
        self._host: Optional[torch.Tensor] = None
        self._dev: Optional[torch.Tensor] = None
        self._idx_host: Optional[torch.Tensor] = None
        self._idx_dev: Optional[torch.Tensor] = None
        self._np: tuple = (None, None)   # numpy views of the two host buffers (made when they grow)

    @staticmethod
    def _grow(buf: Optional[torch.Tensor], rows: int, shape: tuple, dtype, device, pin: bool) -> torch.Tensor:
        if buf is not None and buf.shape[0] >= rows and buf.shape[1:] == shape and buf.device == torch.device(device):
            return buf
        cap = max(rows, 2 * buf.shape[0] if buf is not None else 16)
        return torch.empty((cap, *shape), dtype=dtype, device=device, pin_memory=pin)

    def stage(self, pieces, index, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``pieces``: int32 numpy bitmask blocks ``[n_i, W]`` (stacked in order); ``index``: one
        logit row per bitmask row. Returns ``(bitmask [n, W], indices [n])`` on ``device``."""
        n, W = len(index), pieces[0].shape[1]
        device = torch.device(device)
        pin = device.type == "cuda" and torch.cuda.is_available()
        host = self._grow(self._host, n, (W,), torch.int32, "cpu", pin)
        idx_host = self._grow(self._idx_host, n, (), torch.long, "cpu", pin)
        if host is not self._host or idx_host is not self._idx_host:
            self._host, self._idx_host = host, idx_host
            self._np = (host.numpy(), idx_host.numpy())
        arr, at = self._np[0], 0
        for p in pieces:
            arr[at:at + len(p)] = p
            at += len(p)
        self._np[1][:n] = index
        if device.type == "cpu":
            return self._host[:n], self._idx_host[:n]
        self._dev = self._grow(self._dev, n, (W,), torch.int32, device, False)
        self._idx_dev = self._grow(self._idx_dev, n, (), torch.long, device, False)
        self._dev[:n].copy_(self._host[:n], non_blocking=True)
        self._idx_dev[:n].copy_(self._idx_host[:n], non_blocking=True)
        return self._dev[:n], self._idx_dev[:n]
