"""Finishing a row: budget-aware closing plans and the masked greedy fill.

When a row's token budget runs low the guide steers it along a *closing plan*: close the open
string, arrays and objects (or finish a regex / grammar) so the output ends valid instead of running
out. :func:`closing_plan` finds one from a :class:`~.walker.CanvasWalker`'s frozen state; the
candidates it tries come from :func:`closing_candidates` (closer tokens and one single-byte token per
byte, scanned once per tokenizer) and :func:`closer_ids` (those plus a constraint's own closers).
The searches themselves (a stepwise walk with a local exhaustive search, then the global beam
search) are in :mod:`.closing_search`; :func:`plan_still_closes` lets the guide reuse a plan across
commits. The JSON heuristics (string state, validation of a completion) live there and here, not in
the walker. :func:`greedy_fill` ends a canvas that stopped with open positions (masked argmax);
:func:`greedy_fill_reads` is the same walk as a generator of its host reads, and :func:`read_together`
runs the fills of many rows side by side with one host read per round, not per row.

The walker is used through its public state only: ``constraint``, ``frozen_tokens``,
``eos_committed``, ``stop_token_ids``, ``vocab_size``, ``frozen_cursor()`` (else ``frozen_matcher()``),
``mask_of()`` and ``allows_stop()``. No matcher is copied per search node or per commit: a copy costs
O(output length), so every search moves one borrowed matcher by rollback and consume
(:class:`~.walker.MatcherCursor`), and the JSON string state of the frozen text is carried forward
from commit to commit (:func:`~.closing_search.frozen_string_state`).

>>> json_string_state(b'{"a":"x', False, False)
(True, False)
>>> segment_punct(b'"a.b-c')
b'-.'
"""
from __future__ import annotations

import json
from typing import Any, Generator, Sequence

import numpy as np

from .bitmask_np import allowed_among, bitmask_allows, bitmask_to_bool
from .closing_search import (CLOSING_BEAM, CLOSING_EXAMINE, CLOSING_EXTRA_LEVELS, byte_representatives,  # noqa: F401
                             json_string_state, run_shape, search_closing, segment_punct, stepwise_closing,
                             allowed_closer, closing_walk, frozen_cursor, frozen_string_state)
from .cursor import StaleMaskError
from .safety import engine_guard
from .tokenizer import vocab_scan

__all__ = ["closing_plan", "plan_still_closes", "closing_candidates", "closer_ids", "greedy_fill", "greedy_fill_reads",
           "read_together", "CLOSING_BEAM", "CLOSING_EXAMINE",
           "CLOSING_EXTRA_LEVELS"]



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


_CANDIDATES: dict[tuple, tuple] = {}  # (info.key, max_len) -> (lltok, candidates)


