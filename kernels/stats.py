"""Per-row statistics of masked, temperature-scaled logits (one pass per row on Triton)."""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch

from ._backend import load_triton_module, resolve_backend
from .bitmask import CHUNK_ELEMS, BitmaskLike, _as_2d, _unpack_bits, as_bitmask_tensor

__all__ = ["MaskedStats", "masked_stats"]


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


def _stats_torch(
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
            z.masked_fill_(_unpack_bits(bitmask[s:e_], vocab, allowed=False), neg_inf)
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

        >>> st = masked_stats(torch.tensor([[0.0, 1.0, 5.0]]), pack_bool_mask(torch.tensor([[True, True, False]])))
        >>> st.argmax.tolist(), round(st.logsumexp.item(), 4)
        ([1], 1.3133)
    """
    logits2 = _as_2d(logits)
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
    return _stats_torch(logits2, bm, temp, gumbel, generator)
