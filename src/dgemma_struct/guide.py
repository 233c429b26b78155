"""``ConstraintGuide``: the step hook that makes a canvas obey a constraint.

Per row it keeps a :class:`~dgemma_struct.constraints.CanvasWalker` whose state is exact after the
frozen prefix. At every denoising step:

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
6. **Budget.** A row never commits more than its token budget (stop token included); with
   ``close_on_budget`` it follows a closing plan (close strings / brackets, EOS) once the tokens
   left approach the plan's length, so it ends in time instead of running out.

Example::

    guide = ConstraintGuide([constraint.canvas_walker()], pad_token_id=0)
    runtime.generate(prompt, hook=guide)
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np
import torch

from dgemma_struct.constraints import CanvasWalker
from dgemma_struct.errors import GenerationTimeout
from dgemma_struct.hooks import StepView
from dgemma_struct.kernels import apply_token_bitmask_


_CLOSER_CACHE: dict[str, tuple] = {}


def closer_ids(walker: CanvasWalker) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
    """The candidates of budget-aware closing, cached per tokenizer: tokens that start with ``"``
    and hold only ``"``/``]``/``}``; tokens of only ``]``/``}`` (both longest first); and the
    single-byte tokens with their bytes (see :meth:`CanvasWalker.closing_plan`)."""
    info = walker.constraint.tokenizer_info
    hit = _CLOSER_CACHE.get(info.key)
    if hit is None:
        quote, bracket, single = {}, {}, {}
        for t in range(info.vocab_size):
            if t in info.special_token_ids:
                continue
            bs = info.lltok.decode_bytes([t])
            if len(bs) == 1:
                single.setdefault(bs[0], t)
            if bs and all(ch in b'"]}' for ch in bs):
                (quote if bs[:1] == b'"' else bracket if b'"' not in bs else {})[t] = len(bs)
        order = sorted(single)
        hit = _CLOSER_CACHE[info.key] = (
            *(np.asarray(sorted(d, key=lambda t: -d[t]), dtype=np.int64) for d in (quote, bracket)),
            np.asarray([single[b] for b in order], dtype=np.int64), bytes(order))
    extra = tuple(getattr(walker.constraint, "closing_token_ids", ()))
    if extra:  # a constraint's own closers (control tokens that end its strings / blocks) come first
        quote, bracket, byte_ids, byte_values = hit
        hit = (quote, np.concatenate([np.asarray(extra, dtype=np.int64), bracket]), byte_ids, byte_values)
    return hit


class ConstraintGuide:
    """Constrains each batch row with its own walker (``None`` = unconstrained row)."""

    def __init__(self, walkers: Sequence[CanvasWalker | None], *, pad_token_id: int, progress: bool = True,
                 force_tokens: bool = True, renoise_invalid: bool = False, stall_steps: int = 8,
                 deadline: float | None = None, budgets: Sequence[int] | None = None,
                 close_on_budget: bool = False, closing_window: int | None = None,
                 row_stop: Sequence[Callable[[], bool] | None] | None = None):
        self.walkers = list(walkers)
        # ``row_stop[b]()`` True = drop row b now (its caller timed out or went away): the row ends
        # with EOS at once so a batch is not held up by it; ``cut[b]`` records it (not a value!).
        self.row_stop = list(row_stop) if row_stop is not None else None
        self.cut = [False] * len(self.walkers)
        self._cut_at: dict[int, int] = {}  # cut row -> canvas position of its EOS
        # ``budgets``: per row, the most tokens it may commit, its stop token included (the canvas
        # holds whole blocks, so without a cap a row could commit past max_new_tokens).
        # Budget-aware closing: once a row's remaining tokens are no more than the length of a
        # closing plan (CanvasWalker.closing_plan: close strings, arrays and objects, EOS) plus
        # ``closing_window`` tokens of margin (default 2), the plan's tokens get a large logit
        # bonus, position by position from the frontier. The bonus is added to masked logits, so it
        # never unmasks anything: the output stays exact, it only ends sooner.
        self.budgets = list(budgets) if budgets is not None else None
        self.close_on_budget = close_on_budget and budgets is not None
        self.closing_window = closing_window
        self.closing = [False] * len(self.walkers)  # the row entered its closing window
        self._closing_est: dict[int, tuple] = {}     # row -> (frozen length, closing plan or None)
        self._canvas: tuple[int, int] | None = None  # (canvas index, canvas length); None in AR mode
        self._ar_pending: tuple | None = None        # (rows, future) of the AR mask computed ahead
        self.pad = pad_token_id
        self.progress = progress
        self.force_tokens = force_tokens
        self.renoise_invalid = renoise_invalid
        self.stall_steps = stall_steps
        self.deadline = deadline     # time.monotonic() value after which the run is abandoned
        B = len(self.walkers)
        self.start = [len(w.frozen_tokens) if w is not None else 0 for w in self.walkers]
        self.forced = [0] * B        # tokens written without a forward pass
        self.stalled = [0] * B       # consecutive steps without progress
        self.dead_end = [False] * B  # the walk made no progress for ``stall_steps`` steps, or nothing is allowed
        self.no_allowed = [False] * B  # the grammar allows no token at the frontier: the row was ended
        self.mask_s = 0.0
        self._n_frozen = [0] * B     # frozen positions in the current canvas (a prefix)
        self._masked_rows: list[int] = []

    # ------------------------------------------------------------------ helpers
    def generated(self, row: int) -> list[int]:
        """Tokens this guide committed for ``row`` (EOS included when reached)."""
        w = self.walkers[row]
        return [] if w is None else w.frozen_tokens[self.start[row]:]

    def _freeze(self, view: StepView, b: int, tokens: list[int]) -> None:
        """Commit ``tokens`` at the frontier of row ``b`` and freeze them; after EOS, pad."""
        w = self.walkers[b]
        f = self._n_frozen[b]
        L = view.frozen.shape[1]
        tokens = tokens[: L - f]
        if self.budgets is not None:  # at most budget - 1 tokens, then only a stop token
            room = max(0, self.budgets[b] - 1 - (len(w.frozen_tokens) - self.start[b]))
            keep = tokens[:room]
            if len(tokens) > room and tokens[room] in w.stop_token_ids:
                keep.append(tokens[room])
            if not keep and tokens:  # budget spent without a stop token: the row is over (incomplete)
                view.frozen[b, f:] = True
                view.frozen_tokens[b, f:] = self.pad
                self._n_frozen[b] = L
                view.done[b] = True
                return
            tokens = keep
        if not tokens:
            return
        w.commit(tokens)
        view.frozen[b, f:f + len(tokens)] = True
        view.frozen_tokens[b, f:f + len(tokens)] = torch.tensor(tokens, dtype=view.frozen_tokens.dtype)
        f += len(tokens)
        self._n_frozen[b] = f
        if w.frozen_tokens and w.frozen_tokens[-1] in w.stop_token_ids:
            view.frozen[b, f:] = True
            view.frozen_tokens[b, f:] = self.pad
            self._n_frozen[b] = L
        if self._n_frozen[b] >= L:
            view.done[b] = True

    def _apply_forced(self, view: StepView, b: int) -> None:
        if not self.force_tokens:
            return
        w = self.walkers[b]
        L = view.frozen.shape[1]
        while self._n_frozen[b] < L:
            forced = w.forced_tokens(L - self._n_frozen[b])
            if not forced:
                return
            before = len(w.frozen_tokens)
            self._freeze(view, b, forced)
            self.forced[b] += len(w.frozen_tokens) - before  # the budget may cut them short
            if len(w.frozen_tokens) == before:
                return

    def _check_cut(self, active) -> list[int]:
        """Rows newly cut by ``row_stop``."""
        if self.row_stop is None:
            return []
        new = []
        for b, stop in enumerate(self.row_stop):
            if stop is not None and not self.cut[b] and bool(active[b]) and stop():
                self.cut[b] = True
                new.append(b)
        return new

    def _end_dead(self, view: StepView, b: int) -> None:
        """Row ``b``'s frontier has an empty allowed set (an engine dead end): no token can ever
        be committed there, so the row ends now (pad, then EOS on commit; the walker never sees it)
        and is reported as a dead end (repaired, or a typed error) instead of sampling from an
        all ``-inf`` distribution."""
        f = self._n_frozen[b]
        L = view.frozen.shape[1]
        self.dead_end[b] = self.no_allowed[b] = True
        self._cut_at[b] = f
        view.frozen[b, f:] = True
        view.frozen_tokens[b, f:] = self.pad
        self._n_frozen[b] = L
        view.done[b] = True

    def _cut_canvas(self, view: StepView) -> None:
        """Cut rows: the rest of this canvas is pad, the row is done (EOS is written on commit)."""
        for b in range(len(self.walkers)):
            if self.cut[b] and self._n_frozen[b] < view.frozen.shape[1]:
                f = self._n_frozen[b]
                self._cut_at[b] = f
                view.frozen[b, f:] = True
                view.frozen_tokens[b, f:] = self.pad
                self._n_frozen[b] = view.frozen.shape[1]
                view.done[b] = True

    # ------------------------------------------------------------------ hook
    def start_canvas(self, view: StepView) -> None:
        t0 = time.perf_counter()
        B, L = view.frozen.shape
        self._n_frozen = [0] * B
        self._canvas = (view.canvas_index, L)
        self._check_cut(view.active)
        for b, w in enumerate(self.walkers):
            if w is None or not bool(view.active[b]) or self.cut[b] or self.no_allowed[b]:
                continue
            self._apply_forced(view, b)
        self._cut_canvas(view)
        self.mask_s += time.perf_counter() - t0

    def mask_logits(self, view: StepView) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise GenerationTimeout("generation exceeded its timeout")
        t0 = time.perf_counter()
        if self._check_cut(view.active):
            self._cut_canvas(view)
        logits = view.logits
        B, L, V = logits.shape
        active = view.active
        rows, masks = [], []
        live = [b for b, w in enumerate(self.walkers)
                if w is not None and self._n_frozen[b] < L and not bool(view.done[b])
                and (active is None or bool(active[b]))]
        if live and self.progress:
            view.sample_at = torch.zeros((B, L), dtype=torch.bool, device=logits.device)
        draft = getattr(view, "draft", None)
        touched = torch.zeros((B, L), dtype=torch.bool, device=logits.device) if draft is not None else None
        for b in live:
            w = self.walkers[b]
            f = self._n_frozen[b]
            res = w.walk((draft[b, f:] if draft is not None else logits[b, f:].argmax(dim=-1)).tolist())
            n = min(res.n_valid + 1, L - f)
            bm = res.bitmasks[:n]
            empty = ~bm.any(axis=1)
            if empty[0]:  # nothing allowed at the frontier, ever: a dead end, not NaN
                self._end_dead(view, b)
                continue
            if empty.any():  # a draft prefix that leads nowhere: mask before it, the commit rule checks the rest
                n = int(np.argmax(empty))
                bm = bm[:n]
            rows.extend(b * L + f + i for i in range(n))
            masks.append(bm)
            if view.sample_at is not None:
                view.sample_at[b, f] = True
        if rows:
            index = torch.tensor(rows, dtype=torch.long, device=logits.device)
            apply_token_bitmask_(logits.view(B * L, V), np.concatenate(masks, axis=0), indices=index)
            if touched is not None:
                touched.view(-1)[index] = True
        if self.close_on_budget:
            for b in live:
                w = self.walkers[b]
                f = self._n_frozen[b]
                if f >= L or bool(view.done[b]) or w.is_stopped():
                    continue
                if self._steer_to_close(b, logits[b, f:]) and touched is not None:
                    touched[b, f:] = True
        view.touched = touched
        self.mask_s += time.perf_counter() - t0

    def _free_room(self, b: int) -> tuple[int, list[int] | None]:
        """(tokens row ``b`` may still commit freely, its closing plan). Room 0 means: close now,
        following the plan. The room is what is left before the stop token minus the plan's
        length and a margin (so forced keys and brackets still fit)."""
        w = self.walkers[b]
        remaining = self.budgets[b] - 1 - (len(w.frozen_tokens) - self.start[b])  # before the stop token
        if self._canvas is not None:
            # positions, too: padding inside an output (an empty fill) uses canvas positions
            idx, L = self._canvas
            positions_left = -(-self.budgets[b] // L) * L - (idx * L + self._n_frozen[b]) - 1
            remaining = min(remaining, positions_left)
        margin = self.closing_window if self.closing_window is not None else 2
        if remaining > 96:  # far from the end: skip the estimate
            return remaining, []
        key = len(w.frozen_tokens)
        if self._closing_est.get(b, (None,))[0] != key:
            quote, bracket, byte_ids, byte_values = closer_ids(w)
            self._closing_est[b] = (key, w.closing_plan(quote, bracket, remaining, byte_ids, byte_values))
        plan = self._closing_est[b][1]
        if plan is None:  # no plan fits
            return 0, None
        return max(0, remaining - len(plan) - margin), plan

    def _steer_to_close(self, b: int, logits: torch.Tensor) -> bool:
        """When row ``b`` must close now, bias ``logits`` (``[n, V]`` rows from its frontier)
        towards its closing plan, then a stop token (only a stop token when no plan fits)."""
        room, plan = self._free_room(b)
        if room:
            return False
        plan = plan or []
        self._bias_plan(logits, plan, self.walkers[b].stop_token_ids)
        self.closing[b] = self.closing[b] or bool(plan) or self.walkers[b].is_accepting()
        return True

    def _cap_run(self, b: int, tokens: list[int]) -> list[int]:
        """Commits in one step stop at the start of the closing window (one canvas step can accept
        many positions at once, and the plan is only known from the frontier)."""
        if not self.close_on_budget:
            return tokens
        room, _ = self._free_room(b)
        return tokens if room == 0 else tokens[:room]

    def _bias_plan(self, logits: torch.Tensor, plan: list[int], stop_ids: Sequence[int]) -> None:
        """``logits``: ``[n, V]`` rows from the frontier; prefer ``plan[i]`` at row i, then a stop token."""
        n = logits.shape[0]
        for i, t in enumerate(plan[:n]):
            logits[i, t] += 1e4
        if len(plan) < n:
            logits[len(plan), list(stop_ids)] += 1e4

    def accept(self, view: StepView) -> None:
        t0 = time.perf_counter()
        L = view.frozen.shape[1]
        sample, accept = view.sample, view.accept
        for b, w in enumerate(self.walkers):
            f = self._n_frozen[b]
            if w is None or f >= L or bool(view.done[b]) or not bool(view.active[b]):
                continue
            # the run of accepted positions from the frontier (the frontier itself under the progress rule)
            acc = accept[b, f:].tolist()
            if self.progress:
                acc[0] = True
            k = next((i for i, a in enumerate(acc) if not a), len(acc))
            if k == 0:
                self._stall(b)
                continue
            run = self._cap_run(b, sample[b, f:f + k].tolist())
            res = w.walk(run)
            if res.n_valid == 0:
                self._stall(b)
                continue
            self.stalled[b] = 0
            self._freeze(view, b, run[:res.n_valid])
            self._apply_forced(view, b)
            if self.renoise_invalid:
                view.accept[b, self._n_frozen[b]:] = False
        self.mask_s += time.perf_counter() - t0

    def _stall(self, b: int) -> None:
        self.stalled[b] += 1
        if self.stalled[b] >= self.stall_steps:
            self.dead_end[b] = True

    def finish_canvas(self, view: StepView, committed: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        L = view.frozen.shape[1]
        out = committed.clone()
        for b, w in enumerate(self.walkers):
            if w is None:
                continue
            f = self._n_frozen[b]
            while f < L and bool(view.active[b]) and view.logits.numel() and not w.is_stopped():
                room, plan = self._free_room(b) if self.close_on_budget else (L, None)
                if room == 0 and plan is not None:  # close now: the plan, then the stop token
                    self._freeze(view, b, plan + [w.stop_token_ids[0]])
                    self.closing[b] = True
                else:  # masked greedy fill, up to the closing window
                    fill = w.greedy_fill(view.logits[b, f:].float(), L - f)
                    if fill:
                        self._freeze(view, b, fill if room == 0 else fill[:room])
                if self._n_frozen[b] == f:  # no progress: nothing allowed fits here
                    break
                f = self._n_frozen[b]
            if f < L and bool(view.active[b]):  # nothing allowed any more: pad
                view.frozen[b, f:] = True
                view.frozen_tokens[b, f:] = self.pad
            out[b] = torch.where(view.frozen[b], view.frozen_tokens[b], out[b])
            if b in self._cut_at:  # ends the row in the loop (the walker never sees this EOS)
                out[b, self._cut_at.pop(b)] = w.stop_token_ids[0]
        self.mask_s += time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------ AR mode
    # The mask for token t depends only on tokens < t, so it is computed on a worker thread while
    # the forward pass for token t runs (llguidance and torch both release the GIL); ``mask_s``
    # counts only the time the loop itself spends (waiting included).
    def _ar_masks(self, rows: tuple[int, ...]) -> np.ndarray | None:
        if not rows:
            return None
        masks = np.concatenate([self.walkers[b].mask()[None, :] for b in rows], axis=0)
        if self.close_on_budget:
            for b in rows:
                self._free_room(b)  # warms the closing-plan cache off the critical path
        return masks

    def mask_ar_logits(self, logits: torch.Tensor, active: torch.Tensor) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.drain()
            raise GenerationTimeout("generation exceeded its timeout")
        t0 = time.perf_counter()
        self._check_cut(active)
        for b in range(len(self.walkers)):
            if (self.cut[b] or self.no_allowed[b]) and bool(active[b]) and self.walkers[b] is not None:
                eos = self.walkers[b].stop_token_ids[0]
                logits[b] = float("-inf")
                logits[b, eos] = 0.0
        rows = tuple(b for b, w in enumerate(self.walkers)
                     if w is not None and bool(active[b]) and not self.cut[b] and not self.no_allowed[b])
        pending, self._ar_pending = self._ar_pending, None
        if pending is not None and pending[0] == rows:
            masks = pending[1].result()
        else:
            if pending is not None:
                pending[1].result()  # never leave a worker running on the walkers
            masks = self._ar_masks(rows)
        if rows:
            empty = ~masks.any(axis=1)
            if empty.any():  # nothing allowed for these rows: end them (a dead end), never NaN
                for j in np.flatnonzero(empty):
                    b = rows[j]
                    self.dead_end[b] = self.no_allowed[b] = True
                    logits[b] = float("-inf")
                    logits[b, self.walkers[b].stop_token_ids[0]] = 0.0
                keep = np.flatnonzero(~empty)
                rows, masks = tuple(rows[j] for j in keep), masks[keep]
        if rows:
            apply_token_bitmask_(logits, masks, indices=torch.tensor(rows, dtype=torch.long, device=logits.device))
        if self.close_on_budget:
            for b in rows:
                self._steer_to_close(b, logits[b:b + 1])
        self.mask_s += time.perf_counter() - t0

    def drain(self) -> None:
        """Wait for a mask still being computed ahead (the AR loop may end before using it)."""
        pending, self._ar_pending = self._ar_pending, None
        if pending is not None:
            pending[1].result()

    def ar_token(self, tokens: torch.Tensor, active: torch.Tensor) -> None:
        t0 = time.perf_counter()
        for b, w in enumerate(self.walkers):
            if w is not None and bool(active[b]) and not self.cut[b] and not self.no_allowed[b]:
                w.commit([int(tokens[b])])
        nxt = tuple(b for b, w in enumerate(self.walkers) if w is not None and bool(active[b])
                    and not self.cut[b] and not self.no_allowed[b] and int(tokens[b]) not in w.stop_token_ids)
        if nxt:
            self._ar_pending = (nxt, _mask_pool().submit(self._ar_masks, nxt))
        self.mask_s += time.perf_counter() - t0


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _mask_pool() -> ThreadPoolExecutor:
    """The worker threads of AR mask look-ahead (a few, so concurrent sessions do not queue behind
    each other); rebuilt after a fork, whose child inherits no running threads."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=4, thread_name_prefix="dgemma-mask"))
    return _POOL[1]
