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

For benchmarks and debugging, :func:`capture_raw` also records each token's *unrenormalised*
logprob (the same logits before the constraint's mask and closing bias): the loops keep a copy of
each step's logits while it is on, and entries become :class:`RawTokenLogprob`. Off (the default)
it costs one attribute read per step.

Example::

    >>> import torch
    >>> e = entries_from_logits(torch.tensor([[0.0, 0.0, float("-inf")]]), [1], top=2)[0]
    >>> round(e.logprob, 4), len(e.top_logprobs)
    (-0.6931, 2)
"""
from __future__ import annotations

import math
import re
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from dgemma_struct.engine.hooks import NullHook, StepView
from dgemma_struct.kernels import apply_token_bitmask_
from dgemma_struct.results import TokenLogprob, TopLogprob

__all__ = ["MAX_TOP_LOGPROBS", "FLOOR", "entries_from_logits", "forced_entry", "GuideLogprobs", "FreeTextLogprobs",
           "named", "kept_entries", "RawTokenLogprob", "RAW", "capture_raw"]

MAX_TOP_LOGPROBS = 20
FLOOR = -9999.0   # what -inf (and NaN) is reported as


def _clean(x: float) -> float:
    return x if math.isfinite(x) else FLOOR


@dataclass(frozen=True)
class RawTokenLogprob(TokenLogprob):
    """An entry recorded under :func:`capture_raw`: ``raw_logprob`` is the token's log-probability
    under the same step's logits *before* the constraint's mask (``None``: a forced token, written
    without logits)."""

    raw_logprob: float | None = None


class RawCapture:
    """The switch behind :func:`capture_raw` (process-wide; benchmarks and debugging only). The
    loops call :meth:`keep` with a step's logits just before the guide masks them in place."""

    def __init__(self) -> None:
        self.on = False
        self.masked: torch.Tensor | None = None   # the tensor the guide masks in place
        self.raw: torch.Tensor | None = None      # its copy before masking

    def keep(self, logits: torch.Tensor) -> None:
        self.masked, self.raw = logits, logits.detach().clone()

    def rows_of(self, rows: torch.Tensor) -> torch.Tensor | None:
        """The unmasked copy of ``rows``, a ``[n, V]`` slice of the kept masked logits (``None``
        when ``rows`` is not one)."""
        m = self.masked
        if m is None or rows.dim() != 2 or not m.is_contiguous() or \
                rows.untyped_storage().data_ptr() != m.untyped_storage().data_ptr():
            return None
        V = m.shape[-1]
        off = rows.storage_offset() - m.storage_offset()
        if off % V or rows.shape[-1] != V or rows.stride() != (V, 1):
            return None
        return self.raw.reshape(-1, V)[off // V: off // V + rows.shape[0]]


RAW = RawCapture()


@contextmanager
def capture_raw() -> Iterator[RawCapture]:
    """Within it, recorded entries also carry the unrenormalised logprob (:class:`RawTokenLogprob`).

    >>> with capture_raw() as raw:
    ...     raw.on
    True
    """
    RAW.on = True
    try:
        yield RAW
    finally:
        RAW.on, RAW.masked, RAW.raw = False, None, None


def _chosen(lsm: torch.Tensor, tokens: Sequence[int]) -> list[float]:
    ids = torch.tensor(list(tokens), dtype=torch.long, device=lsm.device)
    return lsm.gather(1, ids[:, None])[:, 0].tolist()


def _entry(token: int, logprob: float, alts: tuple, raw: float | None, with_raw: bool) -> TokenLogprob:
    if with_raw:
        return RawTokenLogprob(int(token), _clean(logprob), alts, raw_logprob=None if raw is None else _clean(raw))
    return TokenLogprob(int(token), _clean(logprob), alts)


def _masked(x: torch.Tensor, bitmasks: np.ndarray | None) -> torch.Tensor:
    """A float32 copy of ``x`` (``[n, V]``) with the tokens ``bitmasks`` refuses at ``-inf``."""
    if bitmasks is None:
        return x.float()
    n, V = x.shape
    if x.device.type != "cpu":   # the packed words travel to the device, not a bool row per token
        y = x.to(torch.float32, copy=True)
        apply_token_bitmask_(y, np.array(bitmasks[:n], dtype=np.int32))  # a copy: the walker reuses its buffer
        return y
    # on the host, unpacking with numpy and one ``where`` is 1.2-2x faster than the kernel's path
    words = np.ascontiguousarray(bitmasks[:n], dtype=np.int32)
    allowed = np.unpackbits(words.view(np.uint8), axis=1, count=V, bitorder="little").view(np.bool_)
    return torch.where(torch.from_numpy(allowed), x.float(), float("-inf"))


def entries_from_logits(rows: torch.Tensor, tokens: Sequence[int], top: int,
                        bitmasks: np.ndarray | None = None, raw: torch.Tensor | None = None) -> list[TokenLogprob]:
    """One entry per token: ``rows[i]`` (logits, ``[n, V]``) restricted to ``bitmasks[i]`` (the
    exact allowed set, when given) and log-softmaxed, at ``tokens[i]``; plus the ``top`` most likely
    allowed tokens. ``rows`` is not changed. ``raw``: the same rows before masking (entries then
    carry ``raw_logprob``)."""
    n = len(tokens)
    if n == 0:
        return []
    lsm = torch.log_softmax(_masked(rows[:n], bitmasks), dim=-1)
    chosen = _chosen(lsm, tokens)
    raws = _chosen(torch.log_softmax(raw[:n].float(), dim=-1), tokens) if raw is not None else [None] * n
    if top:
        val, idx = torch.topk(lsm, min(top, lsm.shape[-1]), dim=-1)
        val, idx = val.tolist(), idx.tolist()
    out = []
    for i, t in enumerate(tokens):
        alts = tuple(TopLogprob(int(j), float(v)) for j, v in zip(idx[i], val[i]) if math.isfinite(v)) if top else ()
        out.append(_entry(t, float(chosen[i]), alts, raws[i], RAW.on))
    return out


def forced_entry(token: int, top: int) -> TokenLogprob:
    """A grammar-forced token: one allowed choice, logprob 0.0."""
    alts = (TopLogprob(int(token), 0.0),) if top else ()
    if RAW.on:
        return RawTokenLogprob(int(token), 0.0, alts, forced=True)
    return TokenLogprob(int(token), 0.0, alts, forced=True)


class GuideLogprobs:
    """How a :class:`~dgemma_struct.guide.constraint_guide.ConstraintGuide` records logprob entries:
    into each row's own list (``row.lp``, with the row's own ``row.lp_top`` alternatives), one per
    token it commits (in commit order, stop token included), so a row keeps its entries when it moves
    between batches. ``ar_temperature``: the AR loop's temperature (``None``/0: greedy; the
    distribution reported is then the masked logits at temperature 1)."""

    def __init__(self, ar_temperature: float | None = None):
        self.ar_scale = float(ar_temperature) if ar_temperature else 1.0
        self._ar_logits: torch.Tensor | None = None
        self._ar_lsm: Any = None   # the step's log-softmax over all rows, computed at its first entry

    @property
    def ar_logits(self) -> torch.Tensor | None:
        """The last masked AR logits ``[B, V]`` (the guide sets them each step)."""
        return self._ar_logits

    @ar_logits.setter
    def ar_logits(self, logits: torch.Tensor | None) -> None:
        self._ar_logits, self._ar_lsm = logits, None

    @staticmethod
    def record(row: Any, walker: Any, tokens: list[int], logits: torch.Tensor | None) -> None:
        """``tokens`` are about to be committed at ``row``'s frontier; ``logits`` (``[>=n, V]``, the
        step's rows at their positions) or ``None`` for forced tokens."""
        if logits is None:
            row.lp.extend(forced_entry(t, row.lp_top) for t in tokens)
            return
        walk = walker.walk(tokens)   # the exact allowed set at each position, given the ones before
        k = min(walk.n_valid, len(tokens))
        raw = RAW.rows_of(logits) if RAW.on else None
        row.lp.extend(entries_from_logits(logits, tokens[:k], row.lp_top, walk.bitmasks[:k], raw=raw))
        if k < len(tokens):   # tokens the walker's mask refuses (a budget-closing plan wrote some): unmasked
            row.lp.extend(entries_from_logits(logits[k:], tokens[k:], row.lp_top,
                                              raw=None if raw is None else raw[k:]))

    def record_ar(self, row: Any, b: int, token: int) -> None:
        """AR mode: the token chosen at batch position ``b`` (``row``) from the last masked logits."""
        if row.lp_top or RAW.on:   # alternatives, or the unmasked logprob too: the general path
            rows = self.ar_logits[b:b + 1]
            raw = RAW.rows_of(rows) if RAW.on else None
            row.lp.extend(entries_from_logits(rows / self.ar_scale, [token], row.lp_top,
                                              raw=None if raw is None else raw / self.ar_scale))
            return
        # one log-softmax for the whole step, read per row: a CPU tensor through numpy (no torch
        # op per row), else one element per row, as the per-row entries read it before
        if self._ar_lsm is None:
            x = self.ar_logits.float()
            lsm = torch.log_softmax(x / self.ar_scale if self.ar_scale != 1.0 else x, dim=-1)
            self._ar_lsm = lsm.numpy() if lsm.device.type == "cpu" else lsm
        v = self._ar_lsm[b, token]
        row.lp.append(TokenLogprob(int(token), _clean(float(v))))

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


_NAMES: "weakref.WeakKeyDictionary[Any, dict[int, tuple[str, tuple[int, ...]]]]" = weakref.WeakKeyDictionary()


def _names_of(tokenizer: Any) -> dict[int, tuple[str, tuple[int, ...]]]:
    """The token texts already decoded with ``tokenizer`` (kept while it lives: a tokenizer's
    pieces do not change, and decoding each one again per result was most of naming's cost)."""
    try:
        return _NAMES.setdefault(tokenizer, {})
    except TypeError:   # not weak-referenceable / hashable: a cache for this call only
        return {}


def named(entries: list[TokenLogprob] | None, tokenizer: Any) -> list[TokenLogprob] | None:
    """``entries`` with each token's text (``tokenizer.decode([id])``, special tokens kept) and
    bytes (a byte-fallback piece ``<0xHH>`` is that byte; else the text's UTF-8)."""
    if entries is None:
        return None
    cache = _names_of(tokenizer)

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
        extra = {"raw_logprob": e.raw_logprob} if isinstance(e, RawTokenLogprob) else {}
        out.append(type(e)(e.token_id, e.logprob, alts, token=token, forced=e.forced, bytes=raw, **extra))
    return out
