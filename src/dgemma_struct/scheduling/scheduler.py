"""Continuous batching: requests join a running diffusion batch between canvases and leave it the
moment they finish, so a batch is never held up by its slowest row and a new request never waits
for a whole batch to end.

A :class:`ContinuousScheduler` keeps running :class:`~dgemma_struct.engine.canvas.CanvasBatch` objects
(one per sampling setting, plus older ones still draining) and, at every :meth:`~ContinuousScheduler.step`:

1. **admits** waiting requests into the newest batch of their sampling setting when their prompt
   fits its length (left padding at most ``max_pad`` tokens, the whole output within the model's
   context); otherwise into a new batch, while the rows in all batches stay within ``max_rows``;
2. runs **one canvas** of every batch (rows that stopped denoising are left out of the forward);
3. **solves** the rows that left: validation, repair and AR fallback as
   :func:`~dgemma_struct.api.generate` does (:meth:`~dgemma_struct.repair.session.RepairSession.attempts`).
   A repair (and the AR fallback) is a new row from the kept prefix that joins at the next step,
   so repairs are batched too; a free-text row's tokens are capped at its ``max_new_tokens``.

Rows run in diffusion (:class:`~dgemma_struct.engine.canvas.CanvasBatch`) or AR
(:class:`~dgemma_struct.engine.autoregressive.ARBatch`, ``L`` tokens per step); ``mode="auto"`` lets a
:class:`~dgemma_struct.scheduling.mode_choice.ModeChooser` pick per new batch from measured throughput.

Each row draws from its own generator seeded with its request's seed, so its first attempt is the
same whatever shares its batch. A batch whose canvas fails as a whole hands its rows back as
:class:`BatchFailed` (the caller may rerun them alone, so only the culprit fails).

Example::

    sched = ContinuousScheduler(runtime, max_rows=32)
    sched.submit(RowRequest(prompt_ids=ids, max_new_tokens=64, seed=0, session=session))
    while not sched.idle:
        for req, result in sched.step():
            print(result)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from dgemma_struct.engine.autoregressive import ARBatch
from dgemma_struct.engine.canvas import CanvasBatch, FinishedRow
from dgemma_struct.engine.token_logprobs import kept_entries, named
from dgemma_struct.errors import GenerationTimeout
from dgemma_struct.options import GenerateOptions, check_deadline
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.scheduling.mode_choice import ModeChooser
from dgemma_struct.scheduling.requests import BatchFailed, RowRequest, RowStatus, status_of
from dgemma_struct.guide.rows import RowState

if TYPE_CHECKING:
    from dgemma_struct.runtime import DiffusionRuntime

__all__ = ["ContinuousScheduler"]


def _clock_of(canvas: CanvasBatch | ARBatch) -> Any:
    """The :class:`~dgemma_struct.engine.forward.Clock` of a diffusion batch's run or an AR batch."""
    run = getattr(canvas, "run", None)
    return run.clock if run is not None else getattr(canvas, "clock", None)


def _share_time(clock: Any, seen: tuple | None, rows: list[RowRequest]) -> tuple:
    """Each row's equal share of the model and constraint time its batch's ``clock`` gained since
    ``seen`` (the last ``(clock, model_s, hook_s)`` shared; a new clock starts from 0). The clock is
    read once per canvas (on CUDA one wait for its last event); returns the new ``seen``."""
    model0, hook0 = (seen[1], seen[2]) if seen is not None and seen[0] is clock else (0.0, 0.0)
    model, hook = clock.model_s, clock.hook_s
    if rows:
        dm, dh = (model - model0) / len(rows), (hook - hook0) / len(rows)
        for r in rows:
            r.model_s += max(0.0, dm)
            r.mask_s += max(0.0, dh)
    return clock, model, hook


#: the options a batch's :class:`ConstraintGuide` is built from (:meth:`ContinuousScheduler._new_batch`)
_FREE_KNOBS = GenerateOptions().guide_knobs()   # a free-text row's batch: the defaults (no rule applies to it)


@dataclass(eq=False)
class _Batch:
    key: tuple                         # what its rows share: (mode, temperature, top_p, the guide's knobs)
    mode: str                          # the mode it runs: "diffusion" or "ar"
    canvas: CanvasBatch | ARBatch
    guide: ConstraintGuide
    rows: dict[int, RowRequest] = field(default_factory=dict)
    seen: tuple | None = None          # (clock, model_s, hook_s) when its time was last shared


