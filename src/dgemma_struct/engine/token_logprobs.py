"""Per-token log-probabilities of an output (the ``logprobs=k`` knob).

What a logprob means for a diffusion model: a token is written once, at the step that commits
it, from that step's logits at its position (temperature-scaled by the schedule and the user
temperature, after the guide's mask and closing bias). Its logprob is the log-softmax of those
logits restricted to the tokens the constraint allows *after the tokens actually committed before
it*, evaluated at the token. Under that definition:

* a sampled token (commit rule, progress rule): the distribution it was drawn from, conditioned on
  the draw being valid;
* a forced token (the grammar allows one choice): exactly 0.0, ``forced=True``;
* a token of the masked greedy fill or a budget-closing plan (end of a canvas): the last step's
  logits at its position (a closing-plan token may be unlikely: the budget chose it);
* AR mode and the fallback: the masked logits of that step divided by the AR temperature (1 when
  greedy);
* free text (no constraint): the last denoising step's distribution at the position, unmasked.

``top_logprobs`` are the ``k`` most likely *allowed* tokens of the same distribution (a forced
position has one). ``-inf`` (never for a chosen token in practice) is reported as ``-9999.0``.

Example::

    >>> import torch
    >>> e = entries_from_logits(torch.tensor([[0.0, 0.0, float("-inf")]]), [1], top=2)[0]
    >>> round(e.logprob, 4), len(e.top_logprobs)
    (-0.6931, 2)
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np
import torch

from dgemma_struct.engine.hooks import NullHook, StepView
from dgemma_struct.kernels import apply_token_bitmask_
from dgemma_struct.results import TokenLogprob, TopLogprob

__all__ = ["MAX_TOP_LOGPROBS", "FLOOR", "entries_from_logits", "forced_entry", "GuideLogprobs", "FreeTextLogprobs",
           "named", "kept_entries"]

MAX_TOP_LOGPROBS = 20
FLOOR = -9999.0   # what -inf (and NaN) is reported as


def _clean(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


def entries_from_logits(rows: torch.Tensor, tokens: Sequence[int], top: int,
                        bitmasks: np.ndarray | None = None) -> list[TokenLogprob]:
    """One entry per token: ``rows[i]`` (logits, ``[n, V]``) restricted to ``bitmasks[i]`` (the
    exact allowed set, when given) and log-softmaxed, at ``tokens[i]``; plus the ``top`` most likely
    allowed tokens. ``rows`` is not changed."""
    n = len(tokens)
    if n == 0:
        return []
    x = rows[:n].to(torch.float32, copy=True)
    if bitmasks is not None:
        apply_token_bitmask_(x, np.array(bitmasks[:n], dtype=np.int32))  # a copy: the walker reuses its buffer
    lsm = torch.log_softmax(x, dim=-1)
    ids = torch.tensor(list(tokens), dtype=torch.long, device=lsm.device)
    chosen = lsm.gather(1, ids[:, None])[:, 0].tolist()
    if top:
        val, idx = torch.topk(lsm, min(top, lsm.shape[-1]), dim=-1)
        val, idx = val.tolist(), idx.tolist()
    out = []
    for i, t in enumerate(tokens):
        alts = tuple(TopLogprob(int(j), float(v)) for j, v in zip(idx[i], val[i]) if math.isfinite(v)) if top else ()
        out.append(TokenLogprob(int(t), _clean(float(chosen[i])), alts))
    return out


def forced_entry(token: int, top: int) -> TokenLogprob:
    """A grammar-forced token: one allowed choice, logprob 0.0."""
    return TokenLogprob(int(token), 0.0, (TopLogprob(int(token), 0.0),) if top else (), forced=True)


class GuideLogprobs:
    """How a :class:`~dgemma_struct.guide.constraint_guide.ConstraintGuide` records logprob entries:
    into each row's own list (``row.lp``, with the row's own ``row.lp_top`` alternatives), one per
    token it commits (in commit order, stop token included), so a row keeps its entries when it moves
    between batches. ``ar_temperature``: the AR loop's temperature (``None``/0: greedy; the
    distribution reported is then the masked logits at temperature 1)."""

    def __init__(self, ar_temperature: float | None = None):
        self.ar_scale = float(ar_temperature) if ar_temperature else 1.0
        self.ar_logits: torch.Tensor | None = None   # the last masked AR logits [B, V]

    @staticmethod
    def record(row: Any, walker: Any, tokens: list[int], logits: torch.Tensor | None) -> None:
        """``tokens`` are about to be committed at ``row``'s frontier; ``logits`` (``[>=n, V]``, the
        step's rows at their positions) or ``None`` for forced tokens."""
        if logits is None:
            row.lp.extend(forced_entry(t, row.lp_top) for t in tokens)
            return
        masks = walker.walk(tokens).bitmasks   # the exact allowed set at each position, given the ones before
        row.lp.extend(entries_from_logits(logits, tokens, row.lp_top, masks[:len(tokens)]))

    def record_ar(self, row: Any, b: int, token: int) -> None:
        """AR mode: the token chosen at batch position ``b`` (``row``) from the last masked logits."""
        rows = self.ar_logits[b:b + 1] / self.ar_scale
        row.lp.extend(entries_from_logits(rows, [token], row.lp_top))

    @staticmethod
    def record_free(row: Any, logits: torch.Tensor | None, committed: torch.Tensor, L: int) -> None:
        """A free-text row at the end of a canvas: an entry per position from the last step's
        ``logits`` (``[L, V]``; the committed token is their argmax), or ``None`` x ``L`` when the
        row took no part in the canvas (:func:`kept_entries` aligns them with the kept tokens)."""
        if logits is None:
            row.lp.extend([None] * L)
        else:
            row.lp.extend(entries_from_logits(logits, committed.tolist(), row.lp_top))

    @staticmethod
    def kept(row: Any, stops: Sequence[int]) -> list[TokenLogprob]:
        """``row``'s entries without stop tokens (as the row's outcome drops them)."""
        return [e for e in row.lp if e.token_id not in stops]