def closing_candidates(info: Any, max_len: int | None = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
    """The closing candidates of a tokenizer (``info``: a TokenizerInfo): tokens that start with ``"``
    and hold only ``"``/``]``/``}``, tokens of only ``]``/``}`` (both longest first, at most ``max_len``
    bytes; None: any length), and the single-byte tokens with their bytes. Derived from the tokenizer's
    :func:`~.tokenizer.vocab_scan` (read once per ``LLTokenizer``, when its info is built): no
    vocabulary pass here."""
    ck = (info.key, max_len)
    hit = _CANDIDATES.get(ck)
    if hit is not None and hit[0] is info.lltok:
        return hit[1]
    scan = vocab_scan(info.lltok)
    specials = info.special_token_ids
    quote: dict[int, int] = {}
    bracket: dict[int, int] = {}
    for t, n, quoted in scan.closers:  # by id, as the stable sorts below expect
        if t in specials or (max_len is not None and n > max_len):
            continue
        (quote if quoted else bracket)[t] = n
    single = {}
    for b, ids in scan.single_bytes.items():
        t = next((t for t in ids if t not in specials), None)
        if t is not None:
            single[b] = t
    order = sorted(single)
    cands = (*(np.asarray(sorted(d, key=lambda t: -d[t]), dtype=np.int64) for d in (quote, bracket)),
             np.asarray([single[b] for b in order], dtype=np.int64), bytes(order))
    if len(_CANDIDATES) >= 16:
        _CANDIDATES.pop(next(iter(_CANDIDATES)))
    _CANDIDATES[ck] = (info.lltok, cands)
    return cands


def closer_ids(walker: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
    """The guide's closing candidates for ``walker``: :func:`closing_candidates` of any length, with
    the constraint's own ``closing_token_ids`` (control tokens that end its strings / blocks) first
    among the bracket closers."""
    hit = closing_candidates(walker.constraint.tokenizer_info, max_len=None)
    extra = tuple(getattr(walker.constraint, "closing_token_ids", ()))
    if extra:
        quote, bracket, byte_ids, byte_values = hit
        hit = (quote, np.concatenate([np.asarray(extra, dtype=np.int64), bracket]), byte_ids, byte_values)
    return hit


def closing_plan(walker: Any, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                 byte_ids: np.ndarray | None = None, byte_values: bytes = b"", *,
                 search: bool = True) -> list[int] | None:
    """A short continuation from ``walker``'s frozen state after which a stop token may end the output
    (the stop token itself not included), or None when no completion of at most ``max_n`` tokens was
    found.

    First the cheap greedy walk (:func:`_greedy_closing`); its plan is kept when the completed text
    passes semantic validation (formats, ``multipleOf`` ...). Otherwise a breadth-first
    *shortest-completion search* over matcher states (:func:`search_closing`): the frontier is
    expanded level by level with the allowed tokens among the closing candidates (closers, and one
    representative per class of single-byte tokens: every punctuation byte, ``1``/``0``, ``a``,
    ``A``), bounded to :data:`CLOSING_BEAM` states per level; the first levels' completions are
    checked by validation and the shortest valid one wins (else the shortest). It finds a plan
    whenever a completion within ``max_n`` tokens exists in the candidates' reach -- e.g. an email
    pattern's ``@`` and ``.`` that a greedy walk uses up, or ``1111-11-11`` for a date. Candidate
    arrays: as :func:`closing_candidates` returns them (``quote_ids`` / ``bracket_ids`` in order of
    preference, ``byte_ids[i]`` spells ``byte_values[i]``). ``search=False``: the two greedy walks only
    (the search took ~1 s per call on large JSONSchemaBench schemas where none of the three finds a
    valid plan; the guide backs off from it, :mod:`dgemma_struct.guide.budget`)."""
    return closing_plan_checked(walker, quote_ids, bracket_ids, max_n, byte_ids, byte_values, search=search)[0]


def closing_plan_checked(walker: Any, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                         byte_ids: np.ndarray | None = None, byte_values: bytes = b"", *,
                         search: bool = True) -> tuple[list[int] | None, bool]:
    """:func:`closing_plan`, and whether its completion passes validation (False for the shortest
    plan kept when none does, and for None)."""
    if walker.eos_committed:
        return [], True
    if byte_ids is None or not len(byte_values):
        quote_ids, bracket_ids, byte_ids, byte_values = closing_candidates(walker.constraint.tokenizer_info)
    try:
        return _closing_plan(walker, quote_ids, bracket_ids, max_n, byte_ids, byte_values, search)
    except StaleMaskError:   # the walker's matcher was rebuilt on the way out: its masks are exact again
        return _closing_plan(walker, quote_ids, bracket_ids, max_n, byte_ids, byte_values, search)


def _closing_plan(walker: Any, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int, byte_ids: np.ndarray,
                  byte_values: bytes, search: bool = True) -> tuple[list[int] | None, bool]:
    with engine_guard("planning a closing"):
        # every plan is checked against the masks too: the guide commits it as the walker walks it
        greedy = _greedy_closing(walker, quote_ids, bracket_ids, max_n, byte_ids, byte_values)
        if greedy is not None and _completion_valid(walker, greedy) and _mask_closes(walker, greedy):
            return greedy, True
        step = stepwise_closing(walker, quote_ids, bracket_ids, max_n, byte_ids, byte_values)
        if step is not None and _completion_valid(walker, step) and _mask_closes(walker, step):
            return step, True
        found = search_closing(walker, quote_ids, bracket_ids, max_n, byte_ids, byte_values) if search else []
        for plan in found:
            if _completion_valid(walker, plan) and _mask_closes(walker, plan):
                return plan, True
        plans = [p for p in (greedy, step, *found[:1]) if p is not None and _mask_closes(walker, p)]
    return (min(plans, key=len) if plans else None), False


def plan_still_closes(walker: Any, plan: list[int], *, validate: bool = True) -> bool:
    """Whether ``plan`` (an earlier closing plan) still completes ``walker``'s frozen state: every
    token is allowed by the mask at its position (as the walker's ``walk`` checks it), a stop token is
    allowed after it, and (``validate``) the completion passes validation. The guide reuses such a plan
    instead of searching again after every commit (a free string's ``"...`` stays a completion however
    long the string grows)."""
    if walker.eos_committed:
        return not plan
    with engine_guard("checking a closing plan"):
        if any(t in walker.stop_token_ids for t in plan):  # validate_tokens() refuses them
            return False
        return _mask_closes(walker, plan) and (not validate or _completion_valid(walker, plan))


def _mask_closes(walker: Any, plan: list[int]) -> bool:
    """Whether the mask at each position of ``plan`` allows its token and a stop token is allowed
    after it: what the walker's ``walk`` accepts. The matcher alone is not enough: once bytes are
    forced (a string at its ``maxLength`` must close, the next key follows) the mask allows only their
    canonical tokens (``","``) while the matcher still consumes another spelling (``"`` ``,"``)."""
    with frozen_cursor(walker) as cur:
        for t in plan:
            if not bitmask_allows(walker.mask_of(cur.m), t) or not cur.advance([t]):
                return False
        return walker.allows_stop(walker.mask_of(cur.m))


def _completion_valid(walker: Any, plan: list[int]) -> bool:
    """Whether the frozen text plus ``plan`` passes the JSON-Schema validation (formats, keywords the
    grammar leaves out). User validators (pydantic) are not run here: they may have effects."""
    c = walker.constraint
    if c.kind != "json" or (not c.semantic_keywords and not _has_format(c.schema)):
        return True
    stops = set(walker.stop_token_ids)
    text = c.tokenizer_info.lltok.decode_str([t for t in walker.frozen_tokens + plan if t not in stops])
    try:
        value = json.loads(text)
        return not c.validator.schema_issues(value)
    except Exception:  # noqa: BLE001 - not parseable / validator failure: not known valid
        return False


def _greedy_closing(walker: Any, quote_ids: np.ndarray, bracket_ids: np.ndarray, max_n: int,
                    byte_ids: np.ndarray | None = None, byte_values: bytes = b"") -> list[int] | None:
    """A short continuation from the frozen state that lets a stop token end the output (the stop
    token itself not included): a greedy walk, not a proof of minimality. Each step takes the forced
    tokens, else an allowed closer (inside a JSON string the longest that starts with ``"``, outside
    one made of ``]``/``}``, then the shortest that starts with ``"``), else a single-byte token
    (``byte_ids[i]`` spells ``byte_values[i]``): punctuation not yet used in the plan first (it moves
    a regex like ``[a-z.]+@[a-z]+`` on to its next part), then the lowest; else the lowest allowed id.
    ``quote_ids`` / ``bracket_ids`` are in order of preference. None when longer than ``max_n`` or at
    a dead end."""
    if walker.eos_committed:
        return []
    with frozen_cursor(walker) as cur:
        return _greedy_closing_walk(walker, cur, frozen_string_state(walker), quote_ids, bracket_ids, max_n, byte_ids,
                                    byte_values)


def _greedy_closing_walk(walker: Any, cur: Any, state: tuple[bool, bool], quote_ids: np.ndarray,
                         bracket_ids: np.ndarray, max_n: int, byte_ids: np.ndarray | None,
                         byte_values: bytes) -> list[int] | None:
    def choose(row: np.ndarray, state: tuple[bool, bool], plan: list[int]) -> list[int] | None:
        pick = allowed_closer(row, state[0], quote_ids, bracket_ids)
        if pick is None and byte_ids is not None and byte_ids.size:
            ok = allowed_among(row, byte_ids)
            if ok.size:
                fresh = [i for i in ok if not chr(byte_values[i]).isalnum() and byte_ids[i] not in plan]
                pick = int(byte_ids[fresh[0] if fresh else ok[0]])
        if pick is None:
            allowed = np.flatnonzero(bitmask_to_bool(row[None, :], walker.vocab_size)[0])
            if not allowed.size:
                return None
            pick = int(allowed[0])
        return [pick]

    return closing_walk(walker, cur, state, max_n, choose, strict=True)


# ----------------------------------------------------------------------------------------------
# greedy fill: the masked argmax that ends a stopped canvas
# ----------------------------------------------------------------------------------------------
def greedy_fill(walker: Any, logits_rows: Any, max_n: int, *, topk: int = 64) -> list[int]:
    """Masked greedy decode from ``walker``'s frozen state over ``logits_rows`` (``[n, V']`` torch
    tensor or numpy array, row ``i`` = position ``frontier + i``): argmax of the allowed tokens
    at each position, stopping after a stop token (included) or when nothing is allowed.
    Returns the tokens (not committed); always a grammar-accepted prefix."""
    return read_together([greedy_fill_reads(walker, logits_rows, max_n, topk=topk)])[0]


def greedy_fill_reads(walker: Any, logits_rows: Any, max_n: int, *,
                      topk: int = 64) -> Generator[Any, np.ndarray, list[int]]:
    """:func:`greedy_fill` as a generator of its host reads: on torch logits it yields each int64
    tensor whose values it needs on the host (the top-``topk`` ids of its positions, then one id per
    position where none of them is allowed) and is sent them back as a numpy array of the same shape;
    it returns the fill. :func:`read_together` runs the fills of many rows side by side."""
    with engine_guard("filling a canvas"):
        return (yield from _greedy_fill(walker, logits_rows, max_n, topk))


def read_together(jobs: Sequence[Generator[Any, np.ndarray, Any]]) -> list[Any]:
    """Runs generators of host reads (as :func:`greedy_fill_reads`) side by side and returns what
    each returns. Each round, every job still running has yielded one int64 tensor; they come to the
    host in one transfer (one host-device sync on a GPU, however many jobs) and each job is sent its
    values. Rounds: the most reads one job needs, not their sum over the jobs. Jobs left running by
    an error are closed (their matcher cursors roll back)."""
    out: list[Any] = [None] * len(jobs)
    pending: dict[int, Any] = {}

    def send(i: int, value: Any) -> None:
        try:
            pending[i] = jobs[i].send(value)
        except StopIteration as stop:
            out[i] = stop.value

    try:
        for i in range(len(jobs)):
            send(i, None)
        while pending:
            import torch

            reads = list(pending.items())
            pending.clear()
            flat = torch.cat([t.reshape(-1).long() for _, t in reads]) if len(reads) > 1 else reads[0][1].long()
            host = flat.numpy(force=True).reshape(-1)
            at = 0
            for i, t in reads:
                send(i, host[at:at + t.numel()].reshape(tuple(t.shape)))
                at += t.numel()
    finally:
        for job in jobs:
            job.close()
    return out


def _greedy_fill(walker: Any, logits_rows: Any, max_n: int, topk: int) -> Generator[Any, np.ndarray, list[int]]:
    if walker.eos_committed or max_n <= 0:
        return []
    n = min(int(max_n), int(logits_rows.shape[0]))
    if n <= 0:
        return []
    V = walker.vocab_size
    is_torch = not isinstance(logits_rows, np.ndarray) and hasattr(logits_rows, "topk")
    L = logits_rows[:n, :V]
    K = min(topk, L.shape[1])
    if is_torch:
        top = yield L.float().topk(K, dim=-1).indices
    else:
        L = np.asarray(L, dtype=np.float32)
        top = np.argsort(-L, axis=-1, kind="stable")[:, :K]
    with frozen_cursor(walker) as cur:
        return (yield from _greedy_fill_walk(walker, cur, L, top, n, is_torch))


def _greedy_fill_walk(walker: Any, cur: Any, L: Any, top: np.ndarray, n: int,
                      is_torch: bool) -> Generator[Any, np.ndarray, list[int]]:
    m, V = cur.m, walker.vocab_size
    stops = frozenset(walker.stop_token_ids)
    # while the fill follows the draft the last walks accepted, their mask rows are the fill's
    path, rows = walker.cached_path() if hasattr(walker, "cached_path") else ([], [])
    out: list[int] = []
    follow = True  # out == path[:i]
    for i in range(n):
        row = rows[i] if follow and i < len(rows) else walker.mask_of(m)
        cand = top[i].astype(np.int64)
        hit = allowed_among(row, cand)
        if hit.size:
            pick = int(cand[hit[0]])
        else:
            allowed = bitmask_to_bool(row[None, :], V)[0]
            idx = np.flatnonzero(allowed[: L.shape[1]])
            if not idx.size:
                break
            # the allowed id of the highest logit (the first on ties), even when all are -inf
            if is_torch:
                import torch

                at = yield L[i].index_select(0, torch.from_numpy(idx).to(L.device)).float().argmax().reshape(1)
                pick = int(idx[int(at[0])])
            else:
                pick = int(idx[np.argmax(L[i][idx])])
        out.append(pick)
        follow = follow and i < len(path) and path[i] == pick
        if pick in stops:
            break
        if not cur.advance([pick]):  # pragma: no cover - pick was allowed
            out.pop()
            break
    return out
