"""CanvasWalker: the per-denoising-step mask engine.

A walker holds a *frozen* (committed) prefix and, on each :meth:`CanvasWalker.walk`, checks the
draft tokens that follow it left to right. It returns how many leading draft tokens the grammar
accepts in sequence (``n_valid``) and the exact allowed-token bitmask for every position up to and
including the first violation. All masks come from llguidance; one native call
(``LLExecutor.unsafe_compute_mask_ptr_with_draft_token``) computes the whole run of rows, and rows
are reused across calls up to the first position whose token changed.

Bitmask layout: int32 words, ``ceil(V/32)`` per row, token ``t`` allowed iff
``(row[t >> 5] >> (t & 31)) & 1`` (llguidance / vLLM / SGLang layout).

Engine faults are never silent: a matcher in its error state, a ``consume_tokens`` that refuses
tokens its own mask allowed, or an **all-zero mask row** (no token at all allowed at a position, e.g.
a lexer limit hit deep in a huge schema) raise :class:`~dgemma_struct.errors.ConstraintEngineError`
from :meth:`CanvasWalker.walk` / :meth:`CanvasWalker.commit` -- a walk never returns a row without an
allowed token, so no caller ever samples from an empty mask (NaN).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

import llguidance as llg
import numpy as np

from dgemma_struct.errors import ConstraintEngineError, ConstraintError, ConstraintLimitError

from .safety import clip, engine_guard, guarded

if TYPE_CHECKING:  # pragma: no cover
    from .compile import Constraint

__all__ = ["CanvasWalker", "WalkResult", "bitmask_allows", "bitmask_to_bool", "closing_candidates"]


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


def _json_string_state(text: bytes, in_str: bool, esc: bool) -> tuple[bool, bool]:
    """Whether a JSON text that starts in state (in_str, esc) ends inside a string literal."""
    for ch in text:
        if esc:
            esc = False
        elif in_str and ch == 0x5C:  # backslash
            esc = True
        elif ch == 0x22:  # quote
            in_str = not in_str
    return in_str, esc


def _has_format(schema: Any) -> bool:
    stack = [schema]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if isinstance(x.get("format"), str):
                return True
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


_REP_ORDER = b"10aA"


def _segment_punct(pb: bytes) -> bytes:
    """The distinct punctuation bytes written since the plan's last quote (the current string or
    lexeme): what tells apart regex states whose masks are equal."""
    seg = pb[pb.rfind(b'"') + 1:]
    return bytes(sorted({ch for ch in seg if not chr(ch).isalnum()}))


def _byte_representatives(byte_ids: np.ndarray, byte_values: bytes, grammar: str = "") -> np.ndarray:
    """Single-byte candidate tokens for the closing search: ``1``, ``0``, ``a``, ``A`` for the digit /
    letter classes (``1`` first: ``1111-11-11`` is a real date, ``0000-00-00`` is not), then every
    printable punctuation byte -- those the grammar text mentions (a pattern's ``@`` and ``.``) first."""
    by = {b: int(t) for t, b in zip(np.asarray(byte_ids).tolist(), byte_values)}
    punct = [b for b in sorted(by) if 0x20 <= b < 0x7F and not chr(b).isalnum()]
    mentioned = set(grammar.encode("utf-8", "replace")) - set(b'{}[]":,\\')
    # one alphanumeric first, the rest after the mentioned punctuation: states that differ only in
    # alphanumerics are merged, so they would spend the level's budget for nothing
    order = _REP_ORDER[:1] + bytes(b for b in punct if b in mentioned) + _REP_ORDER[1:] + \
        bytes(b for b in punct if b not in mentioned)
    out = [by[b] for b in order if b in by]
    out += [by[b] for b in (0x0A, 0x09) if b in by]
    return np.asarray(out, dtype=np.int64)


_CANDIDATES: dict[str, tuple] = {}


def closing_candidates(info: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
    """The closing candidates of a tokenizer, scanned once per tokenizer (cached by its key):
    tokens that start with ``"`` and hold only ``"``/``]``/``}``, tokens of only ``]``/``}`` (both
    longest first), and the single-byte tokens with their bytes."""
    hit = _CANDIDATES.get(info.key)
    if hit is not None:
        return hit
    lt = info.lltok
    quote, bracket, single = {}, {}, {}
    specials = info.special_token_ids
    for t in range(info.vocab_size):
        if t in specials:
            continue
        bs = lt.decode_bytes([t])
        if len(bs) == 1:
            single.setdefault(bs[0], t)
        if bs and len(bs) <= 8 and all(ch in b'"]}' for ch in bs):
            (quote if bs[:1] == b'"' else bracket if b'"' not in bs else {})[t] = len(bs)
    order = sorted(single)
    hit = (*(np.asarray(sorted(d, key=lambda t: -d[t]), dtype=np.int64) for d in (quote, bracket)),
           np.asarray([single[b] for b in order], dtype=np.int64), bytes(order))
    if len(_CANDIDATES) >= 16:
        _CANDIDATES.pop(next(iter(_CANDIDATES)))
    _CANDIDATES[info.key] = hit
    return hit


def allowed_among(row: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Positions ``i`` of ``ids`` (int64 token ids) whose token the bitmask ``row`` allows."""
    return np.flatnonzero((row[ids >> 5].astype(np.int64) >> (ids & 31)) & 1)


def bitmask_allows(row: np.ndarray, token: int) -> bool:
    return bool((int(row[token >> 5]) >> (token & 31)) & 1)


def bitmask_to_bool(rows: np.ndarray, vocab_size: int) -> np.ndarray:
    """Unpack int32 bitmask rows to a bool array ``[..., vocab_size]``."""
    u8 = np.ascontiguousarray(rows).view(np.uint8)
    bits = np.unpackbits(u8, axis=-1, bitorder="little")
    return bits[..., :vocab_size].astype(bool)


class CanvasWalker:
    """Grammar state for one canvas: a frozen prefix plus incremental draft walking.

    Not thread-safe; one walker per sequence."""

    _INIT_ROWS = 512

    def __init__(self, constraint: "Constraint"):
        self.constraint = constraint
        info = constraint.tokenizer_info
        self.vocab_size = V = info.vocab_size
        self.n_words = W = (V + 31) // 32
        self.stop_token_ids = tuple(info.stop_token_ids)
        self._stops = frozenset(self.stop_token_ids)
        self._eos = self.stop_token_ids[0]
        self._stop_row = np.zeros(W, dtype=np.int32)
        self._stop_row_u = self._stop_row.view(np.uint32)
        for t in self.stop_token_ids:
            self._stop_row_u[t >> 5] |= np.uint32(1 << (t & 31))
        self._and_row: np.ndarray | None = None
        if constraint.may_allow_specials and info.forbidden_token_ids:
            allow = np.full(W, -1, dtype=np.int32)
            au = allow.view(np.uint32)
            for t in info.forbidden_token_ids:
                if t < V:
                    au[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
            self._and_row = allow
        self._exec = llg.LLExecutor(1)
        self._buf = np.zeros((self._INIT_ROWS, W), dtype=np.int32)
        self._scratch = np.zeros((1, W), dtype=np.int32)
        self._frozen = constraint.new_matcher()
        self.frozen_tokens: list[int] = []
        self._frozen_eos = False
        self._reset_work()

    # -- state ------------------------------------------------------------------------------
    def _reset_work(self) -> None:
        self._work = self._frozen.deep_copy()
        self._path: list[int] = []  # draft tokens past the frontier represented by the cache
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
            self._frozen_eos = True
            self._reset_work()
            return
        L = len(toks)
        if self._path[:L] == toks and self._nrows > L:
            self._path = self._path[L:]
            self._base += L
            self._nrows -= L
        else:
            self._reset_work()

    def _rebuild(self, tokens: list[int]) -> None:
        m = self.constraint.new_matcher()
        if tokens and not m.consume_tokens(tokens):  # pragma: no cover - tokens were valid before
            raise ConstraintEngineError(f"rebuilding the matcher failed: {clip(m.get_error())}")
        self._frozen = m
        self.frozen_tokens = list(tokens)
        self._frozen_eos = bool(tokens) and tokens[-1] in self._stops
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

    def _allows(self, row: np.ndarray, t: int) -> bool:
        return bool((int(row[t >> 5]) >> (t & 31)) & 1)

    def _engine_fault(self, what: str, m: Any = None) -> ConstraintEngineError:
        """The error to raise (the work matcher is reset): :class:`ConstraintLimitError` when the
        engine reports one of its limits, else :class:`ConstraintEngineError`."""
        m = self._work if m is None else m
        err = m.get_error() if m.is_error() else ""
        self._reset_work()
        low = err.lower()
        cls = ConstraintLimitError if any(w in low for w in ("limit", "max is", "too many", "fuel")) else \
            ConstraintEngineError
        return cls(f"{what}" + (f": {clip(err)}" if err else ""))

    def walk(self, draft: Sequence[int]) -> WalkResult:
        """Check ``draft`` (the tokens at positions ``frontier, frontier+1, ...``).

        Raises :class:`ConstraintEngineError` when the matcher is in its error state, refuses
        tokens its mask allowed, or a mask row allows no token at all (never a silent zero row)."""
        with engine_guard("computing canvas masks"):
            return self._walk(draft)

    def _walk(self, draft: Sequence[int]) -> WalkResult:
        if hasattr(draft, "tolist"):
            draft = draft.tolist()
        draft = list(draft)
        V = self.vocab_size
        # tokens outside the vocabulary can never be valid: truncate there
        for i, t in enumerate(draft):
            if t < 0 or t >= V:
                draft = draft[:i]
                break
        self._ensure_rows(len(draft) + 1)
        buf = self._buf
        base = self._base

        if self._frozen_eos:
            buf[base] = self._stop_row
            self._nrows = 1
            return WalkResult(0, self._view(0), True, True)

        # longest common prefix with the cached path
        path = self._path
        p = 0
        lim = min(len(path), len(draft))
        while p < lim and path[p] == draft[p]:
            p += 1
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
            if n_ok and self._stops:
                for j in range(n_ok):
                    if rest[j] in self._stops:
                        n_ok = j + 1
                        stopped = True
                        break
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
                                     f"(positions {self.frontier + p}..{self.frontier + n_valid})")
        path.extend(rest[:n_ok])
        self._nrows = n_valid + 1
        accepting = stopped or bool((buf[base + n_valid] & self._stop_row).any())
        return WalkResult(n_valid, self._view(n_valid), stopped, accepting)

    def _view(self, n_valid: int) -> np.ndarray:
        v = self._buf[self._base: self._base + n_valid + 1]
        v = v.view()
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
        m = self._frozen.deep_copy()
        out: list[int] = []
        if not m.is_stopped():
            out = list(m.compute_ff_tokens())[:max_n]
            if out and not m.consume_tokens(out):  # pragma: no cover
                return []
        if len(out) < max_n:
            row = self._scratch[0]
            m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            if self._and_row is not None:
                row &= self._and_row
            if (row & self._stop_row).any() and not (row & ~self._stop_row).any():
                out.append(self._eos)
        return out

    def closing_plan(self, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                     byte_ids: np.ndarray | None = None, byte_values: bytes = b"") -> list[int] | None:
        """A short continuation from the frozen state after which a stop token may end the output
        (the stop token itself not included), or None when no completion of at most ``max_n``
        tokens was found.

        First the cheap greedy walk (:meth:`_greedy_closing`); its plan is kept when the completed
        text passes semantic validation (formats, ``multipleOf`` ...). Otherwise a breadth-first
        *shortest-completion search* over matcher states (:meth:`_search_closing`): the frontier is
        expanded level by level with the allowed tokens among the closing candidates (closers, and
        one representative per class of single-byte tokens: every punctuation byte, ``1``/``0``,
        ``a``, ``A``), bounded to :attr:`CLOSING_BEAM` states per level; the first levels' completions
        are checked by validation and the shortest valid one wins (else the shortest). It finds a plan
        whenever a completion within ``max_n`` tokens exists in the candidates' reach -- e.g. an
        email pattern's ``@`` and ``.`` that a greedy walk uses up, or ``1111-11-11`` for a date.
        Candidate arrays: as :func:`closing_candidates` returns them (``quote_ids`` / ``bracket_ids``
        in order of preference, ``byte_ids[i]`` spells ``byte_values[i]``)."""
        if self._frozen_eos:
            return []
        if byte_ids is None or not len(byte_values):
            quote_ids, bracket_ids, byte_ids, byte_values = closing_candidates(self.constraint.tokenizer_info)
        with engine_guard("planning a closing"):
            greedy = self._greedy_closing(quote_ids, bracket_ids, max_n, byte_ids, byte_values)
            if greedy is not None and self._completion_valid(greedy):
                return greedy
            found = self._search_closing(quote_ids, bracket_ids, max_n, byte_ids, byte_values)
        if not found:
            return greedy
        for plan in found:
            if self._completion_valid(plan):
                return plan
        return greedy if greedy is not None and len(greedy) <= len(found[0]) else found[0]

    CLOSING_BEAM = 32  # distinct states kept per search level
    CLOSING_EXAMINE = 128  # children examined per search level
    CLOSING_EXTRA_LEVELS = 3  # levels searched past the first completion (for a valid one)

    def _completion_valid(self, plan: list[int]) -> bool:
        """Whether the frozen text plus ``plan`` passes the JSON-Schema validation (formats, keywords
        the grammar leaves out). User validators (pydantic) are not run here: they may have effects."""
        c = self.constraint
        if c.kind != "json" or (not c.semantic_keywords and not _has_format(c.schema)):
            return True
        from .json_schema import iter_issues
        text = c.tokenizer_info.lltok.decode_str([t for t in self.frozen_tokens + plan if t not in self._stops])
        try:
            value = json.loads(text)
            return not iter_issues(c._validator, value)
        except Exception:  # noqa: BLE001 - not parseable / validator failure: not known valid
            return False

    def _search_closing(self, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                        byte_ids: np.ndarray, byte_values: bytes) -> list[list[int]]:
        """Completions (plans) found by a bounded breadth-first search, shortest first.

        States of one level whose masks are identical are taken as one automaton state (inside a
        regex lexeme every ``\\S`` byte leads to the same state), so a level holds at most
        :attr:`CLOSING_BEAM` distinct states and examines at most :attr:`CLOSING_EXAMINE` children;
        children of different states are interleaved so that no state fills the level."""
        tok = self.constraint.tokenizer_info.lltok
        reps = _byte_representatives(byte_ids, byte_values, self.constraint.grammar)
        quote_ids = np.asarray(quote_ids, dtype=np.int64)
        closers = np.concatenate([np.asarray(bracket_ids, dtype=np.int64), quote_ids[::-1]])
        is_json = self.constraint.kind == "json"
        in_str0 = _json_string_state(tok.decode_bytes(self.frozen_tokens), False, False) if is_json else (False, False)
        row = self._scratch[0]
        # a node: (matcher or None, parent matcher, plan, plan bytes); children are materialised lazily
        level: list[tuple] = [(self._frozen.deep_copy(), None, [], b"")]
        found: list[list[int]] = []
        stop_depth = None
        for depth in range(max_n + 1):
            groups: list[list[tuple]] = []
            seen_masks: set[bytes] = set()
            seen_bytes: set[bytes] = set()
            examined = 0
            for m, parent, plan, pb in level:
                if examined >= self.CLOSING_EXAMINE or len(seen_masks) >= self.CLOSING_BEAM:
                    break
                if pb in seen_bytes:
                    continue
                seen_bytes.add(pb)
                examined += 1
                if m is None:
                    m = parent.deep_copy()
                    if not m.consume_token(plan[-1]):
                        continue
                m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
                if self._and_row is not None:
                    row &= self._and_row
                if (row & self._stop_row).any():
                    found.append(plan)
                    stop_depth = depth if stop_depth is None else stop_depth
                    if len(found) >= 8:
                        return found
                    continue
                in_str = _json_string_state(pb, *in_str0) if is_json else (False, False)
                # equal masks are not equal states (every \\S byte is allowed before and after the '@'
                # of an email pattern): the key adds the punctuation used and the string state
                key = (row.tobytes(), _segment_punct(pb), in_str)
                if key in seen_masks:
                    continue
                seen_masks.add(key)
                if len(plan) >= max_n or m.is_stopped():
                    continue
                ff = list(m.compute_ff_tokens())[: max_n - len(plan)]
                if ff:
                    if m.consume_tokens(ff):
                        groups.append([(m, None, plan + ff, pb + tok.decode_bytes(ff))])
                    continue
                ids = quote_ids if in_str[0] else closers
                cand = [int(ids[k]) for k in allowed_among(row, ids)[:3]]
                ok = allowed_among(row, reps)
                # bytes the plan has used least first: writing '-' forever never closes anything
                cand += sorted((int(reps[k]) for k in ok), key=lambda t: pb.count(tok.decode_bytes([t])))
                groups.append([(None, m, plan + [t], pb + tok.decode_bytes([t])) for t in dict.fromkeys(cand)])
            if stop_depth is not None and depth >= stop_depth + self.CLOSING_EXTRA_LEVELS:
                break
            # interleaved: the first child of every state, then the second ..., so no state fills the level
            level = [g[k] for k in range(max((len(g) for g in groups), default=0)) for g in groups if k < len(g)]
            if not level:
                break
        return sorted(found, key=len)

    def _greedy_closing(self, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                        byte_ids: np.ndarray | None = None, byte_values: bytes = b"") -> list[int] | None:
        """A short continuation from the frozen state that lets a stop token end the output (the
        stop token itself not included): a greedy walk, not a proof of minimality. Each step takes
        the forced tokens, else an allowed closer (inside a JSON string the longest that starts
        with ``"``, outside one made of ``]``/``}``, then the shortest that starts with ``"``), else
        a single-byte token (``byte_ids[i]`` spells ``byte_values[i]``): punctuation not yet used in the plan first (it
        moves a regex like ``[a-z.]+@[a-z]+`` on to its next part), then the lowest; else the lowest
        allowed id. ``quote_ids`` / ``bracket_ids`` are in order of preference. None when longer
        than ``max_n`` or at a dead end."""
        if self._frozen_eos:
            return []
        tok = self.constraint.tokenizer_info.lltok
        in_str, esc = _json_string_state(tok.decode_bytes(self.frozen_tokens), False, False)
        m = self._frozen.deep_copy()
        row = self._scratch[0]
        plan: list[int] = []
        while len(plan) <= max_n:
            m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            if self._and_row is not None:
                row &= self._and_row
            if (row & self._stop_row).any():
                return plan
            picks = [] if m.is_stopped() else list(m.compute_ff_tokens())
            if not picks:
                pick = None
                # outside a string a quote token only opens one: take the shortest (a bare `"`), so
                # `"]}` is never written as the content of a new string
                for ids in ((quote_ids,) if in_str else (bracket_ids, quote_ids[::-1])):
                    if ids.size:
                        ok = allowed_among(row, ids)
                        if ok.size:
                            pick = int(ids[ok[0]])
                            break
                if pick is None and byte_ids is not None and byte_ids.size:
                    ok = allowed_among(row, byte_ids)
                    if ok.size:
                        fresh = [i for i in ok if not chr(byte_values[i]).isalnum() and byte_ids[i] not in plan]
                        pick = int(byte_ids[fresh[0] if fresh else ok[0]])
                if pick is None:
                    allowed = np.flatnonzero(bitmask_to_bool(row[None, :], self.vocab_size)[0])
                    if not allowed.size:
                        return None
                    pick = int(allowed[0])
                picks = [pick]
            if not m.consume_tokens(picks):  # pragma: no cover - the picks were allowed
                raise ConstraintEngineError(f"the matcher refused closing tokens it allowed: {clip(m.get_error())}")
            plan.extend(picks)
            in_str, esc = _json_string_state(tok.decode_bytes(picks), in_str, esc)
        return None

    @guarded("filling a canvas")
    def greedy_fill(self, logits_rows: Any, max_n: int, *, topk: int = 64) -> list[int]:
        """Masked greedy decode from the frozen state over ``logits_rows`` (``[n, V']`` torch
        tensor or numpy array, row ``i`` = position ``frontier + i``): argmax of the allowed tokens
        at each position, stopping after a stop token (included) or when nothing is allowed.
        Returns the tokens (not committed); always a grammar-accepted prefix."""
        if self._frozen_eos or max_n <= 0:
            return []
        n = min(int(max_n), int(logits_rows.shape[0]))
        if n <= 0:
            return []
        V = self.vocab_size
        try:
            import torch
            is_torch = isinstance(logits_rows, torch.Tensor)
        except ImportError:  # pragma: no cover
            is_torch = False
        L = logits_rows[:n, :V]
        K = min(topk, L.shape[1])
        if is_torch:
            top = torch.topk(L.float(), K, dim=-1).indices.cpu().numpy()
        else:
            L = np.asarray(L, dtype=np.float32)
            top = np.argsort(-L, axis=-1, kind="stable")[:, :K]
        m = self._frozen.deep_copy()
        row = self._scratch[0]
        out: list[int] = []
        for i in range(n):
            m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            if self._and_row is not None:
                row &= self._and_row
            cand = top[i].astype(np.int64)
            hit = allowed_among(row, cand)
            if hit.size:
                pick = int(cand[hit[0]])
            else:
                allowed = bitmask_to_bool(row[None, :], V)[0]
                if not allowed.any():
                    break
                if is_torch:
                    li = L[i].float().cpu().numpy()
                else:
                    li = L[i]
                idx = np.flatnonzero(allowed[: li.shape[0]])
                if not idx.size:
                    break
                pick = int(idx[np.argmax(li[idx])])  # an allowed id even when all its logits are -inf
            out.append(pick)
            if pick in self._stops:
                break
            if not m.consume_token(pick):  # pragma: no cover - pick was allowed
                out.pop()
                break
        return out