class FreeTextLogprobs(NullHook):
    """A hook that records, without steering, every position's entry of an unconstrained run: at
    the end of each canvas from the last step's logits (the committed token is their argmax), in AR
    mode from each step's logits. ``rows[b]`` then has one entry (or ``None`` for a row already
    finished) per generated position; :func:`kept_entries` aligns them with the returned tokens."""

    def __init__(self, n_rows: int, top: int, ar_temperature: float | None = None):
        self.top = top
        self.rows: list[list[TokenLogprob | None]] = [[] for _ in range(n_rows)]
        self.ar_scale = float(ar_temperature) if ar_temperature else 1.0
        self._ar: torch.Tensor | None = None

    def start_canvas(self, view: StepView) -> None:
        view.frozen_upto = [0] * view.frozen.shape[0]   # it freezes nothing: the loop needs no frozen pass

    def finish_canvas(self, view: StepView, committed: torch.Tensor) -> torch.Tensor:
        B, L = committed.shape
        active = view.active_rows if view.active_rows is not None else \
            view.active.tolist() if view.active is not None else [True] * B
        tokens = committed.tolist()
        for b in range(B):
            live = view.logits.numel() and active[b]
            self.rows[b].extend(entries_from_logits(view.logits[b], tokens[b], self.top) if live else [None] * L)
        return committed

    def mask_ar_logits(self, logits: torch.Tensor, active: torch.Tensor) -> None:
        self._ar = logits

    def ar_token(self, tokens: torch.Tensor, active: torch.Tensor) -> None:
        toks, act = tokens.tolist(), active.tolist()
        for b in range(len(toks)):
            self.rows[b].append(entries_from_logits(self._ar[b:b + 1] / self.ar_scale, [toks[b]], self.top)[0]
                                if act[b] else None)


def kept_entries(entries: list[TokenLogprob | None], row: Sequence[int], pad: int | None,
                 n: int) -> list[TokenLogprob]:
    """The entries of the ``n`` tokens a generated ``row`` keeps (its first ``n`` non-pad tokens,
    as :meth:`~dgemma_struct.runtime.DiffusionRuntime.generate_ids` keeps them)."""
    out = [e for e, t in zip(entries, row) if pad is None or t != pad][:n]
    if len(out) != n or any(e is None or e.token_id != t for e, t in zip(out, [t for t in row if t != pad])):
        raise RuntimeError("logprob entries do not line up with the generated tokens")
    return out


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def named(entries: list[TokenLogprob] | None, tokenizer: Any) -> list[TokenLogprob] | None:
    """``entries`` with each token's text (``tokenizer.decode([id])``, special tokens kept) and
    bytes (a byte-fallback piece ``<0xHH>`` is that byte; else the text's UTF-8)."""
    if entries is None:
        return None
    cache: dict[int, tuple[str, tuple[int, ...]]] = {}

    def text(t: int) -> tuple[str, tuple[int, ...]]:
        if t not in cache:
            s = tokenizer.decode([t], skip_special_tokens=False)
            piece = tokenizer.convert_ids_to_tokens(t) if hasattr(tokenizer, "convert_ids_to_tokens") else None
            m = _BYTE_PIECE.fullmatch(piece) if isinstance(piece, str) else None
            cache[t] = (s, (int(m.group(1), 16),) if m else tuple(s.encode("utf-8", errors="surrogatepass")))
        return cache[t]

    out = []
    for e in entries:
        token, raw = text(e.token_id)
        alts = tuple(TopLogprob(a.token_id, a.logprob, *text(a.token_id)) for a in e.top_logprobs)
        out.append(TokenLogprob(e.token_id, e.logprob, alts, token=token, forced=e.forced, bytes=raw))
    return out
