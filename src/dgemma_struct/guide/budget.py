"""Budget-aware closing, the guide's side: how much room a row has left before it must close, and
the logit bias that steers it along its closing plan.

A row may commit at most ``budget`` tokens, its stop token included. Once the tokens left are no
more than the length of its closing plan (:func:`dgemma_struct.constraints.closing_plan`, candidates from
:func:`dgemma_struct.constraints.closer_ids`: close strings,
arrays and objects, then EOS) plus a margin, the plan's tokens get a large logit bonus, position
by position from the frontier. The bonus is added to *masked* logits, so it never unmasks
anything: the output stays exact, it only ends sooner.

Example::

    >>> import torch
    >>> logits = torch.zeros(3, 8)
    >>> bias_plan(logits, [5], stop_ids=(1,))
    >>> logits.argmax(dim=-1).tolist()[:2]
    [5, 1]
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from dgemma_struct.constraints import closer_ids, closing_plan, closing_plan_checked, plan_still_closes

if TYPE_CHECKING:
    from dgemma_struct.guide.rows import RowState

CLOSING_MARGIN = 2      # tokens kept free beyond the plan (forced keys and brackets still fit)
FAR_FROM_END = 96       # more tokens left than this (and than a plan and a step need): no plan is estimated
PLAN_BONUS = 1e4        # added to a plan token's (masked) logit
PEAK_WINDOW = 48        # commits over which the longest closing plan counts (:func:`_plan_peak`)
NEAR_END_CHECKED = 4    # AR near the end: the top tokens checked for a closing plan (:func:`keep_a_plan`)
SEARCH_BACKOFF = (8, 128)  # commits without a closing search after one found no valid plan: first, at most

def free_room(row: RowState, canvas: tuple[int, int] | None, margin: int | None = None) -> tuple[int, list[int] | None]:
    """``(tokens the row may still commit freely, its closing plan)``. Room 0 means: close now,
    following the plan (``None``: no plan fits). The room is what is left before the stop token
    (and, in a canvas ``(index, length)``, before the last position the budget reaches) minus the
    plan's length and ``margin``."""
    w = row.walker
    remaining, margin = _left(row, canvas, margin)
    key = len(w.frozen_tokens)
    if row.plan_hint is None:  # one estimate at the row's start: how long closing may take
        first = _estimate(row, key, remaining)
        row.plan_hint = remaining if first is None else len(first)
    # far from the end -- further than the longest plan seen plus what one step may commit -- no estimate
    if remaining > max(FAR_FROM_END, row.plan_hint + margin + (canvas[1] if canvas else 1)):
        return remaining, []
    plan = _estimate(row, key, remaining)
    if plan is None:  # no plan fits
        return 0, None
    row.plan_hint = max(row.plan_hint, len(plan))
    if row.must_close:
        return 0, plan
    return max(0, remaining - _plan_peak(row, len(plan)) - margin), plan


def _estimate(row: RowState, key: int, remaining: int) -> list[int] | None:
    """The row's closing plan at walker length ``key`` (cached in ``row.closing_est``)."""
    if row.closing_est is None or row.closing_est[0] != key:
        row.closing_est = (key, _next_plan(row, remaining))
    return row.closing_est[1]


def _left(row: RowState, canvas: tuple[int, int] | None, margin: int | None) -> tuple[int, int]:
    """(:func:`_remaining`, the margin: ``margin`` or :data:`CLOSING_MARGIN`)."""
    return _remaining(row, canvas), CLOSING_MARGIN if margin is None else margin


