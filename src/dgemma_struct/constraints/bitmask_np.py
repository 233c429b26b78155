"""Numpy helpers for int32 token bitmasks (llguidance / vLLM / SGLang layout): ``ceil(V/32)`` words
per row, token ``t`` allowed iff ``(row[t >> 5] >> (t & 31)) & 1``.

>>> import numpy as np
>>> row = np.zeros(2, dtype=np.int32); row[1] = 1 << 3   # token 35
>>> bitmask_allows(row, 35), bitmask_allows(row, 3)
(True, False)
>>> allowed_among(row, np.array([3, 35, 36])).tolist()
[1]
>>> np.flatnonzero(bitmask_to_bool(row[None], 40)[0]).tolist()
[35]
>>> bitmask_of([3, 35], 2).tolist()
[8, 8]
"""
from __future__ import annotations

import numpy as np

__all__ = ["bitmask_allows", "allowed_among", "bitmask_to_bool", "bitmask_of"]


def bitmask_allows(row: np.ndarray, token: int) -> bool:
    """Whether the bitmask ``row`` allows ``token``."""
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


def allowed_among(row: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Positions ``i`` of ``ids`` (int64 token ids) whose token the bitmask ``row`` allows."""
    return np.flatnonzero((row[ids >> 5].astype(np.int64) >> (ids & 31)) & 1)


def bitmask_to_bool(rows: np.ndarray, vocab_size: int) -> np.ndarray:
    """Unpack int32 bitmask rows to a bool array ``[..., vocab_size]``."""
    u8 = np.ascontiguousarray(rows).view(np.uint8)
    bits = np.unpackbits(u8, axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


def bitmask_of(ids, n_words: int) -> np.ndarray:
    """The int32 bitmask row (``n_words`` words) that allows exactly the token ``ids``."""
    row = np.zeros(n_words, dtype=np.uint32)
    for t in ids:
        row[t >> 5] |= np.uint32(1 << (t & 31))
    return row.view(np.int32)
