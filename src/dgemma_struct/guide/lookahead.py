"""AR mask look-ahead: the mask for token t depends only on tokens < t, so it is computed on a
worker thread while the forward pass for token t runs (llguidance and torch both release the GIL).

Example::

    >>> ahead = MaskLookahead()
    >>> ahead.submit((0,), lambda rows: len(rows))
    >>> ahead.take((0,), lambda rows: -1)
    1
"""
from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import torch

from dgemma_struct.guide.canonical import merge_noncanonical
from dgemma_struct.guide.budget import free_room, keep_a_plan, steer_to_close
from dgemma_struct.errors import GenerationTimeout
from dgemma_struct.kernels import apply_token_bitmask_
from dgemma_struct.options import check_deadline

MASK_WORKERS = 4

_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _mask_pool() -> ThreadPoolExecutor:
    """The worker threads of AR mask look-ahead (a few, so concurrent sessions do not queue behind
    each other); rebuilt after a fork, whose child inherits no running threads."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=MASK_WORKERS, thread_name_prefix="dgemma-mask"))
    return _POOL[1]


class MaskLookahead:
    """At most one computation ahead: ``submit`` it, ``take`` its result when the rows match (else
    compute now), ``drain`` before anyone else touches the walkers."""

    def __init__(self) -> None:
        self._pending: tuple[tuple[int, ...], Future] | None = None

    def submit(self, rows: tuple[int, ...], compute: Callable[[tuple[int, ...]], Any]) -> None:
        self._pending = (rows, _mask_pool().submit(compute, rows))

    def take(self, rows: tuple[int, ...], compute: Callable[[tuple[int, ...]], Any]) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == rows:
            return pending[1].result()
        if pending is not None:
            pending[1].result()  # never leave a worker running on the walkers
        return compute(rows)

    def drain(self) -> None:
        """Wait for a computation still running (the AR loop may end before using it)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].result()


class ARMasking:
    """The AR half of :class:`~dgemma_struct.guide.constraint_guide.ConstraintGuide` (a mixin over its rows): one
    mask row per sequence, computed ahead on the worker while the forward runs."""

    # ``mask_s`` counts only the time the loop itself spends (waiting for the look-ahead included).
    def _ar_masks(self, rows: tuple[int, ...]) -> np.ndarray | None:
        if not rows:
            return None
        masks = np.concatenate([self.rows[b].walker.mask()[None, :] for b in rows], axis=0)
        if self.close_on_budget:
            for b in rows:
                free_room(self.rows[b], self._canvas, self.closing_window)  # warms the plan cache early
        return masks

    def _ar_rows(self, active: torch.Tensor | list[bool]) -> tuple[int, ...]:
        act = active.tolist() if isinstance(active, torch.Tensor) else active
        return tuple(b for b, r in enumerate(self.rows) if r.walker is not None and act[b] and not r.ended)

    def _force_eos(self, logits: torch.Tensor, b: int) -> None:
        logits[b] = float("-inf")
        logits[b, self.rows[b].walker.stop_token_ids[0]] = 0.0

    def mask_ar_logits(self, logits: torch.Tensor, active: torch.Tensor) -> None:
        try:
            check_deadline(self.deadline)
        except GenerationTimeout:
            self.drain()
            raise
        t0 = time.perf_counter()
        act = active.tolist()
        self._check_cut(act)
        for b, r in enumerate(self.rows):
            if r.ended and act[b] and r.walker is not None:
                self._force_eos(logits, b)
        rows = self._ar_rows(act)
        masks = self._ahead.take(rows, self._ar_masks)
        if rows:
            empty = ~masks.any(axis=1)
            if empty.any():  # nothing allowed for these rows: end them (a dead end), never NaN
                for j in np.flatnonzero(empty):
                    r = self.rows[rows[j]]
                    r.dead_end = r.no_allowed = True
                    self._force_eos(logits, rows[j])
                keep = np.flatnonzero(~empty)
                rows, masks = tuple(rows[j] for j in keep), masks[keep]
        if rows:
            apply_token_bitmask_(logits, masks, indices=torch.tensor(rows, dtype=torch.long, device=logits.device))
        if self.close_on_budget:
            for b in rows:
                if not steer_to_close(self.rows[b], logits[b:b + 1], self._canvas, self.closing_window):
                    keep_a_plan(self.rows[b], logits[b:b + 1], self._canvas, self.closing_window)
        if rows and self.canonical_tokens:
            merge_noncanonical(logits, rows, [self.rows[b].walker for b in rows])
        if any(r.lp_top is not None for r in self.rows):
            self.lp.ar_logits = logits   # entries are computed at ar_token, for the rows that record
        self._timed(t0)

    def drain(self) -> None:
        """Wait for a mask still being computed ahead (the AR loop may end before using it)."""
        self._ahead.drain()

    def ar_token(self, tokens: torch.Tensor, active: torch.Tensor) -> None:
        t0 = time.perf_counter()
        rows = self._ar_rows(active)
        free = [b for b, r in enumerate(self.rows) if r.walker is None and r.lp_top is not None]
        toks = tokens.tolist() if rows or free else []
        if free:   # free-text rows that record: one entry per step (None once the row has finished)
            act = active.tolist()
            for b in free:
                if act[b]:
                    self.lp.record_ar(self.rows[b], b, toks[b])
                else:
                    self.rows[b].lp.append(None)
        for b in rows:
            if self.rows[b].lp_top is not None:
                self.lp.record_ar(self.rows[b], b, toks[b])
            self.rows[b].walker.commit([toks[b]])
        nxt = tuple(b for b in rows if toks[b] not in self.rows[b].walker.stop_token_ids)
        if nxt:
            self._ahead.submit(nxt, self._ar_masks)
        self._timed(t0)
