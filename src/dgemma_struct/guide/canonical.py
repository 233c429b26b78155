"""Canonical tokens where the grammar forces what follows.

A model learns JSON in its tokenizer's canonical pieces: before a string value ``"name":"`` ends in the
one token ``":"``, and ``":`` comes only before a number, ``true`` or an object. A grammar allows both,
because ``":`` then ``"`` spells the same bytes. A model that picks ``":`` says "no string comes": when
the grammar then forces the ``"`` of a string, the model reads a sequence it never saw in training and
loses its place (the value becomes ``":12718}}}..."``). llguidance's own sampling loop backtracks such a
token and writes the canonical one. The AR guide does it before the choice: when the grammar forces
bytes after a token that canonical tokenization would have written in one piece with it, the token's
probability moves onto that piece (``GenerateOptions.canonical_tokens``). The canvas does not use it
(measured worse in diffusion; docs/constraints.md has both measurements).

Example (the embedded model's Gemma 4 tokenizer)::

    >>> from pathlib import Path
    >>> from transformers import AutoTokenizer
    >>> import dgemma_struct.embedded
    >>> from dgemma_struct.constraints import CanvasWalker, compile_constraint
    >>> tok = AutoTokenizer.from_pretrained(Path(dgemma_struct.embedded.__file__).parent)
    >>> schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    >>> walker = CanvasWalker(compile_constraint(schema, tok))
    >>> walker.commit(tok.encode('{"a', add_special_tokens=False))
    >>> [tok.decode([merged_token(walker, t)]) for t in tok.encode('":', add_special_tokens=False)]
    ['":"']
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["merged_token", "merge_noncanonical"]

#: forced bytes past a token that the check tokenizes (a piece never spans more)
FORCED_BYTES_LOOKED_AT = 16
#: the likeliest tokens of a row checked per round (a greedy choice is always among them)
TOP = 4

_MERGES: dict[tuple[str, int, bytes], int | None] = {}


def _merge(info: Any, token: int, forced: bytes) -> int | None:
    """The first piece of the canonical tokens of ``token``'s bytes and ``forced``, when it is longer
    than ``token`` (cached: the pairs met are few, JSON punctuation before a forced quote or key)."""
    key = (info.key, token, forced)
    if key not in _MERGES:
        lltok = info.lltok
        spelled = lltok.decode_bytes([token])
        first = lltok.tokenize_bytes(spelled + forced)[:1]
        merged = first[0] if first and first[0] != token and len(lltok.decode_bytes(first)) > len(spelled) else None
        if len(_MERGES) > 65536:
            _MERGES.clear()
        _MERGES[key] = merged
    return _MERGES[key]


def merged_token(walker: Any, token: int) -> int | None:
    """The piece canonical tokenization writes instead of ``token`` at ``walker``'s frozen state,
    spanning ``token`` and the first bytes the grammar forces after it; ``None`` when nothing is forced
    there, no piece spans both, the grammar refuses ``token`` or it is a special token."""
    info = walker.constraint.tokenizer_info
    if token in info.special_token_ids:
        return None
    with walker.frozen_cursor() as cur:
        if not cur.advance([token]):
            return None
        forced = bytes(cur.m.compute_ff_bytes())[:FORCED_BYTES_LOOKED_AT]
    return _merge(info, token, forced) if forced else None


def merge_noncanonical(logits: torch.Tensor, rows: Sequence[int], walkers: Sequence[Any]) -> int:
    """In place, in each row ``rows[j]`` of ``logits`` (``[B, V]``, masked by the grammar already;
    ``walkers[j]`` its walker), move each of the row's likeliest tokens that has a merged piece
    (:func:`merged_token`) still allowed in that row onto that piece: the piece's logit becomes the
    log of both probabilities, the token's ``-inf``. Returns how many tokens were moved.

    A row is re-read only when it lost a token, so a greedy choice is always checked; a sampled one
    is when it is among the :data:`TOP` likeliest (not the whole nucleus of a flat row). Host reads:
    two per round at most, whatever the batch size (a second round only after a move)."""
    todo = list(range(len(rows)))
    seen: list[set[int]] = [set() for _ in rows]
    moved = 0
    for _ in range(TOP):
        if not todo:
            break
        top = torch.topk(logits, TOP, dim=-1)
        ids, finite = top.indices.tolist(), torch.isfinite(top.values).tolist()
        found = []   # (j, token, piece): the pieces' own logits are read once for the round
        for j in todo:
            b = rows[j]
            for t, ok in zip(ids[b], finite[b]):
                if ok and t not in seen[j]:
                    seen[j].add(t)
                    alt = merged_token(walkers[j], t)
                    if alt is not None and alt < logits.shape[-1]:
                        found.append((j, t, alt))
        if not found:
            break
        allowed = torch.isfinite(logits[[rows[j] for j, _, _ in found], [alt for _, _, alt in found]]).tolist()
        again = set()
        for (j, t, alt), ok in zip(found, allowed):
            if ok:
                b = rows[j]
                logits[b, alt] = torch.logaddexp(logits[b, alt], logits[b, t])
                logits[b, t] = float("-inf")
                moved += 1
                again.add(j)
        todo = sorted(again)
    return moved
