"""The closing searches behind :func:`~.closing.closing_plan` (kept apart from the greedy walks).

:func:`stepwise_closing` walks the structure greedily (forced tokens, closers) and, where no closer
is allowed yet (inside a lexeme with a pattern, a number, a key to write), runs a small exhaustive
breadth-first search (:func:`_local_search`) for the shortest way to the next point where one is
(or a stop token). :func:`search_closing` is the older
global beam search, kept for completions that must pass validation (formats).
Both greedy walks (this one and :mod:`.closing`'s) run the loop of :func:`closing_walk`.

>>> run_shape(b'x.1a')
b'1a'
"""
from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from .bitmask_np import allowed_among, bitmask_to_bool
from .cursor import MatcherCursor, StaleMaskError
from .safety import clip

CLOSING_BEAM = 32  # distinct states kept per search level
CLOSING_EXAMINE = 128  # children examined per search level
CLOSING_EXTRA_LEVELS = 3  # levels searched past the first completion (for a valid one)
CLOSING_NODES = 8192  # children examined by one search in all (a 255-level search took 1.3 s on JSONSchemaBench)


def json_string_state(text: bytes, in_str: bool, esc: bool) -> tuple[bool, bool]:
    """Whether a JSON text that starts in state (in_str, esc) ends inside a string literal."""
    for ch in text:
        if esc:
            esc = False
        elif in_str and ch == 0x5C:  # backslash
            esc = True
        elif ch == 0x22:  # quote
            in_str = not in_str
    return in_str, esc


_STRING_STATE: "weakref.WeakKeyDictionary[Any, tuple]" = weakref.WeakKeyDictionary()


def frozen_string_state(walker: Any) -> tuple[bool, bool]:
    """:func:`json_string_state` of ``walker``'s frozen text, carried forward from the previous
    call: only the tokens committed since are decoded (decoding the whole output on every commit
    near the budget made closing O(n) per commit). The walker's ``frozen_tokens`` list only grows
    in place; a rollback or reset replaces it, which starts the state afresh."""
    toks = walker.frozen_tokens
    try:
        hit = _STRING_STATE.get(walker)
    except TypeError:  # not weak-referenceable: no cache
        hit = None
    n, state = (hit[1], hit[2]) if hit is not None and hit[0] is toks and hit[1] <= len(toks) else (0, (False, False))
    if n < len(toks):
        state = json_string_state(walker.constraint.tokenizer_info.lltok.decode_bytes(toks[n:]), *state)
    try:
        _STRING_STATE[walker] = (toks, len(toks), state)
    except TypeError:
        pass
    return state


@contextmanager
def frozen_cursor(walker: Any) -> Iterator[MatcherCursor]:
    """A :class:`~.cursor.MatcherCursor` at ``walker``'s frozen state: the walker's own matcher,
    lent and rolled back (:meth:`~.walker.CanvasWalker.frozen_cursor`), or a copy for a walker
    without that method."""
    lend = getattr(walker, "frozen_cursor", None)
    if lend is not None:
        with lend() as cur:
            yield cur
    else:
        yield MatcherCursor(walker.frozen_matcher(), frozenset(walker.stop_token_ids))


_REP_ORDER = b"10aA"


def segment_punct(pb: bytes) -> bytes:
    """The distinct punctuation bytes written since the plan's last quote (the current string or
    lexeme): what tells apart regex states whose masks are equal."""
    seg = pb[pb.rfind(b'"') + 1:]
    return bytes(sorted({ch for ch in seg if not chr(ch).isalnum()}))


