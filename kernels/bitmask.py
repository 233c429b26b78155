"""Packed token bitmasks (llguidance / xgrammar layout) and the in-place masking entry point.

Layout: ``int32[R, W]`` with ``W = ceil(V / 32)``; bit ``j`` of word ``w`` is set iff token
``32 * w + j`` is allowed. Bits past ``V`` are ignored. Words are read as little-endian bytes by
the torch path (every platform torch ships for is little-endian).
"""
from __future__ import annotations

import sys
from typing import Optional, Union

import numpy as np
import torch

from ._backend import load_triton_module, resolve_backend

__all__ = [
    "bitmask_width",
    "pack_bool_mask",
    "unpack_bitmask",
    "apply_token_bitmask_",
    "as_bitmask_tensor",
]

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("dgemma_struct.kernels assumes a little-endian host")

# Torch path: rows are processed in chunks so that the per-chunk unpacked (uint8/bool) mask
# stays below this many elements -- a [256, 262144] canvas never gets a full-size mask.
CHUNK_ELEMS = 1 << 22

_BIT_LUT: dict = {}

BitmaskLike = Union[torch.Tensor, np.ndarray]


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words per row: ``ceil(vocab_size / 32)``."""
    return (int(vocab_size) + 31) // 32


def _bit_lut(device: torch.device, allowed: bool) -> torch.Tensor:
    """uint8 ``[256, 8]``: row ``b`` holds the 8 bits of byte ``b`` (LSB first), inverted if not allowed."""
    key = (str(device), allowed)
    t = _BIT_LUT.get(key)
    if t is None:
        t = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).to(torch.uint8)
        if not allowed:
            t ^= 1
        t = t.to(device)
        _BIT_LUT[key] = t
    return t


def as_bitmask_tensor(bitmask: BitmaskLike, device: Optional[torch.device] = None) -> torch.Tensor:
    """Return ``bitmask`` as a 2-D int32 tensor on ``device`` (numpy arrays via ``from_numpy``).

    Only the packed words are copied to the device (V/8 bytes per row).
    """
    if isinstance(bitmask, np.ndarray):
        if bitmask.dtype not in (np.int32, np.uint32):
            raise TypeError(f"bitmask must be int32, got numpy {bitmask.dtype}")
        bitmask = torch.from_numpy(np.ascontiguousarray(bitmask).view(np.int32))
    if not isinstance(bitmask, torch.Tensor):
        raise TypeError(f"bitmask must be a torch.Tensor or numpy array, got {type(bitmask)}")
    if bitmask.dtype != torch.int32:
        raise TypeError(f"bitmask must be int32, got {bitmask.dtype}")
    if bitmask.dim() == 1:
        bitmask = bitmask.unsqueeze(0)
    if bitmask.dim() != 2:
        raise ValueError(f"bitmask must be [R, W], got shape {tuple(bitmask.shape)}")
    if device is not None and bitmask.device != torch.device(device):
        bitmask = bitmask.to(device, non_blocking=True)
    return bitmask.contiguous()


def pack_bool_mask(allowed: torch.Tensor) -> torch.Tensor:
    """Pack a boolean ``[R, V]`` (or ``[V]``) allow-mask into an ``int32[R, ceil(V/32)]`` bitmask.

    Example::

        >>> allowed = torch.zeros(2, 40, dtype=torch.bool); allowed[0, 3] = allowed[1, 33] = True
        >>> pack_bool_mask(allowed).tolist()
        [[8, 0], [0, 2]]
    """
    if allowed.dim() == 1:
        allowed = allowed.unsqueeze(0)
    if allowed.dim() != 2:
        raise ValueError(f"allowed must be [R, V], got shape {tuple(allowed.shape)}")
    rows, vocab = allowed.shape
    width = bitmask_width(vocab)
    bits = allowed.to(torch.uint8)
    pad = width * 32 - vocab
    if pad:
        bits = torch.nn.functional.pad(bits, (0, pad))
    bits = bits.view(rows, width * 4, 8)
    acc = bits[..., 0].clone()
    for k in range(1, 8):  # loop over the 8 bit positions of a byte, not over rows
        acc |= bits[..., k] << k
    return acc.contiguous().view(torch.int32).view(rows, width)


def _unpack_bits(bitmask: torch.Tensor, vocab_size: int, allowed: bool = True) -> torch.Tensor:
    """bool ``[R, vocab_size]``: allowed (or, with ``allowed=False``, disallowed) tokens."""
    rows, width = bitmask.shape
    if width * 32 < vocab_size:
        raise ValueError(f"bitmask width {width} too small for vocab {vocab_size} (need {bitmask_width(vocab_size)})")
    as_bytes = bitmask.contiguous().view(torch.uint8)  # [R, 4W], little-endian bytes
    # byte -> 8 bits via a 256-entry lookup table (index_select is ~3-10x faster than shifts on CPU)
    bits = _bit_lut(bitmask.device, allowed).index_select(0, as_bytes.reshape(-1).long())  # uint8 [R*4W, 8]
    return bits.view(rows, width * 32)[:, :vocab_size].view(torch.bool)


def unpack_bitmask(bitmask: BitmaskLike, vocab_size: int) -> torch.Tensor:
    """Inverse of :func:`pack_bool_mask`: ``int32[R, W]`` -> ``bool[R, vocab_size]``.

    Example::

        >>> unpack_bitmask(torch.tensor([[8, 0]], dtype=torch.int32), 40).nonzero().tolist()
        [[0, 3]]
    """
    bm = as_bitmask_tensor(bitmask)
    return _unpack_bits(bm, int(vocab_size)).clone()


def _as_2d(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() == 1:
        return logits.unsqueeze(0)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [R, V], got shape {tuple(logits.shape)}")
    return logits


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


def _apply_torch(logits: torch.Tensor, bitmask: torch.Tensor, indices: Optional[torch.Tensor]) -> None:
    vocab = logits.shape[1]
    n = bitmask.shape[0]
    chunk = max(1, CHUNK_ELEMS // max(vocab, 1))
    neg_inf = float("-inf")
    for start in range(0, n, chunk):  # chunks of rows bound the temporary mask size
        stop = min(n, start + chunk)
        bad = _unpack_bits(bitmask[start:stop], vocab, allowed=False)
        if indices is None:
            logits[start:stop].masked_fill_(bad, neg_inf)
        else:
            idx = indices[start:stop]
            logits.index_copy_(0, idx, logits.index_select(0, idx).masked_fill_(bad, neg_inf))


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
    logits2 = _as_2d(logits)
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
        _apply_torch(logits2, bm, idx)
