"""Triton kernels: packed-bitmask apply (in place) and fused per-row masked statistics.

Imported lazily by :mod:`dgemma_struct.kernels` only when a Triton backend is selected. On CPU
tensors the kernels run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before
``import triton``); there is no CPU driver otherwise.

Both kernels compute element addresses with int64 row offsets (``B * 256 * 262144`` exceeds
2**31) and guard every ``-inf`` so that fully masked rows produce no NaNs.
"""
from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

from ._torch import MaskedStats

__all__ = ["apply_token_bitmask_triton_", "masked_stats_triton", "APPLY_BLOCK", "STATS_BLOCK"]

APPLY_BLOCK = 4096
STATS_BLOCK = 2048


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    logits_row_stride,
    bitmask_ptr,
    bitmask_row_stride,
    indices_ptr,
    vocab_size,
    HAS_INDICES: tl.constexpr,
    BLOCK: tl.constexpr,
):
    k = tl.program_id(0).to(tl.int64)  # bitmask row
    if HAS_INDICES:
        row = tl.load(indices_ptr + k).to(tl.int64)
    else:
        row = k
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab_size
    words = tl.load(bitmask_ptr + k * bitmask_row_stride + (cols >> 5), mask=in_vocab, other=-1)
    banned = ((words >> (cols & 31)) & 1) == 0
    # Only disallowed positions are written; allowed logits are neither read nor written.
    neg_inf = tl.full([BLOCK], float("-inf"), tl.float32)
    tl.store(logits_ptr + row * logits_row_stride + cols, neg_inf, mask=in_vocab & banned)