def run_shape(pb: bytes, keep: int = 3) -> bytes:
    """The classes (``1`` digit, ``a`` lower, ``A`` upper, ``u`` other) of the last ``keep`` bytes
    of the plan's trailing alphanumeric run: states with equal masks whose runs differ in class are
    different regex states (after ``.`` an email TLD needs two *letters*: ``.1`` and ``.a`` differ).

    >>> run_shape(b'x.1a')
    b'1a'
    """
    i = len(pb)
    while i > 0 and (chr(pb[i - 1]).isalnum() or pb[i - 1] >= 0x80):
        i -= 1
    run = pb[max(i, len(pb) - keep):]
    return bytes(0x31 if 0x30 <= ch <= 0x39 else 0x61 if 0x61 <= ch <= 0x7A else 0x41 if 0x41 <= ch <= 0x5A
                 else 0x75 for ch in run)


def byte_representatives(byte_ids: np.ndarray, byte_values: bytes, grammar: str = "") -> np.ndarray:
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


def search_closing(walker: Any, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                    byte_ids: np.ndarray, byte_values: bytes) -> list[list[int]]:
    """Completions (plans) found by a bounded breadth-first search, shortest first.

    States of one level whose masks are identical are taken as one automaton state (inside a regex
    lexeme every ``\\S`` byte leads to the same state), so a level holds at most :data:`CLOSING_BEAM`
    distinct states and examines at most :data:`CLOSING_EXAMINE` children (:data:`CLOSING_NODES` in
    all); children of different states are interleaved so that no state fills the level."""
    c = walker.constraint
    tok = c.tokenizer_info.lltok
    reps = byte_representatives(byte_ids, byte_values, c.grammar)
    quote_ids = np.asarray(quote_ids, dtype=np.int64)
    closers = np.concatenate([np.asarray(bracket_ids, dtype=np.int64), quote_ids[::-1]])
    is_json = c.kind == "json"
    in_str0 = frozen_string_state(walker) if is_json else (False, False)
    with frozen_cursor(walker) as cur:
        return _search_levels(walker, cur, tok, reps, quote_ids, closers, is_json, in_str0, max_n)


def _search_levels(walker: Any, cur: MatcherCursor, tok: Any, reps: np.ndarray, quote_ids: np.ndarray,
                   closers: np.ndarray, is_json: bool, in_str0: tuple[bool, bool], max_n: int) -> list[list[int]]:
    # a node: (plan, plan bytes); the one matcher is moved to each node (rollback + consume, no copy)
    level: list[tuple] = [([], b"")]
    found: list[list[int]] = []
    stop_depth = None
    total = 0
    for depth in range(max_n + 1):
        if total >= CLOSING_NODES:
            break
        groups: list[list[tuple]] = []
        seen_masks: set[bytes] = set()
        seen_bytes: set[bytes] = set()
        examined = 0
        for plan, pb in level:
            if examined >= CLOSING_EXAMINE or len(seen_masks) >= CLOSING_BEAM:
                break
            if pb in seen_bytes:
                continue
            seen_bytes.add(pb)
            examined += 1
            if not cur.goto(plan):
                continue
            m = cur.m
            row = walker.mask_of(m)
            if walker.allows_stop(row):
                found.append(plan)
                stop_depth = depth if stop_depth is None else stop_depth
                if len(found) >= 8:
                    return found
                continue
            in_str = json_string_state(pb, *in_str0) if is_json else (False, False)
            # equal masks are not equal states (every \\S byte is allowed before and after the '@'
            # of an email pattern): the key adds the punctuation used and the string state
            key = (row.tobytes(), segment_punct(pb), run_shape(pb), in_str)
            if key in seen_masks:
                continue
            seen_masks.add(key)
            if len(plan) >= max_n or m.is_stopped():
                continue
            ff = list(m.compute_ff_tokens())[: max_n - len(plan)]
            if ff:
                if cur.advance(ff):
                    groups.append([(plan + ff, pb + tok.decode_bytes(ff))])
                continue
            ids = quote_ids if in_str[0] else closers
            cand = [int(ids[k]) for k in allowed_among(row, ids)[:3]]
            ok = allowed_among(row, reps)
            # bytes the plan has used least first: writing '-' forever never closes anything
            cand += sorted((int(reps[k]) for k in ok), key=lambda t: pb.count(tok.decode_bytes([t])))
            groups.append([(plan + [t], pb + tok.decode_bytes([t])) for t in dict.fromkeys(cand)])
        total += examined
        if stop_depth is not None and depth >= stop_depth + CLOSING_EXTRA_LEVELS:
            break
        # interleaved: the first child of every state, then the second ..., so no state fills the level
        level = [g[k] for k in range(max((len(g) for g in groups), default=0)) for g in groups if k < len(g)]
        if not level:
            break
    return sorted(found, key=len)




