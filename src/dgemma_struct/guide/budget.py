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

from dgemma_struct.constraints import closer_ids, closing_plan, plan_still_closes

if TYPE_CHECKING:
    from dgemma_struct.guide.rows import RowState

CLOSING_MARGIN = 2      # tokens kept free beyond the plan (forced keys and brackets still fit)
FAR_FROM_END = 96       # more tokens left than this: no plan is estimated
PLAN_BONUS = 1e4        # added to a plan token's (masked) logit
PEAK_WINDOW = 48        # commits over which the longest closing plan counts (:func:`_plan_peak`)

def free_room(row: RowState, canvas: tuple[int, int] | None, margin: int | None = None) -> tuple[int, list[int] | None]:
    """``(tokens the row may still commit freely, its closing plan)``. Room 0 means: close now,
    following the plan (``None``: no plan fits). The room is what is left before the stop token
    (and, in a canvas ``(index, length)``, before the last position the budget reaches) minus the
    plan's length and ``margin``."""
    w = row.walker
    remaining = row.budget - 1 - row.committed  # before the stop token
    if canvas is not None:
        # positions, too: padding inside an output (an empty fill) uses canvas positions
        idx, L = canvas
        positions_left = -(-row.budget // L) * L - (idx * L + row.n_frozen) - 1
        remaining = min(remaining, positions_left)
    margin = CLOSING_MARGIN if margin is None else margin
    if remaining > FAR_FROM_END:  # far from the end: skip the estimate
        return remaining, []
    key = len(w.frozen_tokens)
    if row.closing_est is None or row.closing_est[0] != key:
        row.closing_est = (key, _next_plan(row, remaining))
    plan = row.closing_est[1]
    if plan is None:  # no plan fits
        return 0, None
    return max(0, remaining - _plan_peak(row, len(plan)) - margin), plan


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
    if est is not None and est[1] is not None and est[0] <= len(w.frozen_tokens):
        old, new = est[1], w.frozen_tokens[est[0]:]
        plan = old[len(new):] if old[:len(new)] == new else old
        if len(plan) <= remaining and plan_still_closes(w, plan):
            return plan
    quote, bracket, byte_ids, byte_values = closer_ids(w)
    return closing_plan(w, quote, bracket, remaining, byte_ids, byte_values)


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
    many positions at once, and the plan is only known from the frontier)."""
    room, _ = free_room(row, canvas, margin)
    return tokens if room == 0 else tokens[:room]
