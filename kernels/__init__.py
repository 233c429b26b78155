"""Logit-masking kernels for whole-canvas constrained decoding.

Torch implementations work on any device; Triton kernels (:mod:`.triton_masking`) are used
automatically for CUDA tensors when ``triton`` is installed. Importing this package never
imports Triton. The generation loop uses :func:`apply_token_bitmask_` (its bitmasks staged by
:class:`BitmaskStaging`) and, on CUDA for a hook's step, :func:`masked_stats` for the entropies
(``sampler.entropy_at``; the reproduction path keeps the exact torch operations).

Example::

    >>> import torch
    >>> from dgemma_struct.kernels import pack_bool_mask, apply_token_bitmask_, masked_stats
    >>> logits = torch.randn(4, 100)
    >>> bm = pack_bool_mask(torch.rand(4, 100) < 0.5)
    >>> apply_token_bitmask_(logits, bm)          # disallowed -> -inf, in place
    >>> st = masked_stats(logits, temperature=0.7, gumbel=True, seed=0)
    >>> st.entropy.shape
    torch.Size([4])
"""
from ._backend import resolve_backend, triton_available
from .bitmask import BitmaskStaging, apply_token_bitmask_, as_bitmask_tensor, bitmask_width, pack_bool_mask, unpack_bitmask
from .stats import MaskedStats, masked_stats

__all__ = [
    "BitmaskStaging",
    "MaskedStats",
    "apply_token_bitmask_",
    "as_bitmask_tensor",
    "bitmask_width",
    "masked_stats",
    "pack_bool_mask",
    "resolve_backend",
    "triton_available",
    "unpack_bitmask",
]