LOCAL_NODES = 4000  # children created by one local search at most (each: a cursor move and a mask)


def _class_candidates(row: np.ndarray, reps: np.ndarray, byte_ids: np.ndarray, byte_values: bytes) -> list[int]:
    """The single-byte candidates of one node: the representatives the mask allows, then, for each
    of the classes digit / lower / upper that no allowed representative stands for, its first
    allowed byte (``[A-D]`` allows ``A`` but ``(foo|bar)`` allows neither ``a`` nor ``A``)."""
    ok = set(int(reps[k]) for k in allowed_among(row, reps))
    out = [int(t) for t in reps if int(t) in ok]
    have = {run_shape(bytes([byte_values[i]]))
            for i in range(len(byte_values)) if int(byte_ids[i]) in ok}
    for i in allowed_among(row, byte_ids):
        b = byte_values[i]
        if chr(b).isalnum() and b < 0x80:
            cls = run_shape(bytes([b]))
            if cls not in have:
                have.add(cls)
                out.append(int(byte_ids[i]))
    return out


def _local_search(walker: Any, cur: MatcherCursor, in_str0: tuple[bool, bool], limit: int, closers: np.ndarray,
                  quote_ids: np.ndarray, reps: np.ndarray, byte_ids: np.ndarray, byte_values: bytes) -> list[int] | None:
    """The shortest run of candidate tokens (at most ``limit``) from the cursor's state after which a
    stop token or a closer is allowed; None if none is found
    within :data:`LOCAL_NODES` children. Children whose mask, punctuation used, trailing run shape
    and string state are equal are taken as one state. The cursor is left anywhere: its caller
    moves it on with ``goto``."""
    tok = walker.constraint.tokenizer_info.lltok
    is_json = walker.constraint.kind == "json"
    base = list(cur.plan)
    row0 = walker.mask_of(cur.m).copy()
    level = [(row0, [], b"")]
    seen: set = set()
    made = 0
    for _ in range(limit):
        nxt = []
        for row, path, pb in level:
            cand = _class_candidates(row, reps, byte_ids, byte_values)
            if not cand:  # nothing among the candidates: the lowest allowed id
                allowed = np.flatnonzero(bitmask_to_bool(row[None, :], walker.vocab_size)[0])
                cand = [int(allowed[0])] if allowed.size else []
            for t in cand:
                if not cur.goto(base + path + [t]):
                    continue
                c = cur.m
                made += 1
                b = pb + tok.decode_bytes([t])
                crow = walker.mask_of(c).copy()
                in_str = json_string_state(b, *in_str0) if is_json else (False, False)
                ids = quote_ids if in_str[0] else closers
                # (a forced continuation is no goal: '#(foo|bar)+' forces 'ar' after 'b', for ever)
                if walker.allows_stop(crow) or (ids.size and allowed_among(crow, ids).size):
                    return path + [t]
                key = (crow.tobytes(), segment_punct(b), run_shape(b), in_str)
                if key not in seen and not c.is_stopped():
                    seen.add(key)
                    nxt.append((crow, path + [t], b))
                if made >= LOCAL_NODES:
                    return None
        level = nxt
        if not level:
            return None
    return None


