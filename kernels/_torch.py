"""The pure torch implementations behind :mod:`dgemma_struct.kernels`: the packed-bitmask layout
(llguidance / xgrammar: ``int32[R, ceil(V/32)]``, bit ``j`` of word ``w`` set iff token ``32w + j``
is allowed; words read as little-endian bytes), in-place masking, and the masked statistics
(:class:`MaskedStats`). Inputs are validated by the public entry points in :mod:`.bitmask` and
:mod:`.stats`; the Triton kernels (:mod:`.triton_masking`) compute the same results.
"""
from __future__ import annotations

import sys
from typing import NamedTuple, Optional, Union

import numpy as np
import torch

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


def unpack_bits(bitmask: torch.Tensor, vocab_size: int, allowed: bool = True) -> torch.Tensor:
    """bool ``[R, vocab_size]``: allowed (or, with ``allowed=False``, disallowed) tokens."""
    rows, width = bitmask.shape
    if width * 32 < vocab_size:
        raise ValueError(f"bitmask width {width} too small for vocab {vocab_size} (need {bitmask_width(vocab_size)})")
    as_bytes = bitmask.contiguous().view(torch.uint8)  # [R, 4W], little-endian bytes
    # byte -> 8 bits via a 256-entry lookup table (index_select is ~3-10x faster than shifts on CPU)
    bits = _bit_lut(bitmask.device, allowed).index_select(0, as_bytes.reshape(-1).long())  # uint8 [R*4W, 8]
    return bits.view(rows, width * 32)[:, :vocab_size].view(torch.bool)


def as_2d(logits: torch.Tensor) -> torch.Tensor:
    if logits.dim() == 1:
        return logits.unsqueeze(0)
    if logits.dim() != 2:
        raise ValueError(f"logits must be [R, V], got shape {tuple(logits.shape)}")
    return logits


def apply_bitmask_torch_(logits: torch.Tensor, bitmask: torch.Tensor, indices: Optional[torch.Tensor]) -> None:
    vocab = logits.shape[1]
    n = bitmask.shape[0]
    chunk = max(1, CHUNK_ELEMS // max(vocab, 1))
    neg_inf = float("-inf")
    for start in range(0, n, chunk):  # chunks of rows bound the temporary mask size
        stop = min(n, start + chunk)
        bad = unpack_bits(bitmask[start:stop], vocab, allowed=False)
        if indices is None:
            logits[start:stop].masked_fill_(bad, neg_inf)
        else:
            idx = indices[start:stop]
            logits.index_copy_(0, idx, logits.index_select(0, idx).masked_fill_(bad, neg_inf))


class MaskedStats(NamedTuple):
    """Per-row results, all tensors of shape ``[R]`` on the logits' device.

    With ``z = masked_logits / temperature`` (disallowed tokens at ``-inf``):

    * ``max`` (float32): ``max(z)``; ``-inf`` for a fully masked row.
    * ``argmax`` (int64): first index of the max; ``-1`` for a fully masked row.
    * ``logsumexp`` (float32): ``log(sum(exp(z)))``; ``-inf`` for a fully masked row.
    * ``entropy`` (float32): entropy (nats) of ``softmax(z)``; ``0`` for a fully masked row.
    * ``sample`` (int64): Gumbel-max sample from ``softmax(z)`` when ``gumbel=True``, else equal to
      ``argmax``; ``-1`` for a fully masked row.

    A row is "fully masked" when no token has a finite masked logit (all disallowed or ``-inf``).
    """

    max: torch.Tensor
    argmax: torch.Tensor
    logsumexp: torch.Tensor
    entropy: torch.Tensor
    sample: torch.Tensor


def masked_stats_torch(
    logits: torch.Tensor,
    bitmask: Optional[torch.Tensor],
    temp: torch.Tensor,
    gumbel: bool,
    generator: Optional[torch.Generator],
) -> MaskedStats:
    rows, vocab = logits.shape
    dev = logits.device
    out_max = torch.empty(rows, dtype=torch.float32, device=dev)
    out_arg = torch.empty(rows, dtype=torch.long, device=dev)
    out_lse = torch.empty(rows, dtype=torch.float32, device=dev)
    out_ent = torch.empty(rows, dtype=torch.float32, device=dev)
    out_smp = torch.empty(rows, dtype=torch.long, device=dev)
    chunk = max(1, CHUNK_ELEMS // max(vocab, 1))
    neg_inf = float("-inf")
    for s in range(0, rows, chunk):  # bounded temporaries: chunk x V floats
        e_ = min(rows, s + chunk)
        z = torch.div(logits[s:e_].to(torch.float32), temp[s:e_, None])  # always a fresh tensor
        if bitmask is not None:
            z.masked_fill_(unpack_bits(bitmask[s:e_], vocab, allowed=False), neg_inf)
        am = z.argmax(dim=1)  # first maximal index
        mx = z.gather(1, am[:, None]).squeeze(1)
        valid = mx > neg_inf
        if gumbel:
            # Gumbel-max: argmax(z + G), G = -log(-log U) == argmax(z - log(-log U)). U in [0, 1) so
            # -log U in (0, inf]: no NaN, and disallowed tokens (z = -inf) can never win.
            noise = torch.rand(z.shape, generator=generator, device=dev, dtype=torch.float32)
            noise.log_().neg_().log_()
            smp = torch.sub(z, noise, out=noise).argmax(dim=1)
            del noise
        else:
            smp = am
        shift = torch.where(valid, mx, torch.zeros_like(mx))
        z.sub_(shift[:, None])  # z <- z - max  (-inf stays -inf)
        p = torch.exp(z)
        ssum = p.sum(dim=1)
        z.nan_to_num_(nan=0.0, neginf=0.0)  # so that p * z has no 0 * -inf
        log_s = torch.log(ssum)
        ent = log_s - torch.linalg.vecdot(p, z) / ssum
        out_max[s:e_] = mx
        out_arg[s:e_] = torch.where(valid, am, torch.full_like(am, -1))
        out_lse[s:e_] = torch.where(valid, shift + log_s, torch.full_like(mx, neg_inf))
        out_ent[s:e_] = torch.where(valid, ent.clamp_(min=0.0), torch.zeros_like(ent))
        out_smp[s:e_] = torch.where(valid, smp, torch.full_like(smp, -1))
    return MaskedStats(out_max, out_arg, out_lse, out_ent, out_smp)