@triton.jit
def _masked_stats_kernel(
    logits_ptr,
    logits_row_stride,
    bitmask_ptr,
    bitmask_row_stride,
    temp_ptr,
    out_max_ptr,
    out_argmax_ptr,
    out_lse_ptr,
    out_entropy_ptr,
    out_sample_ptr,
    vocab_size,
    seed,
    HAS_MASK: tl.constexpr,
    GUMBEL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row32 = tl.program_id(0)
    temp = tl.load(temp_ptr + row).to(tl.float32)
    row_ptr = logits_ptr + row * logits_row_stride
    offs = tl.arange(0, BLOCK)
    NEG_INF: tl.constexpr = float("-inf")

    # Per-lane online accumulators (merged across lanes at the end):
    #   m = running max, s = sum exp(z - m), a = sum exp(z - m) * (z - m), idx = argmax lane-wise.
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    s = tl.zeros([BLOCK], tl.float32)
    a = tl.zeros([BLOCK], tl.float32)
    idx = tl.zeros([BLOCK], tl.int32)
    g_best = tl.full([BLOCK], NEG_INF, tl.float32)
    g_idx = tl.zeros([BLOCK], tl.int32)

    for start in range(0, vocab_size, BLOCK):
        cols = start + offs
        in_vocab = cols < vocab_size
        x = tl.load(row_ptr + cols, mask=in_vocab, other=NEG_INF).to(tl.float32)
        if HAS_MASK:
            words = tl.load(bitmask_ptr + row * bitmask_row_stride + (cols >> 5), mask=in_vocab, other=0)
            ok = ((words >> (cols & 31)) & 1) != 0
            x = tl.where(ok, x, NEG_INF)
        z = x / temp
        finite = z > NEG_INF
        upd = z > m
        idx = tl.where(upd, cols, idx)
        m_new = tl.maximum(m, z)
        m_new_safe = tl.where(m_new > NEG_INF, m_new, 0.0)
        alpha = tl.exp(m - m_new_safe)  # 0 where m == -inf
        dm = tl.where(m > NEG_INF, m - m_new_safe, 0.0)
        a = alpha * (a + dm * s)
        s = s * alpha
        y = tl.where(finite, z - m_new_safe, 0.0)
        e = tl.where(finite, tl.exp(y), 0.0)
        s = s + e
        a = a + e * y
        m = m_new
        if GUMBEL:
            zero = tl.zeros([BLOCK], tl.int32)
            r0, r1, r2, r3 = tl.philox(seed, cols, zero + row32, zero, zero)
            u = tl.random.uint_to_uniform_float(r0)
            # 1e-30, not 1e-38: a literal below float32's smallest normal (2**-126) is typed
            # float64 by Triton (3.6 then rejects the loop; tests/kernels/test_kernels_compile.py)
            u = tl.maximum(u, 1.0e-30)
            g = -tl.log(-tl.log(u))
            gz = tl.where(finite, z + g, NEG_INF)
            g_upd = gz > g_best
            g_idx = tl.where(g_upd, cols, g_idx)
            g_best = tl.maximum(g_best, gz)

    big: tl.constexpr = 2147483647
    mx = tl.max(m, axis=0)
    valid = mx > NEG_INF
    mx_safe = tl.where(valid, mx, 0.0)
    lane_ok = m > NEG_INF
    scale = tl.where(lane_ok, tl.exp(m - mx_safe), 0.0)
    total_s = tl.sum(scale * s, axis=0)
    lane_dm = tl.where(lane_ok, m - mx_safe, 0.0)
    total_a = tl.sum(scale * (a + lane_dm * s), axis=0)
    total_s_safe = tl.where(valid, total_s, 1.0)
    log_s = tl.log(total_s_safe)
    lse = tl.where(valid, mx_safe + log_s, NEG_INF)
    ent = tl.where(valid, tl.maximum(log_s - total_a / total_s_safe, 0.0), 0.0)
    am = tl.min(tl.where(lane_ok & (m == mx), idx, big), axis=0)
    am = tl.where(valid, am, -1)
    tl.store(out_max_ptr + row, mx)
    tl.store(out_lse_ptr + row, lse)
    tl.store(out_entropy_ptr + row, ent)
    tl.store(out_argmax_ptr + row, am.to(tl.int64))
    if GUMBEL:
        gmx = tl.max(g_best, axis=0)
        smp = tl.min(tl.where((g_best > NEG_INF) & (g_best == gmx), g_idx, big), axis=0)
        smp = tl.where(valid & (gmx > NEG_INF), smp, -1)
        tl.store(out_sample_ptr + row, smp.to(tl.int64))
    else:
        tl.store(out_sample_ptr + row, am.to(tl.int64))


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("1", "true", "True"):
        raise RuntimeError(
            "backend='triton' on CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported (or use backend='torch')"
        )


def apply_token_bitmask_triton_(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    indices: Optional[torch.Tensor] = None,
    block: int = APPLY_BLOCK,
) -> None:
    """Triton version of :func:`dgemma_struct.kernels.apply_token_bitmask_` (validated inputs).

    ``logits`` ``[R, V]`` with unit stride along V; ``bitmask`` int32 ``[R', W]`` on the same
    device; ``indices`` int64 ``[R']`` or None (then ``R' == R``). ``block`` is the number of
    vocabulary entries per program (a power of two).
    """
    _check_device(logits)
    vocab = logits.shape[1]
    n = bitmask.shape[0]
    if n == 0 or vocab == 0:
        return
    has_idx = indices is not None
    idx_arg = indices if has_idx else bitmask  # dummy pointer when unused
    grid = (n, triton.cdiv(vocab, block))
    _apply_bitmask_kernel[grid](
        logits, logits.stride(0), bitmask, bitmask.stride(0), idx_arg, vocab,
        HAS_INDICES=has_idx, BLOCK=block,
    )


def masked_stats_triton(
    logits: torch.Tensor,
    bitmask: Optional[torch.Tensor],
    temperature: torch.Tensor,
    *,
    gumbel: bool = False,
    seed: int = 0,
    block: int = STATS_BLOCK,
    num_warps: Optional[int] = None,
) -> MaskedStats:
    """Triton version of :func:`dgemma_struct.kernels.masked_stats` (validated inputs).

    One program per row streams the row once in ``block``-sized chunks. ``temperature`` is a
    float32 ``[R]`` tensor on the logits' device; ``seed`` seeds Philox for the Gumbel noise.
    """
    _check_device(logits)
    rows, vocab = logits.shape
    dev = logits.device
    out_max = torch.empty(rows, dtype=torch.float32, device=dev)
    out_lse = torch.empty(rows, dtype=torch.float32, device=dev)
    out_ent = torch.empty(rows, dtype=torch.float32, device=dev)
    out_arg = torch.empty(rows, dtype=torch.long, device=dev)
    out_smp = torch.empty(rows, dtype=torch.long, device=dev)
    if rows == 0:
        return MaskedStats(out_max, out_arg, out_lse, out_ent, out_smp)
    has_mask = bitmask is not None
    bm = bitmask if has_mask else temperature  # dummy pointer when unused
    kwargs = {}
    if num_warps is not None:
        kwargs["num_warps"] = num_warps
    _masked_stats_kernel[(rows,)](
        logits, logits.stride(0), bm, bm.stride(0) if has_mask else 0, temperature,
        out_max, out_arg, out_lse, out_ent, out_smp,
        vocab, int(seed) & 0x7FFFFFFF,
        HAS_MASK=has_mask, GUMBEL=bool(gumbel), BLOCK=block, **kwargs,
    )
    return MaskedStats(out_max, out_arg, out_lse, out_ent, out_smp)
