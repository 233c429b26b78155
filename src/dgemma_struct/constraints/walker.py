"""CanvasWalker: the per-denoising-step mask engine.

A walker holds a *frozen* (committed) prefix and, on each :meth:`CanvasWalker.walk`, checks the
draft tokens that follow it left to right. It returns how many leading draft tokens the grammar
accepts in sequence (``n_valid``) and the exact allowed-token bitmask for every position up to and
including the first violation. All masks come from llguidance; one native call
(``LLExecutor.unsafe_compute_mask_ptr_with_draft_token``) computes the whole run of rows, and rows
are reused across calls up to the first position whose token changed.

Bitmask layout: int32 words, ``ceil(V/32)`` per row, token ``t`` allowed iff
``(row[t >> 5] >> (t & 31)) & 1`` (llguidance / vLLM / SGLang layout).

Engine faults are never silent: a matcher in its error state, a ``consume_tokens`` that refuses tokens
its own mask allowed (again after a rebuild: :class:`~.cursor.StaleMaskError`), or an all-zero mask row
(no token allowed at a position: a lexer limit deep in a huge schema) raise ``ConstraintEngineError``
from :meth:`CanvasWalker.walk` / :meth:`CanvasWalker.commit` -- a walk never returns a row without an
allowed token, so no caller ever samples from an empty mask (NaN).
No matcher is copied per step (a copy is O(output length); they move by rollback, :mod:`.cursor`),
and the cache survives a walk of a prefix of its path and a commit of the path's leading tokens.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Protocol, Sequence

import llguidance as llg
import numpy as np

from dgemma_struct.errors import ConstraintEngineError, ConstraintError, ConstraintLimitError

from .bitmask_np import allowed_among, bitmask_allows, bitmask_of, bitmask_to_bool
from .closing import greedy_fill
from .cursor import MatcherCursor, StaleMaskError, common_prefix, move_matcher
from .safety import clip, engine_guard, guarded, is_limit_error

__all__ = ["CanvasWalker", "WalkResult", "MatcherSource", "bitmask_allows", "bitmask_to_bool", "allowed_among"]


class MatcherSource(Protocol):
    """What a walker needs of its constraint: the tokenizer facts, whether the grammar could allow a
    special token, and fresh matchers at the start state."""

    tokenizer_info: Any  # a TokenizerInfo: vocab_size, stop_token_ids, forbidden_token_ids
    may_allow_specials: bool

    def new_matcher(self) -> Any: ...


class WalkResult(NamedTuple):
    """Result of :meth:`CanvasWalker.walk`.

    ``n_valid``: number of leading draft tokens (from the frontier) the grammar accepts in
    sequence; an accepted stop token ends the walk and is counted.
    ``bitmasks``: int32 ``[n_valid + 1, ceil(V/32)]``; row ``i`` is the exact allowed set at
    position ``frontier + i`` given ``draft[:i]``. Row ``n_valid`` is the mask at the first
    violation (or after the last draft token). If ``draft[:n_valid]`` ends with a stop token (or
    the frozen prefix already did) that row allows the stop tokens only. The array is a read-only
    view into the walker's buffer, valid until the next call on the walker (copy it to keep it).
    ``stopped``: the walk ended on an accepted stop token. ``accepting``: EOS is allowed at row
    ``n_valid`` (the prefix ``draft[:n_valid]`` is a complete output)."""

    n_valid: int
    bitmasks: np.ndarray
    stopped: bool
    accepting: bool


class CanvasWalker:
    """Grammar state for one canvas: a frozen prefix plus incremental draft walking.

    Not thread-safe; one walker per sequence."""

    _INIT_ROWS = 512

    def __init__(self, constraint: MatcherSource):
        self.constraint = constraint
        info = constraint.tokenizer_info
        self.vocab_size = V = info.vocab_size
        self.n_words = W = (V + 31) // 32
        self.stop_token_ids = tuple(info.stop_token_ids)
        self._stops = frozenset(self.stop_token_ids)
        self._eos = self.stop_token_ids[0]
        self._stop_row = bitmask_of(self.stop_token_ids, W)
        self._and_row: np.ndarray | None = None  # forbidden special tokens removed from every row
        if constraint.may_allow_specials and info.forbidden_token_ids:
            self._and_row = ~bitmask_of([t for t in info.forbidden_token_ids if t < V], W)
        self._exec = llg.LLExecutor(1)
        self._buf = np.zeros((self._INIT_ROWS, W), dtype=np.int32)
        self._scratch = np.zeros((1, W), dtype=np.int32)
        self._frozen = constraint.new_matcher()
        self.frozen_tokens: list[int] = []
        self._frozen_eos = False
        self._work: Any = None  # the draft matcher (see _reset_work), its cached path
        self._path, self._path_eos = [], False
        self._reset_work()

    # -- state ------------------------------------------------------------------------------
    def _reset_work(self, committed: Sequence[int] = ()) -> None:
        """Drop the walk cache; the draft matcher goes to the frozen state (``committed``: the tokens
        just committed, no stop) by rollback and consume, by a copy if missing or in error."""
        w, path = self._work, self._path
        if w is None or not move_matcher(w, path[:len(path) - (1 if self._path_eos else 0)], committed):
            w = self._frozen.deep_copy()
        self._work = w  # the matcher after frozen + the cached path (its stop token excluded)
        self._path = []  # draft tokens past the frontier represented by the cache
        self._path_eos = False  # path ends with an accepted stop token (not consumed by _work)
        self._base = 0  # buffer row of the frontier
        self._nrows = 0  # number of valid cached rows starting at _base

    def is_accepting(self) -> bool:
        """The frozen prefix is a complete output (EOS allowed, or EOS already committed)."""
        return self._frozen_eos or bool(self._frozen.is_accepting())

    def is_stopped(self) -> bool:
        """EOS was committed or the grammar cannot be extended (only EOS may follow)."""
        return self._frozen_eos or bool(self._frozen.is_stopped())

    def is_error(self) -> bool:
        return bool(self._frozen.is_error())

    def get_error(self) -> str:
        return self._frozen.get_error()

    @property
    def frontier(self) -> int:
        return len(self.frozen_tokens)

    @property
    def eos_committed(self) -> bool:
        """A stop token was committed: the output is finished."""
        return self._frozen_eos

    def frozen_matcher(self) -> Any:
        """A copy of the matcher after the frozen prefix (the caller may advance it). A copy costs
        O(output length): for a search from the frozen state prefer :meth:`frozen_cursor`."""
        return self._frozen.deep_copy()

    @contextmanager
    def frozen_cursor(self) -> Iterator[MatcherCursor]:
        """The frozen matcher lent as a :class:`~.cursor.MatcherCursor` (no copy), rolled back when
        the block ends. Inside it, use only ``mask_of`` / ``allows_stop`` and read-only attributes."""
        cur = MatcherCursor(self._frozen, self._stops)
        try:
            yield cur
        finally:
            if not cur.restore():
                self._rebuild(self.frozen_tokens)

    def cached_path(self) -> tuple[list[int], np.ndarray]:
        """``(path, rows)``: the draft tokens past the frontier that the last walks accepted (no stop
        token) and their cached mask rows, ``rows[i]`` the allowed set after ``path[:i]`` (read-only,
        valid until the next call on the walker): a fill that follows the draft reuses them."""
        n = -1 if self._frozen_eos or not self._nrows else min(len(self._path) - self._path_eos, self._nrows - 1)
        return self._path[:max(n, 0)], (self._view(n) if n >= 0 else self._buf[:0])

    def mask_of(self, matcher: Any) -> np.ndarray:
        """The allowed-token bitmask row of ``matcher``'s state (forbidden specials removed): the
        walker's scratch row, valid until the next call on the walker."""
        row = self._scratch[0]
        matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self._and_row is not None:
            row &= self._and_row
        return row

    def allows_stop(self, row: np.ndarray) -> bool:
        """Whether the bitmask ``row`` allows a stop token."""
        return bool((row & self._stop_row).any())

    # -- commit / rollback ------------------------------------------------------------------
    @guarded("committing tokens")
    def commit(self, tokens: Sequence[int]) -> None:
        """Consume ``tokens`` into the frozen prefix. Raises :class:`ConstraintError` (state
        unchanged) if the grammar rejects them. Stop ids count as EOS; stop tokens after the
        first are accepted and ignored (EOS padding)."""
        toks = [int(t) for t in tokens]
        if not toks:
            return
        if self._frozen_eos:
            if all(t in self._stops for t in toks):
                return
            raise ConstraintError("cannot commit tokens after EOS")
        cut = next((i for i, t in enumerate(toks) if t in self._stops), None)
        if cut is not None:
            rest = toks[cut + 1:]
            if any(t not in self._stops for t in rest):
                raise ConstraintError(f"non-stop token after the stop token at position {cut}")
            toks = toks[:cut + 1]
        for i, t in enumerate(toks):
            if t < 0 or t >= self.vocab_size:
                raise ConstraintError(f"token id {t} at position {i} is out of range")
        if self._and_row is not None:
            bad = [t for t in toks if t in self.constraint.tokenizer_info.forbidden_token_ids]
            if bad:
                raise ConstraintError(f"special token {bad[0]} is never allowed")
        body = toks[:-1] if cut is not None else toks
        n_ok = self._frozen.validate_tokens(body) if body else 0
        if n_ok < len(body):
            raise ConstraintError(
                f"token {body[n_ok]} at position {n_ok} of the commit (absolute {len(self.frozen_tokens) + n_ok}) "
                f"violates the constraint")
        if cut is not None:
            # validate_tokens() does not accept EOS on a stopped matcher: check it on a copy
            tmp = self._frozen.deep_copy()
            if (body and not tmp.consume_tokens(body)) or not tmp.consume_token(toks[-1]):
                raise ConstraintError(f"stop token at position {cut} of the commit: the output is not complete")
        ok = self._frozen.consume_tokens(body) if body else True
        if ok and cut is not None:
            ok = self._frozen.consume_token(toks[-1])
        if not ok:  # validate_tokens accepted them: the engine is at fault
            err = self._frozen.get_error()
            self._rebuild(self.frozen_tokens)  # leave the state unchanged
            raise ConstraintEngineError(f"the matcher refused tokens it had validated: {clip(err)}")
        self.frozen_tokens.extend(toks)
        if cut is not None:
            # no draft matcher after EOS (a rollback or reset builds one)
            self._frozen_eos, self._work, self._path, self._path_eos, self._nrows = True, None, [], False, 0
            return
        L = len(toks)
        if self._path[:L] == toks and self._nrows > L:
            self._path = self._path[L:]
            self._base += L
            self._nrows -= L
        else:
            self._reset_work(toks)

    def _rebuild(self, tokens: list[int]) -> None:
        m = self.constraint.new_matcher()
        if tokens and not m.consume_tokens(tokens):  # pragma: no cover - tokens were valid before
            raise ConstraintEngineError(f"rebuilding the matcher failed: {clip(m.get_error())}")
        self._frozen = m
        self.frozen_tokens = list(tokens)
        self._frozen_eos = bool(tokens) and tokens[-1] in self._stops
        self._work = None
        self._reset_work()

    @guarded("rolling back")
    def rollback(self, n: int) -> None:
        """Unfreeze the last ``n`` committed tokens."""
        if n < 0 or n > len(self.frozen_tokens):
            raise ValueError(f"cannot roll back {n} of {len(self.frozen_tokens)} committed tokens")
        if n:
            self._rebuild(self.frozen_tokens[:-n])

    def reset(self) -> None:
        self._rebuild([])

    # -- masks ------------------------------------------------------------------------------
    def _ensure_rows(self, need: int) -> None:
        """Make room for rows ``_base .. _base + need``."""
        if self._base + need + 1 <= self._buf.shape[0]:
            return
        if need + 1 <= self._buf.shape[0] // 2 and self._base > 0:
            if self._nrows:
                self._buf[: self._nrows] = self._buf[self._base: self._base + self._nrows]
            self._base = 0
            return
        new = np.zeros((max(2 * self._buf.shape[0], need + 1 + self._base), self.n_words), dtype=np.int32)
        if self._nrows:
            new[: self._nrows] = self._buf[self._base: self._base + self._nrows]
        self._buf = new
        self._base = 0

    def _engine_fault(self, what: str, m: Any = None, *, stale: bool = False) -> ConstraintEngineError:
        """The error to raise (the work matcher is reset): :class:`ConstraintLimitError` when the
        engine reports one of its limits, else :class:`ConstraintEngineError`
        (:class:`~.cursor.StaleMaskError` when ``stale``: a mask allowed what its matcher refused)."""
        m = self._work if m is None else m
        err = m.get_error() if m.is_error() else ""
        self._reset_work()
        cls = ConstraintLimitError if is_limit_error(err, extra=("max is",)) else \
            StaleMaskError if stale else ConstraintEngineError
        return cls(f"{what}" + (f": {clip(err)}" if err else ""))

    def walk(self, draft: Sequence[int]) -> WalkResult:
        """Check ``draft`` (the tokens at positions ``frontier, frontier+1, ...``).

        Raises :class:`ConstraintEngineError` when the matcher is in its error state, refuses tokens
        its mask allowed (after one rebuild), or a mask row allows no token at all (never a zero row)."""
        with engine_guard("computing canvas masks"):
            try:
                return self._walk(draft)
            except StaleMaskError:
                self._rebuild(self.frozen_tokens)   # fresh matchers, exact masks (see StaleMaskError)
                return self._walk(draft)

    def _walk(self, draft: Sequence[int]) -> WalkResult:
        draft = draft.tolist() if hasattr(draft, "tolist") else list(draft)
        V = self.vocab_size
        # tokens outside the vocabulary can never be valid: truncate there
        draft = draft[:next((i for i, t in enumerate(draft) if t < 0 or t >= V), len(draft))]
        self._ensure_rows(len(draft) + 1)
        buf, base = self._buf, self._base

        if self._frozen_eos:
            buf[base] = self._stop_row
            self._nrows = 1
            return WalkResult(0, self._view(0), True, True)

        # longest common prefix with the cached path
        path = self._path
        p = common_prefix(path, draft)
        if p < len(path) and p == len(draft):
            # the draft is a prefix of the cached path (the guide's walk of the accepted run): all its
            # rows are cached; the path stays whole for the next commit and the next draft walk
            return WalkResult(p, self._view(p), False, bool((buf[base + p] & self._stop_row).any()))
        if p < len(path):
            consumed = len(path) - (1 if self._path_eos else 0)
            if p < consumed:
                self._work.rollback(consumed - p)
            self._path_eos = False
            del path[p:]
            self._nrows = p + 1
        if self._path_eos:  # draft repeats the cached path ending in a stop token
            return WalkResult(p, self._view(p), True, True)

        if self._work.is_error():
            raise self._engine_fault(f"the matcher is in its error state at position {self.frontier + p}")
        rest = draft[p:]
        if rest and self._nrows > p and not (int(buf[base + p, rest[0] >> 5]) >> (rest[0] & 31)) & 1:
            rest = []  # the cached row already refuses the next token (a draft tail that did not change)
        if rest:
            # one native call: row p (mask before rest[0]) and one row after each valid token
            self._exec.unsafe_compute_mask_ptr_with_draft_token(
                [(self._work, base + p, rest)], buf.ctypes.data, self.n_words * 4, buf.shape[0])
        elif self._nrows < p + 1:
            r = buf[base + p]
            self._work.unsafe_compute_mask_ptr(r.ctypes.data, r.nbytes)
        k = len(rest)
        if self._and_row is not None:
            np.bitwise_and(buf[base + p: base + p + k + 1], self._and_row, out=buf[base + p: base + p + k + 1])
        n_ok = 0
        stopped = False
        if k:
            t = np.asarray(rest, dtype=np.int64)
            rows = buf[base + p: base + p + k]
            bits = (rows[np.arange(k), t >> 5].astype(np.int64) >> (t & 31)) & 1
            bad = np.flatnonzero(bits == 0)
            n_ok = int(bad[0]) if bad.size else k
            j = next((j for j in range(n_ok) if rest[j] in self._stops), None)
            if j is not None:
                n_ok, stopped = j + 1, True
        n_valid = p + n_ok
        # every row this call computed must allow something: an empty row is an engine fault / dead end
        last = n_valid - 1 if stopped else n_valid
        if last >= p:
            empty = np.flatnonzero(~buf[base + p: base + last + 1].any(axis=1))
            if empty.size:
                pos = self.frontier + p + int(empty[0])
                raise self._engine_fault(
                    f"no token is allowed at position {pos} (an all-zero mask: the constraint cannot be "
                    f"continued here; engine limit or a grammar without finite completion)")
        ok = True
        if stopped:
            if n_ok - 1:
                ok = self._work.consume_tokens(rest[: n_ok - 1])
            buf[base + n_valid] = self._stop_row
            self._path_eos = True
        elif n_ok:
            ok = self._work.consume_tokens(rest[:n_ok])
        if not ok:
            raise self._engine_fault(f"the matcher refused draft tokens its own mask allowed "
                                     f"(positions {self.frontier + p}..{self.frontier + n_valid})", stale=True)
        path.extend(rest[:n_ok])
        self._nrows = n_valid + 1
        accepting = stopped or bool((buf[base + n_valid] & self._stop_row).any())
        return WalkResult(n_valid, self._view(n_valid), stopped, accepting)

    def _view(self, n_valid: int) -> np.ndarray:
        v = self._buf[self._base: self._base + n_valid + 1].view()
        v.flags.writeable = False
        return v

    def mask(self) -> np.ndarray:
        """The allowed-token bitmask at the frontier (a copy)."""
        return self.walk([]).bitmasks[0].copy()

    @guarded("computing forced tokens")
    def forced_tokens(self, max_n: int) -> list[int]:
        """The forced continuation after the frozen prefix (not committed), at most ``max_n``
        tokens, ending with EOS when EOS becomes the only allowed token."""
        if max_n <= 0 or self._frozen_eos:
            return []
        m = self._frozen
        out: list[int] = [] if m.is_stopped() else list(m.compute_ff_tokens())[:max_n]
        if len(out) < max_n:
            k = len(out)
            if 0 < k <= len(self._path) - self._path_eos and self._path[:k] == out:
                row = self._buf[self._base + k]  # the cached draft walk went through the forced tokens
            else:
                with self.frozen_cursor() as cur:  # probe past them, rolled back after (no copy)
                    if not cur.advance(out):  # pragma: no cover - the engine forced them
                        return []
                    row = self.mask_of(cur.m)
            if (row & self._stop_row).any() and not (row & ~self._stop_row).any():
                out.append(self._eos)
        return out

    def greedy_fill(self, logits_rows: Any, max_n: int, *, topk: int = 64) -> list[int]:
        """Masked greedy decode from the frozen state (see :func:`~.closing.greedy_fill`)."""
        return greedy_fill(self, logits_rows, max_n, topk=topk)