def _remaining(row: RowState, canvas: tuple[int, int] | None) -> int:
    """Tokens the row may still commit before its stop token (and, in a canvas ``(index, length)``,
    before the last position its budget reaches: padding inside an output uses positions too)."""
    remaining = row.budget - 1 - row.committed
    if canvas is not None:
        idx, L = canvas
        remaining = min(remaining, -(-row.budget // L) * L - (idx * L + row.n_frozen) - 1)
    return remaining


def _plan_peak(row: RowState, n: int) -> int:
    """The longest closing plan of the row's last :data:`PEAK_WINDOW` commits: one step can open a new
    array element whose plan is that long again (at ``},`` of an order's line items the plan is ``]}``,
    two tokens; after ``{"sku":"`` it is twenty), so the row closes while another element would still
    fit instead of starting one it cannot finish (an endless list ran out of every budget)."""
    hist = row.plan_lens
    if not hist or hist[-1][0] != row.committed:
        hist.append((row.committed, n))
    while hist[0][0] < row.committed - PEAK_WINDOW:
        hist.pop(0)
    return max(m for _, m in hist)


def _next_plan(row: RowState, remaining: int) -> list[int] | None:
    """The row's closing plan after its latest commits: the previous plan, advanced past the tokens
    that followed it, while it still completes the output within ``remaining`` (incremental: no search
    per commit while the row writes inside a string); else a fresh :func:`closing_plan`."""
    w, est = row.walker, row.closing_est
    n = len(w.frozen_tokens)
    backing_off = n < row.search_after   # the last search found no valid plan: the last plan, while the masks take it
    if est is not None and est[1] is not None and est[0] <= n:
        old, new = est[1], w.frozen_tokens[est[0]:]
        plan = old[len(new):] if old[:len(new)] == new else old
        if len(plan) <= remaining and plan_still_closes(w, plan, validate=not backing_off):
            return plan
    if backing_off:
        return None
    quote, bracket, byte_ids, byte_values = closer_ids(w)
    plan, valid = closing_plan_checked(w, quote, bracket, remaining, byte_ids, byte_values)
    if not valid:
        # no valid plan: the searches would not find one a commit later either, and they took 0.3-1.5 s
        # per step on large JSONSchemaBench schemas (each request ran into its timeout)
        row.search_gap = min(2 * row.search_gap, SEARCH_BACKOFF[1]) if row.search_gap else SEARCH_BACKOFF[0]
        row.search_after = n + row.search_gap
    else:
        row.search_gap = 0
    return plan


def bias_plan(logits: torch.Tensor, plan: Sequence[int], stop_ids: Sequence[int]) -> None:
    """``logits``: ``[n, V]`` rows from the frontier; prefer ``plan[i]`` at row i, then a stop token."""
    n = logits.shape[0]
    for i, t in enumerate(plan[:n]):
        logits[i, t] += PLAN_BONUS
    if len(plan) < n:
        logits[len(plan), list(stop_ids)] += PLAN_BONUS


def steer_to_close(row: RowState, logits: torch.Tensor, canvas: tuple[int, int] | None,
                   margin: int | None = None) -> bool:
    """When the row must close now, bias ``logits`` (``[n, V]`` rows from its frontier) towards
    its closing plan, then a stop token (only a stop token when no plan fits). True if it did."""
    room, plan = free_room(row, canvas, margin)
    if room:
        return False
    plan = plan or []
    bias_plan(logits, plan, row.walker.stop_token_ids)
    row.closing = row.closing or bool(plan) or row.walker.is_accepting()
    return True


def cap_run(row: RowState, tokens: list[int], canvas: tuple[int, int] | None, margin: int | None = None) -> list[int]:
    """Commits in one step stop at the start of the closing window (one canvas step can accept
    many positions at once, and the plan is only known from the frontier). Inside the last plan's
    length, a run is cut further to its longest prefix after which (and after the tokens the grammar
    then forces) a closing plan still fits: one token can lengthen the plan by more than it uses (the
    first letters of a grounded span's long word force the rest of it, a new array element needs
    its own closing), and a row that passed that point ran out of every budget. The row then closes."""
    room, plan = free_room(row, canvas, margin)
    if room == 0:
        return tokens
    run = tokens[:room]
    if plan and room < len(plan) and run:
        k = _fitting_prefix(row, run, *_left(row, canvas, margin))
        if k < len(run):
            row.must_close = True
            run = run[:k]
    return run


def _fitting_prefix(row: RowState, run: list[int], remaining: int, margin: int) -> int:
    """The longest prefix of ``run`` after which a closing plan still fits in ``remaining`` (a stop
    token in the run ends the output: it fits). Tried on the row's walker, rolled back after."""
    w = row.walker
    stops = set(w.stop_token_ids)
    base = len(w.frozen_tokens)
    run = run[:w.walk(run).n_valid]
    for k in range(len(run), 0, -1):
        if run[k - 1] in stops:
            return k
        w.commit(run[:k])
        try:
            forced = w.forced_tokens(max(0, remaining - k))
            if forced and forced[-1] in stops:
                return k
            w.commit(forced)
            left = remaining - k - len(forced)
            quote, bracket, byte_ids, byte_values = closer_ids(w)
            plan = closing_plan(w, quote, bracket, left, byte_ids, byte_values,
                                search=base >= row.search_after) if left > 0 else None
            if plan is not None and len(plan) + margin <= left:
                return k
        finally:
            w.rollback(len(w.frozen_tokens) - base)
    return 0


def keep_a_plan(row: RowState, logits: torch.Tensor, canvas: tuple[int, int] | None, margin: int | None = None) -> None:
    """The AR side of :func:`cap_run`. Near the end (``0 < room <`` the plan's length), the top
    :data:`NEAR_END_CHECKED` tokens of ``logits`` (``[1, V]``, masked) after which no closing plan
    fits are masked out; when none of them fits, the row closes now (steered along its plan). One
    host read per AR step, only in that window."""
    room, plan = free_room(row, canvas, margin)
    if not room or not plan or room >= len(plan):
        return
    vals, idx = logits[0].topk(min(NEAR_END_CHECKED, logits.shape[-1]))
    top = [t for t, v in zip(idx.tolist(), vals.tolist()) if v != float("-inf")]
    left, m = _left(row, canvas, margin)
    bad = [t for t in top if _fitting_prefix(row, [t], left, m) == 0]
    if bad and len(bad) == len(top):
        row.must_close = True
        steer_to_close(row, logits, canvas, margin)
    elif bad:
        logits[0, bad] = float("-inf")
