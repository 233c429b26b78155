"""Per-row statistics of masked, temperature-scaled logits (one pass per row on Triton).

On CUDA the constrained loop takes its entropies from the Triton kernel
(:func:`dgemma_struct.engine.sampler.entropy_at` with ``backend="auto"``); the unconstrained path keeps the
chunked torch operations, bit-identical to transformers. See docs/kernels.md.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from ._backend import load_triton_module, resolve_backend
from ._torch import BitmaskLike, MaskedStats, as_2d, as_bitmask_tensor, masked_stats_torch

__all__ = ["MaskedStats", "masked_stats"]


def _temperature_tensor(temperature, rows: int, device) -> torch.Tensor:
    if isinstance(temperature, torch.Tensor):
        t = temperature.to(device=device, dtype=torch.float32).reshape(-1)
        if t.numel() == 1:
            t = t.expand(rows)
        if t.numel() != rows:
            raise ValueError(f"temperature has {t.numel()} entries, expected {rows}")
        return t.contiguous()
    t = float(temperature)
    if not t > 0:
        raise ValueError(f"temperature must be > 0, got {t}")
    return torch.full((rows,), t, dtype=torch.float32, device=device)


def masked_stats(
    logits: torch.Tensor,
    bitmask: Optional[BitmaskLike] = None,
    *,
    temperature: Union[float, torch.Tensor] = 1.0,
    gumbel: bool = False,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    backend: str = "auto",
) -> MaskedStats:
    """Max / argmax / logsumexp / entropy / Gumbel sample of ``softmax(masked_logits / T)`` per row.

    ``logits``: ``[R, V]`` (or ``[V]``), not modified. ``bitmask``: optional ``int32[R, W]``
    (torch or numpy) in the llguidance/xgrammar layout. ``temperature``: float > 0 or a
    ``Tensor[R]`` of positive values. With ``gumbel=True`` a token is drawn per row with the
    Gumbel-max trick; randomness comes from ``generator`` (torch path) or ``seed`` (both paths;
    the Triton path uses Philox on ``(seed, row, column)`` and does not reproduce torch's stream).
    See :class:`MaskedStats` for fully masked rows. ``logits`` may contain ``-inf`` (treated as
    a disallowed token); ``+inf``/NaN logits are unsupported.

    Example::

        >>> from dgemma_struct.kernels import pack_bool_mask
        >>> st = masked_stats(torch.tensor([[0.0, 1.0, 5.0]]), pack_bool_mask(torch.tensor([[True, True, False]])))
        >>> st.argmax.tolist(), round(st.logsumexp.item(), 4)
        ([1], 1.3133)
    """
    logits2 = as_2d(logits)
    if logits2.stride(-1) != 1:
        logits2 = logits2.contiguous()
    rows, vocab = logits2.shape
    bm = None
    if bitmask is not None:
        bm = as_bitmask_tensor(bitmask, device=logits2.device)
        if bm.shape[0] != rows:
            raise ValueError(f"bitmask has {bm.shape[0]} rows but logits has {rows}")
        if bm.shape[1] * 32 < vocab:
            raise ValueError(f"bitmask width {bm.shape[1]} too small for vocab {vocab}")
    temp = _temperature_tensor(temperature, rows, logits2.device)
    if resolve_backend(backend, logits2) == "triton":
        if seed is None:
            gdev = generator.device if generator is not None else "cpu"
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator, device=gdev).item()) if gumbel else 0
        return load_triton_module().masked_stats_triton(logits2, bm, temp, gumbel=gumbel, seed=int(seed))
    if gumbel and generator is None and seed is not None:
        generator = torch.Generator(device=logits2.device).manual_seed(int(seed))
    return masked_stats_torch(logits2, bm, temp, gumbel, generator)