def allowed_closer(row: np.ndarray, in_string: bool, quote_ids: np.ndarray, bracket_ids: np.ndarray) -> int | None:
    """The closer a closing walk takes at a mask ``row``: inside a JSON string the first allowed of
    ``quote_ids`` (longest first); outside one the first allowed of ``bracket_ids``, else the
    shortest allowed quote token (outside a string a quote only opens one, so ``"]}`` is never
    written as a new string's content). None when no closer is allowed."""
    for ids in ((quote_ids,) if in_string else (bracket_ids, quote_ids[::-1])):
        if ids.size:
            ok = allowed_among(row, ids)
            if ok.size:
                return int(ids[ok[0]])
    return None


def stepwise_closing(walker: Any, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                      byte_ids: np.ndarray, byte_values: bytes) -> list[int] | None:
    """A completion of at most ``max_n`` tokens from the frozen state (the stop token not included),
    or None: forced tokens, else an allowed closer (as the greedy walk picks them), else the
    shortest local run to the next closer (:func:`_local_search`)."""
    c = walker.constraint
    is_json = c.kind == "json"
    reps = byte_representatives(byte_ids, byte_values, c.grammar)
    quote_ids = np.asarray(quote_ids, dtype=np.int64)
    closers = np.concatenate([np.asarray(bracket_ids, dtype=np.int64), quote_ids[::-1]])
    state = frozen_string_state(walker) if is_json else (False, False)
    with frozen_cursor(walker) as cur:
        return _stepwise_walk(walker, cur, is_json, state, quote_ids, bracket_ids, closers, reps, max_n,
                              byte_ids, byte_values)


def _stepwise_walk(walker: Any, cur: MatcherCursor, is_json: bool, state: tuple[bool, bool],
                   quote_ids: np.ndarray, bracket_ids: np.ndarray, closers: np.ndarray, reps: np.ndarray, max_n: int,
                   byte_ids: np.ndarray, byte_values: bytes) -> list[int] | None:
    def choose(row: np.ndarray, state: tuple[bool, bool], plan: list[int]) -> list[int] | None:
        if cur.m.is_stopped():
            return None
        closer = allowed_closer(row, state[0], quote_ids, bracket_ids)
        if closer is not None:
            return [closer]
        return _local_search(walker, cur, state, max_n - len(plan), closers, quote_ids, reps, byte_ids, byte_values)

    return closing_walk(walker, cur, state, max_n, choose, track_string=is_json)


def closing_walk(walker: Any, cur: MatcherCursor, state: tuple[bool, bool], max_n: int,
                 choose: Callable[[np.ndarray, tuple[bool, bool], list[int]], list[int] | None], *,
                 track_string: bool = True, strict: bool = False) -> list[int] | None:
    """The loop of the closing walks: from the cursor's state, until a stop token is allowed (the
    plan is returned, the stop token not included), at each position the grammar's forced tokens,
    else ``choose(mask row, JSON string state, plan so far)`` (None or empty: a dead end, None is
    returned). None also past ``max_n`` tokens. ``track_string``: the string state follows the
    picks (else it stays ``state``). The cursor moves with ``goto`` (a ``choose`` may move it); a
    refused pick is a dead end, or with ``strict`` a :class:`~.cursor.StaleMaskError` (the cursor left dirty)."""
    m, tok = cur.m, walker.constraint.tokenizer_info.lltok
    plan: list[int] = []
    while len(plan) <= max_n:
        row = walker.mask_of(m)
        if walker.allows_stop(row):
            return plan
        picks = [] if m.is_stopped() else list(m.compute_ff_tokens())
        if not picks:
            picks = choose(row, state, plan)
            if not picks:
                return None
        if not cur.goto(plan + picks):  # the picks were allowed: a stale mask (see StaleMaskError)
            if strict:
                cur.dirty = True  # the lender rebuilds its matcher
                raise StaleMaskError(f"the matcher refused closing tokens it allowed: {clip(m.get_error())}")
            return None
        plan.extend(picks)
        if track_string:
            state = json_string_state(tok.decode_bytes(picks), *state)
    return None
