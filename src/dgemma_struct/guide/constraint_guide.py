"""``ConstraintGuide``: the step hook that makes a canvas obey a constraint.

Per row it keeps a :class:`~dgemma_struct.guide.rows.RowState` around a
:class:`~dgemma_struct.constraints.CanvasWalker` whose state is exact after the frozen prefix.
At every denoising step:

1. **Masks.** The draft (argmax canvas) is walked from the frontier; every position up to and
   including the first violation gets its exact allowed-token mask.
2. **Commit rule.** A position freezes when the sampler accepts it and every position before it
   is frozen or accepted-and-valid; frozen tokens are consumed by the matcher, never renoised.
3. **Progress rule** (``progress=True``): the frontier is accepted each step, sampled from its
   exact mask, so the entropy-bound sampler cannot stall it by accepting tail positions first.
4. **Forced tokens.** When the grammar forces a continuation (keys, braces, enum tails, EOS when
   it is the only option) those tokens are written and frozen with no forward pass.
5. **Termination.** After EOS the rest of the canvas is pad; when a canvas stops with unfrozen
   positions, they are filled by a masked greedy walk over the last logits (no extra forward).
6. **Exclusion.** A repair row carries the values validation rejected before
   (:mod:`dgemma_struct.guide.exclusion`): they are taken out of its masks and never committed.
7. **Budget.** A row never commits more than its token budget (stop token included); with
   ``close_on_budget`` it follows a closing plan (:mod:`dgemma_struct.guide.budget`) once the tokens
   left approach the plan's length, so it ends in time instead of running out.

When the run is over, :meth:`ConstraintGuide.outcome` tells what each row produced.

Example::

    guide = ConstraintGuide([constraint.canvas_walker()], pad_token_id=0)
    runtime.generate(prompt, hook=guide)
    guide.outcome(0).complete
"""
from __future__ import annotations

import time
from typing import Any, Callable, Generator, Sequence

import numpy as np
import torch

from dgemma_struct.guide.budget import cap_run, free_room, steer_to_close
from dgemma_struct.constraints import CanvasWalker
from dgemma_struct.constraints.closing import greedy_fill_reads, read_together
from dgemma_struct.engine.hooks import StepView
from dgemma_struct.kernels import BitmaskStaging, apply_token_bitmask_
from dgemma_struct.engine.token_logprobs import GuideLogprobs
from dgemma_struct.guide.lookahead import ARMasking, MaskLookahead
from dgemma_struct.options import check_deadline
from dgemma_struct.guide.exclusion import ExcludedAR, Exclusion
from dgemma_struct.guide.rows import CanvasWrites, RowOutcome, RowState

__all__ = ["ConstraintGuide"]