class ContinuousScheduler:
    """See the module docstring. ``max_rows``: rows in all running batches together;
    ``max_pad``: the most left padding a joining row may get (default: 4 canvases)."""

    def __init__(self, runtime: DiffusionRuntime, *, max_rows: int = 64, max_pad: int | None = None,
                 chooser: ModeChooser | None = None):
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        self.chooser = chooser if chooser is not None else ModeChooser()
        self.rt = runtime
        self.L = runtime.model.config.canvas_length
        self.max_rows = max_rows
        self.max_pad = 4 * self.L if max_pad is None else max_pad
        self.waiting: list[RowRequest] = []
        self.batches: list[_Batch] = []
        self.counters = {"admitted": 0, "batches_opened": 0, "canvases": 0, "largest_batch": 0, "finished": 0,
                         "cancelled": 0, "failed_batches": 0, "joined_running": 0, "repair_rows": 0,
                         "rows_diffusion": 0, "rows_ar": 0}

    # ------------------------------------------------------------------ state
    @property
    def running(self) -> int:
        """Rows in the running batches."""
        return sum(b.canvas.size for b in self.batches)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.batches

    def abandon(self) -> list[RowRequest]:
        """Every waiting and running request, removed (after an unexpected failure)."""
        reqs = self.waiting + [r for b in self.batches for r in b.rows.values()]
        self.waiting, self.batches = [], []
        for r in reqs:
            r.status = RowStatus.FAILED
        return reqs

    def submit(self, req: RowRequest) -> None:
        """Queue ``req``; it joins a batch at the next :meth:`step`."""
        self.waiting.append(req)

    # ------------------------------------------------------------------ 1. admission
    def _key(self, req: RowRequest) -> tuple:
        """What rows must share to share a batch: the mode and sampling, and the knobs the batch's
        guide is built with (a row never runs under another request's progress or closing rule)."""
        knobs = req.session.opts.guide_knobs() if req.session is not None else _FREE_KNOBS
        return (req.mode, req.temperature, req.top_p) + tuple(knobs.values())

    @staticmethod
    def _joins(b: _Batch, req: RowRequest, key: tuple) -> bool:
        """A free-text row (no constraint, so no guide rule applies to it) joins any batch of its
        mode and sampling; a constrained row only one built with its own guide knobs."""
        return b.key == key if req.session is not None else b.key[:3] == key[:3]

    def _fits(self, b: _Batch, req: RowRequest) -> bool:
        n, width = len(req.prompt_ids), b.canvas.width
        canvases = -(-req.max_new_tokens // self.L)
        return (b.canvas.fits(n) and width - n <= self.max_pad
                and max(width, n) + canvases * self.L <= self.rt.max_context)

    def _new_batch(self, req: RowRequest, load: int) -> _Batch:
        mode = self.chooser.pick(load) if req.mode == "auto" else req.mode
        knobs = req.session.opts.guide_knobs() if req.session is not None else _FREE_KNOBS
        guide = ConstraintGuide([], pad_token_id=self.rt.pad_token_id or 0, budgets=[], ar_temperature=req.temperature,
                                **knobs)
        if mode == "ar":
            batch: CanvasBatch | ARBatch = ARBatch(self.rt.model, eos_token_ids=self.rt.eos_token_ids,
                                                   pad_token_id=self.rt.pad_token_id, hook=guide,
                                                   temperature=req.temperature, top_p=req.top_p)
        else:
            batch = CanvasBatch(self.rt.model, settings=self.rt.settings, eos_token_ids=self.rt.eos_token_ids,
                                pad_token_id=self.rt.pad_token_id, hook=guide, temperature_scale=req.temperature,
                                top_p=req.top_p)
        b = _Batch(key=self._key(req), mode=mode, canvas=batch, guide=guide)
        self.batches.append(b)
        self.counters["batches_opened"] += 1
        return b

    def _row_state(self, req: RowRequest) -> RowState:
        if req.session is None:
            req.row = RowState(None, stop=req.stop, lp_top=req.logprobs)
            return req.row
        req.guide = req.session.guide_for(req.prefix)   # its own guide: ``outcome(0)`` reads the shared row
        req.row = req.guide.rows[0]
        req.row.stop = req.stop
        return req.row

    def admit(self) -> list[tuple[RowRequest, Any]]:
        """Admit the waiting requests into batches now (what :meth:`step` does first); returns the
        ``(request, error)`` of those that were cancelled (or whose stop poll raised) before they started."""
        out: list[tuple[RowRequest, Any]] = []
        still: list[RowRequest] = []
        room = self.max_rows - self.running
        joining: dict[int, list[RowRequest]] = {}
        for req in self.waiting:
            try:
                stopped = req.stop is not None and req.stop()
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as err:  # noqa: BLE001 - a caller's poll that breaks fails its row only
                req.status = RowStatus.FAILED
                out.append((req, err))
                continue
            if stopped:
                self.counters["cancelled"] += 1
                req.status = RowStatus.CANCELLED
                out.append((req, GenerationTimeout("the request was cancelled or timed out before it started")))
                continue
            if room <= 0:
                still.append(req)
                continue
            key = self._key(req)
            target = next((b for b in reversed(self.batches) if self._joins(b, req, key) and self._fits(b, req)), None)
            if target is None:
                target = self._new_batch(req, load=self.running + len(self.waiting))
            joining.setdefault(id(target), []).append(req)
            room -= 1
        self.waiting = still
        for b in list(self.batches):
            reqs = joining.get(id(b))
            if not reqs:
                continue
            now = time.perf_counter()
            states = [self._row_state(r) for r in reqs]
            gens = [torch.Generator(device=self.rt.model.device).manual_seed(r.seed) for r in reqs]
            joined = b.canvas.size
            try:
                if b.mode == "ar":
                    ids = b.canvas.admit([r.prompt_ids for r in reqs], max_tokens=[r.max_new_tokens for r in reqs],
                                         generators=gens, rows=states)
                else:
                    ids = b.canvas.admit([r.prompt_ids for r in reqs],
                                         canvases=[-(-r.max_new_tokens // self.L) for r in reqs],
                                         generators=gens, rows=states)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as err:  # noqa: BLE001 - this batch's rows are handed back
                self.counters["failed_batches"] += 1
                self.batches.remove(b)
                out += [(r, BatchFailed(err)) for r in list(b.rows.values()) + reqs]
                continue
            if joined:
                self.counters["joined_running"] += len(reqs)
            self.counters["rows_" + b.mode] += len(reqs)
            for i, r in zip(ids, reqs):
                r.status = RowStatus.REPAIRING if r.plan is not None else RowStatus.RUNNING
                r.admitted = now
                r.t0 = now if r.t0 is None else r.t0
                b.rows[i] = r
            self.counters["admitted"] += len(reqs)
            self.counters["largest_batch"] = max(self.counters["largest_batch"], b.canvas.size)
        return out

    # ------------------------------------------------------------------ 2. one canvas
    def step(self) -> list[tuple[RowRequest, Any]]:
        """Admit, run one canvas of every batch, and return ``(request, result)`` for every row
        that finished: a :class:`~dgemma_struct.results.GenerationResult`, a typed error, or a
        :class:`BatchFailed`."""
        done = self.admit()
        for b in list(self.batches):
            rows, t0 = b.canvas.size, time.perf_counter()
            clock, present = _clock_of(b.canvas), list(b.rows.values())
            try:
                if b.mode == "ar":
                    # alone: as many tokens as a canvas holds; next to other batches a quarter of that,
                    # so one AR fallback row does not hold up a diffusion batch for L forwards
                    left = b.canvas.run_steps(self.L if len(self.batches) == 1 else max(1, self.L // 4))
                    self._ar_events(b)
                else:
                    left = b.canvas.run_canvas(on_canvas=self._canvas_hook(b))
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as err:  # noqa: BLE001 - native panics too: the rows are handed back
                self.counters["failed_batches"] += 1
                self.batches.remove(b)
                done += [(r, BatchFailed(err)) for r in b.rows.values()]
                continue
            self.counters["canvases"] += 1
            if clock is not None:
                b.seen = _share_time(clock, b.seen, present)
            self.chooser.record(b.mode, rows=rows, seconds=time.perf_counter() - t0, finished=len(left))
            for row in left:
                out = self._finish(b, row)
                if out is not None:
                    done.append(out)
            if b.canvas.size == 0:
                self.batches.remove(b)
        for req, res in done:
            req.status = status_of(req, res)
        return done

    def _canvas_hook(self, b: _Batch) -> Callable[[int, torch.Tensor, list[int]], None] | None:
        if not any(r.on_canvas is not None for r in b.rows.values()):
            return None

        def on_canvas(i: int, tokens: torch.Tensor, ids: list[int]) -> None:
            for pos, rid in enumerate(ids):
                r = b.rows.get(rid)
                if r is None or r.on_canvas is None:
                    continue
                r.tokens.extend(tokens[pos].tolist())
                self._emit(r, r.tokens)
        return on_canvas

    def _ar_events(self, b: _Batch) -> None:
        """AR rows' streamed tokens after each step (the tokens so far, as a canvas event would)."""
        for rid, gen in zip(b.canvas.row_ids, b.canvas.generated):
            r = b.rows.get(rid)
            if r is not None and r.on_canvas is not None:
                self._emit(r, gen)

    def _emit(self, r: RowRequest, tokens: list[int]) -> None:
        """``r.on_canvas`` with its tokens so far, cut as its result will be (:meth:`row_result`)."""
        kept, _ = self.rt.split_output(tokens, r.max_new_tokens)
        r.on_canvas(kept)

    # ------------------------------------------------------------------ 3. results
    def _finish(self, b: _Batch, row: FinishedRow) -> tuple[RowRequest, Any] | None:
        """The row's result, or ``None`` when it goes on as a repair row."""
        req = b.rows.pop(row.id)
        self.counters["finished"] += 1
        t0 = req.admitted if req.admitted is not None else time.perf_counter()
        wall = time.perf_counter() - t0
        res = self.rt.row_result(row.tokens, row.passes, req.max_new_tokens, mode=b.mode,
                                 canvases=row.tokens.shape[0] // self.L, wall_s=wall, seed=req.seed,
                                 model_s=req.model_s, mask_s=req.mask_s,
                                 denoising_steps=row.passes if b.mode == "diffusion" else 0)
        if req.session is None:
            if req.stop is not None and req.stop():
                return req, GenerationTimeout("the request was dropped from its batch (timed out or cancelled)")
            res.value = res.text
            if req.logprobs is not None:
                res.logprobs = named(kept_entries(req.row.lp, row.tokens.tolist(), self.rt.pad_token_id,
                                                  len(res.token_ids)), self.rt.tokenizer)
            return req, res
        if req.guide.outcome(0).cut:
            return req, GenerationTimeout("the request was dropped from its batch (timed out or cancelled)")
        req.guide.mask_s = req.mask_s   # the row's own guide is not the one the loop ran: give it its share
        return self._advance(req, req.session.absorb(res, req.guide))

    def _advance(self, req: RowRequest, attempt: Any) -> tuple[RowRequest, Any] | None:
        """Hands ``attempt`` to the request's plan: its result, or ``None`` when the next attempt
        was queued as a repair row (it joins at the next step, before new requests)."""
        session = req.session
        try:
            if req.plan is None:
                req.plan = session.attempts(first=attempt, t0=req.t0)
                ask = next(req.plan)
            else:
                ask = req.plan.send(attempt)
            while True:
                prefix, mode, k = ask
                check_deadline(session.deadline)
                empty = session.no_room(prefix)
                if empty is None:   # a repair (or the AR fallback) joins the batches as a new row
                    self.counters["repair_rows"] += 1
                    req.status = RowStatus.REPAIRING   # superseded by the repair row below
                    self.waiting.insert(0, RowRequest(
                        prompt_ids=session.prompt_ids + prefix, max_new_tokens=session.opts.max_new_tokens - len(prefix),
                        seed=session.attempt_seed(k), session=session, temperature=req.temperature, top_p=req.top_p,
                        stop=req.stop, tag=req.tag, prefix=list(prefix), t0=req.t0, plan=req.plan,
                        status=RowStatus.REPAIRING,
                        mode="auto" if req.mode == "auto" and mode == "diffusion" else mode))
                    return None
                ask = req.plan.send(empty)
        except StopIteration as done:
            return req, done.value
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - typed errors (and native panics) go back to the caller
            return req, err