class ConstraintGuide(ExcludedAR, ARMasking):
    """Constrains each batch row with its own walker (``None`` = unconstrained row).

    ``budgets``: per row, the most tokens it may commit, its stop token included (the canvas
    holds whole blocks, so without a cap a row could commit past ``max_new_tokens``);
    ``close_on_budget`` then closes rows in time (``closing_window``: the margin, default 2).
    ``row_stop[b]()`` True drops row b now (its caller timed out or went away): it ends with EOS
    at once so a batch is not held up by it. ``deadline``: a ``time.monotonic()`` value after
    which the run is abandoned with :class:`~dgemma_struct.errors.GenerationTimeout`.
    ``logprobs``: ``k`` records each committed token's logprob and its ``k`` top alternatives
    (:mod:`dgemma_struct.engine.token_logprobs`; ``ar_temperature``: the AR loop's temperature).
    ``exclusions[b]``: row b's :class:`~dgemma_struct.guide.exclusion.Exclusion` (or None)."""

    def __init__(self, walkers: Sequence[CanvasWalker | None], *, pad_token_id: int, progress: bool = True,
                 force_tokens: bool = True, renoise_invalid: bool = False, canonical_tokens: bool = True,
                 stall_steps: int = 8,
                 deadline: float | None = None, budgets: Sequence[int] | None = None,
                 close_on_budget: bool = False, closing_window: int | None = None,
                 row_stop: Sequence[Callable[[], bool] | None] | None = None, logprobs: int | None = None,
                 ar_temperature: float | None = None, exclusions: Sequence[Exclusion | None] | None = None):
        # ``rows``: the batch's rows in batch order (rows leave and join a running batch:
        # :meth:`keep_rows`, :meth:`join`); ``all_rows``: every row by id, as ``outcome`` counts them
        self.rows = [RowState(w, start=len(w.frozen_tokens) if w is not None else 0,
                              budget=budgets[b] if budgets is not None else None,
                              stop=row_stop[b] if row_stop is not None else None, id=b, lp_top=logprobs,
                              exclusion=exclusions[b] if exclusions is not None else None)
                     for b, w in enumerate(walkers)]
        self.all_rows = list(self.rows)
        self.budgeted = budgets is not None
        self.close_on_budget = close_on_budget and budgets is not None
        self.canonical_tokens = canonical_tokens
        self.closing_window = closing_window
        self.pad = pad_token_id
        self.progress = progress
        self.force_tokens = force_tokens
        self.renoise_invalid = renoise_invalid
        self.stall_steps = stall_steps
        self.deadline = deadline
        self.mask_s = 0.0                            # time the loop spent in this guide
        self._canvas: tuple[int, int] | None = None  # (canvas index, canvas length); None in AR mode
        self._ahead = MaskLookahead()
        self._w = CanvasWrites()        # the step's freezes and done rows, decided on the host
        self._stage = BitmaskStaging()  # reused (pinned on CUDA) bitmask buffers
        self.lp = GuideLogprobs(ar_temperature)     # rows with ``lp_top`` record into their own list

    @property
    def walkers(self) -> list[CanvasWalker | None]:
        """Every row's walker, by row id (rows that left the batch included)."""
        return [r.walker for r in self.all_rows]

    def outcome(self, row: int) -> RowOutcome:
        """What ``row`` (its index among the walkers given, then the rows joined) produced (call
        after the run, and after :meth:`drain`)."""
        r = self.all_rows[row]
        gen = list(r.walker.frozen_tokens) if r.walker is not None else []
        stops = r.walker.stop_token_ids if r.walker is not None else ()
        return RowOutcome(tokens=[t for t in gen if t not in stops], complete=bool(gen) and gen[-1] in stops,
                          dead_end=r.dead_end, forced=r.forced, closing=r.closing, cut=r.cut,
                          logprobs=GuideLogprobs.kept(r, stops) if r.lp_top is not None else None)

    def guided_rows(self) -> list[bool]:
        """Per batch row, whether this guide commits it (the loop's ``guided_entropy_bound`` applies)."""
        return [r.walker is not None for r in self.rows]

    # ------------------------------------------------------------------ a running batch
    def keep_rows(self, positions: Sequence[int]) -> None:
        """The batch keeps only the rows at ``positions`` (in this order): the others left it."""
        self._ahead.drain()   # an AR mask computed ahead was for the old positions
        self.rows = [self.rows[b] for b in positions]

    def join(self, rows: Sequence[RowState], canvas_index: int) -> None:
        """Rows from other guides (:meth:`RowState` objects, shared: their own guide's ``outcome``
        keeps working) join the batch before canvas ``canvas_index``; they count their canvases from
        there. A row that records logprobs goes on recording into its own list."""
        self._ahead.drain()
        for r in rows:
            r.canvas0 = canvas_index
            self.rows.append(r)
            self.all_rows.append(r)

    def _canvas_of(self, r: RowState) -> tuple[int, int] | None:
        """``(the row's own canvas index, canvas length)``; ``None`` in AR mode."""
        return None if self._canvas is None else (self._canvas[0] - r.canvas0, self._canvas[1])

    # ------------------------------------------------------------------ row helpers
    def _pad_rest(self, view: StepView, b: int, *, done: bool = True) -> None:
        """The rest of row ``b``'s canvas is pad, frozen."""
        r, L = self.rows[b], view.frozen.shape[1]
        if r.n_frozen < L:
            self._w.freeze(b, r.n_frozen, [self.pad] * (L - r.n_frozen))
        r.n_frozen = L
        if done:
            self._w.finish(b)

    def _freeze(self, view: StepView, b: int, tokens: list[int], logits: torch.Tensor | None = None) -> None:
        """Commit ``tokens`` at the frontier of row ``b`` and freeze them; after EOS, pad. ``logits``:
        the step's rows at their positions (for logprobs; ``None``: forced tokens)."""
        r = self.rows[b]
        w, f, L = r.walker, r.n_frozen, view.frozen.shape[1]
        tokens = tokens[: L - f]
        if r.exclusion is not None:  # every commit path (sampled, forced, fill, plan) stops before a banned value
            tokens = tokens[:r.exclusion.admissible(w.frozen_tokens, tokens)]
        if self.budgeted:  # at most budget - 1 tokens, then only a stop token
            room = max(0, r.budget - 1 - r.committed)
            keep = tokens[:room]
            if len(tokens) > room and tokens[room] in w.stop_token_ids:
                keep.append(tokens[room])
            if not keep and tokens:  # budget spent without a stop token: the row is over (incomplete)
                self._pad_rest(view, b)
                return
            tokens = keep
        if not tokens:
            return
        if r.lp_top is not None:
            GuideLogprobs.record(r, w, tokens, logits)
        w.commit(tokens)
        self._w.freeze(b, f, list(tokens))
        r.n_frozen = f + len(tokens)
        if w.frozen_tokens and w.frozen_tokens[-1] in w.stop_token_ids:
            self._pad_rest(view, b, done=False)
        if r.n_frozen >= L:
            self._w.finish(b)

    def _flush(self, view: StepView) -> None:
        """The host's decisions go to the step's tensors (one scatter), and the host hints with them."""
        self._w.flush(view.frozen, view.frozen_tokens, view.done)
        view.frozen_upto = [r.n_frozen for r in self.rows]
        view.done_rows = list(self._w.done)

    @staticmethod
    def _active(view: StepView) -> list[bool]:
        if view.active_rows is not None:
            return view.active_rows
        return view.active.tolist() if view.active is not None else [True] * view.frozen.shape[0]

    def _apply_forced(self, view: StepView, b: int) -> None:
        if not self.force_tokens:
            return
        r, L = self.rows[b], view.frozen.shape[1]
        while r.n_frozen < L:
            forced = r.walker.forced_tokens(L - r.n_frozen)
            if not forced:
                return
            before = len(r.walker.frozen_tokens)
            self._freeze(view, b, forced)
            r.forced += len(r.walker.frozen_tokens) - before  # the budget may cut them short
            if len(r.walker.frozen_tokens) == before:
                return

    def _check_cut(self, active) -> list[int]:
        """Rows newly cut by their ``row_stop``."""
        new = []
        for b, r in enumerate(self.rows):
            if r.stop is not None and not r.cut and active[b] and r.stop():
                r.cut = True
                new.append(b)
        return new

    def _end_row(self, view: StepView, b: int) -> None:
        """End row ``b`` in this canvas: pad from the frontier, EOS written there on commit (the
        walker never sees it)."""
        r = self.rows[b]
        r.cut_at = r.n_frozen
        self._pad_rest(view, b)

    def _end_dead(self, view: StepView, b: int) -> None:
        """Row ``b``'s frontier has an empty allowed set (an engine dead end): no token can ever be
        committed there, so the row ends now and is reported as a dead end (repaired, or a typed
        error) instead of sampling from an all ``-inf`` distribution."""
        r = self.rows[b]
        r.dead_end = r.no_allowed = True
        self._end_row(view, b)

    def _cut_canvas(self, view: StepView) -> None:
        for b, r in enumerate(self.rows):
            if r.cut and r.n_frozen < view.frozen.shape[1]:
                self._end_row(view, b)

    def _stall(self, r: RowState) -> None:
        r.stalled += 1
        if r.stalled >= self.stall_steps:
            r.dead_end = True

    def _timed(self, t0: float) -> None:
        self.mask_s += time.perf_counter() - t0

    def _finish_row(self, view: StepView, b: int, active: bool, cuts: list) -> Generator[Any, Any, None]:
        """Ends row ``b``'s canvas: its closing plan once the budget says so, else a masked greedy fill
        (a generator of the fill's host reads, see :func:`~dgemma_struct.constraints.closing.read_together`),
        then pad; a cut row's EOS goes to ``cuts``."""
        r, L = self.rows[b], view.frozen.shape[1]
        w, f = r.walker, r.n_frozen
        while f < L and active and view.logits.numel() and not w.is_stopped():
            room, plan = (free_room(r, self._canvas_of(r), self.closing_window) if self.close_on_budget
                          else (L, None))
            close = plan + [w.stop_token_ids[0]] if room == 0 and plan is not None else None
            if close is not None and w.walk(close).n_valid < len(close):
                # never commit what the masks refuse (commit() checks the matcher only): fill instead,
                # and plan afresh next time
                close, r.closing_est = None, None
            if close is not None:  # close now: the plan, then the stop token
                self._freeze(view, b, close, view.logits[b, f:])
                r.closing = True
            else:  # masked greedy fill, up to the closing window
                fill = yield from greedy_fill_reads(w, view.logits[b, f:], L - f if room == 0 else min(room, L - f))
                if fill:
                    self._freeze(view, b, fill, view.logits[b, f:])
            if r.n_frozen == f:  # no progress: nothing allowed fits here
                break
            f = r.n_frozen
        if f < L and active:  # nothing allowed any more: pad
            self._w.freeze(b, f, [self.pad] * (L - f))
        if r.cut_at is not None:  # ends the row in the loop (the walker never sees this EOS)
            cuts.append((b, r.cut_at, w.stop_token_ids[0]))
            r.cut_at = None

    # ------------------------------------------------------------------ diffusion hook
    def start_canvas(self, view: StepView) -> None:
        t0 = time.perf_counter()
        B, L = view.frozen.shape
        self._w.reset(B)
        for r in self.rows:
            r.n_frozen = 0
        self._canvas = (view.canvas_index, L)
        act = self._active(view)
        self._check_cut(act)
        for b, r in enumerate(self.rows):
            if r.walker is not None and act[b] and not r.ended:
                self._apply_forced(view, b)
        self._cut_canvas(view)
        self._flush(view)
        self._timed(t0)

    def mask_logits(self, view: StepView) -> None:
        check_deadline(self.deadline)
        t0 = time.perf_counter()
        act = self._active(view)
        if self._check_cut(act):
            self._cut_canvas(view)
        logits, done = view.logits, self._w.done
        B, L, V = logits.shape
        live = [b for b, r in enumerate(self.rows)
                if r.walker is not None and r.n_frozen < L and not done[b] and act[b]]
        # the drafts of all rows in one host read
        drafts = (view.draft if view.draft is not None else logits.argmax(dim=-1)).tolist() if live else []
        index, masks, spans, sample_at = [], [], [], []
        for b in live:
            r = self.rows[b]
            f = r.n_frozen
            res = r.walker.walk(drafts[b][f:])
            n = min(res.n_valid + 1, L - f)
            bm = res.bitmasks[:n]
            if r.exclusion is not None:
                bm, n = r.exclusion.masks(r.walker.frozen_tokens, drafts[b][f:f + n], bm)
            empty = ~bm.any(axis=1)
            if empty[0]:  # nothing allowed at the frontier, ever: a dead end, not NaN
                self._end_dead(view, b)
                continue
            if empty.any():  # a draft prefix that leads nowhere: mask before it, the commit rule checks the rest
                bm = bm[:int(np.argmax(empty))]
            index.extend(range(b * L + f, b * L + f + len(bm)))
            masks.append(bm)
            spans.append((b, f, f + len(bm)))
            sample_at.append((b, f))
        if index:  # one staged copy of every row's masks, applied in place
            bm, idx = self._stage.stage(masks, index, logits.device)
            apply_token_bitmask_(logits.view(B * L, V), bm, indices=idx)
        if self.close_on_budget:
            for b in live:
                r = self.rows[b]
                if r.n_frozen >= L or done[b] or r.walker.is_stopped():
                    continue
                if steer_to_close(r, logits[b, r.n_frozen:], self._canvas_of(r), self.closing_window):
                    spans.append((b, r.n_frozen, L))
        view.touched_spans = spans
        view.sample_at_pos = sample_at if self.progress else None
        self._flush(view)
        self._timed(t0)

    def accept(self, view: StepView) -> None:
        t0 = time.perf_counter()
        L = view.frozen.shape[1]
        act = self._active(view)
        acc_rows = view.accept_rows if view.accept_rows is not None else view.accept.tolist()
        samples = None
        for b, r in enumerate(self.rows):
            f = r.n_frozen
            if r.walker is None or f >= L or self._w.done[b] or not act[b]:
                continue
            # the run of accepted positions from the frontier (the frontier itself under the progress rule)
            acc = acc_rows[b][f:]
            if self.progress:
                acc[0] = True
            k = next((i for i, a in enumerate(acc) if not a), len(acc))
            if k == 0:
                self._stall(r)
                continue
            if samples is None:  # every row's sample in one host read
                samples = view.sample.tolist()
            run = samples[b][f:f + k]
            if self.close_on_budget:
                run = cap_run(r, run, self._canvas_of(r), self.closing_window)
            res = r.walker.walk(run)
            if res.n_valid == 0:
                self._stall(r)
                continue
            self._freeze(view, b, run[:res.n_valid], view.logits[b, f:])
            if r.n_frozen == f and not self._w.done[b]:   # the exclusion refused the run's first token
                self._stall(r)
                continue
            r.stalled = 0
            self._apply_forced(view, b)
            if self.renoise_invalid:
                view.accept[b, r.n_frozen:] = False
        self._flush(view)
        self._timed(t0)

    def finish_canvas(self, view: StepView, committed: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        B, L = view.frozen.shape
        act = self._active(view)
        guided, cuts, fills = [False] * B, [], []
        for b, r in enumerate(self.rows):
            if r.walker is None:
                if r.lp_top is not None:   # a free-text row that records: every position, as committed
                    self.lp.record_free(r, view.logits[b] if view.logits.numel() and act[b] else None,
                                        committed[b], L)
                continue
            guided[b] = True
            fills.append(self._finish_row(view, b, act[b], cuts))
        read_together(fills)   # the rows' greedy fills side by side: their host reads batched
        self._flush(view)
        rows = torch.tensor(guided, dtype=torch.bool).to(view.frozen.device, non_blocking=True)
        out = torch.where(view.frozen & rows[:, None], view.frozen_tokens, committed)
        if cuts:
            ix = torch.tensor(cuts, dtype=torch.long).to(out.device, non_blocking=True)
            out.index_put_((ix[:, 0], ix[:, 1]), ix[:, 2].to(out.dtype))
        self._timed(t0)
        return out
