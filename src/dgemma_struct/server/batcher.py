"""Batching: requests from the event loop are queued and run by ONE worker thread that owns the
model. The event loop never runs model code (docs/server.md, "Concurrency and limits").

* One batch road: every request (constrained or free text, with or without ``logprobs``, streamed
  or not) is a row of one :class:`~dgemma_struct.scheduling.scheduler.ContinuousScheduler`: rows
  join a running batch between canvases and leave it as soon as they finish; streams are rows like
  the others (each committed canvas becomes an event); ``max_batch_size`` caps the rows running at
  once; ``mode_choice="auto"``: each new batch runs diffusion or AR, whichever measured more
  finished rows per second at the current load (:mod:`dgemma_struct.scheduling.mode_choice`).
* ``max_queue``: a full queue is refused at once (:class:`QueueFull` -> HTTP 429).
* Timeouts: ``timeout_s`` counts from when a request starts *running*; the wait in the queue is
  bounded by ``queue_timeout_s``. A request whose caller gave up is dropped when the worker
  reaches it, or at the next denoising step when it is running.
* Failure containment: a canvas that fails as a whole reruns each of its rows in a batch of its
  own, so only the row that caused it fails; native errors (``PanicException``) become a typed
  :class:`~dgemma_struct.errors.ConstraintEngineError`; the worker thread survives anything.
* Seeds: every row has its own seed and generator; ``seed=None`` is a fresh random seed per row.
* Observability: each finished row is reported to ``metrics`` (:mod:`.metrics`); each row's share
  of model and constraint time goes into its stats (the scheduler shares each batch's clock).

The jobs are in :mod:`.jobs`; a job becomes a scheduler row in :mod:`.generation`.

Example::

    batcher = Batcher(runtime, max_batch_size=8, max_wait_ms=10)
    batcher.start()
    result = await batcher.submit("Extract ...", constraint, max_new_tokens=64)
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from typing import Any, AsyncIterator

from dgemma_struct.scheduling.requests import BatchFailed
from dgemma_struct.scheduling.scheduler import ContinuousScheduler
from dgemma_struct.errors import GenerationTimeout
from dgemma_struct.options import GenerateOptions
from dgemma_struct.results import CanvasEvent, GenerationResult
from dgemma_struct.runtime import DiffusionRuntime

from .http_errors import QueueFull, ShuttingDown
from .generation import JOB_KNOBS, row_request
from .jobs import DONE, Job, take, typed_error

__all__ = ["Batcher", "Job", "QueueFull", "ShuttingDown"]


class Batcher:
    """Owns one runtime and one worker thread; see the module docstring."""

    def __init__(self, runtime: DiffusionRuntime, *, max_batch_size: int = 8, max_wait_ms: float = 10.0,
                 max_queue: int = 64, max_repairs: int = 2, queue_timeout_s: float | None = None,
                 batching: str = "continuous", mode_choice: str = "requested", metrics: Any = None):
        if max_batch_size < 1 or max_queue < 1:
            raise ValueError("max_batch_size and max_queue must be >= 1")
        if batching != "continuous":
            raise ValueError(f"batching must be 'continuous' (the static road was removed), got {batching!r}")
        if mode_choice not in ("requested", "auto"):
            raise ValueError(f"mode_choice must be 'requested' or 'auto', got {mode_choice!r}")
        self.batching = batching
        self.mode = "auto" if mode_choice == "auto" else "diffusion"
        self.sched = ContinuousScheduler(runtime, max_rows=max_batch_size)
        self.runtime = runtime
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_repairs = max_repairs
        self.queue_timeout_s = queue_timeout_s
        self._q: "queue.Queue[Job]" = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.metrics = metrics            # a .metrics.Metrics: each finished row is reported to it
        self.counters = {"batches": 0, "rows": 0, "largest_batch": 0, "dropped": 0, "streams": 0, "errors": 0,
                         "isolated_reruns": 0, "cancelled_rows": 0, "continuous_rows": 0, "canvases": 0}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Batcher":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dgemma-struct-worker", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        while True:  # fail whatever is still queued
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            job.fail(ShuttingDown("the server is shutting down"))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def worker_alive(self) -> bool:
        """Whether the worker thread runs (also while stopping; :attr:`alive` is False then)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def queue_depth(self) -> int:
        return self._q.qsize()

    @property
    def running_rows(self) -> int:
        """Rows being generated now (read from other threads: a best-effort count)."""
        try:
            return self.sched.running + len(self.sched.waiting)
        except RuntimeError:   # the batch list changed while it was read
            return 0

    def _observe(self, job: Job, value: Any) -> None:
        now = time.monotonic()
        self.metrics.row(value, queued_s=(job.started or now) - job.enqueued,
                         ran_s=None if job.started is None else now - job.started)

    # ------------------------------------------------------------------ event-loop side
    def _enqueue(self, job: Job) -> None:
        if not self.alive:
            raise ShuttingDown("the generation worker is not running")
        try:
            self._q.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"the request queue is full ({self._q.maxsize} waiting); retry later") from None

    def _job(self, prompt: Any, spec: Any, options: GenerateOptions | None, knobs: dict[str, Any], timeout_s: float,
             **kw: Any) -> Job:
        opts = GenerateOptions.build(options, knobs, verb="Batcher.submit", allowed=JOB_KNOBS)
        loop = asyncio.get_running_loop()
        wait = self.queue_timeout_s if self.queue_timeout_s is not None else timeout_s
        return Job(prompt, spec, opts, time.monotonic() + wait, loop, timeout_s=timeout_s,
                   on_done=self._observe if self.metrics else None, **kw)

    async def _wait_started(self, job: Job, timeout_s: float) -> None:
        """Returns once the worker started ``job``; :class:`GenerationTimeout` if it waited in the
        queue past its queue deadline."""
        while job.started is None:
            if (job.future is not None and job.future.done()) or (job.events is not None and not job.events.empty()):
                return
            left = job.deadline - time.monotonic()
            if left <= 0:
                raise GenerationTimeout(f"the request waited in the queue for more than "
                                        f"{self.queue_timeout_s if self.queue_timeout_s is not None else timeout_s:g}"
                                        " s without starting")
            await asyncio.sleep(min(0.02, left))

    async def submit(self, prompt: Any, spec: Any, options: GenerateOptions | None = None, *,
                     timeout_s: float = 60.0, **knobs: Any) -> GenerationResult:
        """Queue one request and wait for its result; raises the row's typed error,
        :class:`QueueFull`, or :class:`GenerationTimeout` (``timeout_s`` after it started running,
        or when it waited longer than ``queue_timeout_s`` in the queue). ``options`` / ``knobs``: the
        request's :class:`~dgemma_struct.options.GenerateOptions` (the knobs in :data:`JOB_KNOBS`,
        e.g. ``max_new_tokens``, ``seed``, ``temperature``, ``logprobs``), carried to the row as one
        object."""
        job = self._job(prompt, spec, options, knobs, timeout_s, future=asyncio.get_running_loop().create_future())
        self._enqueue(job)
        try:
            waiter = asyncio.ensure_future(self._wait_started(job, timeout_s))
            done, _ = await asyncio.wait({waiter, job.future}, return_when=asyncio.FIRST_COMPLETED)
            if job.future not in done:
                waiter.result()            # raises the queue timeout
            else:
                waiter.cancel()
            left = max(0.0, job.deadline - time.monotonic()) + 1.0   # the worker enforces the deadline itself
            return await asyncio.wait_for(asyncio.shield(job.future), left)
        except asyncio.TimeoutError:
            raise GenerationTimeout(f"the request did not finish within {timeout_s:g} s") from None
        finally:
            job.cancelled = True   # no-op when done; drops it from the queue otherwise

    async def stream(self, prompt: Any, spec: Any, options: GenerateOptions | None = None, *,
                     timeout_s: float = 60.0, **knobs: Any) -> AsyncIterator[Any]:
        """Queue a streaming request (options as :meth:`submit`); yields
        :class:`~dgemma_struct.results.CanvasEvent` objects, the last with ``done=True``. Typed errors
        are raised from the iterator. Closing the iterator early (client disconnect) cancels the
        request without touching the worker."""
        job = self._job(prompt, spec, options, knobs, timeout_s, events=asyncio.Queue())
        self._enqueue(job)
        try:
            await self._wait_started(job, timeout_s)
            while True:
                left = job.deadline - time.monotonic() + 1.0
                if left <= 0:
                    raise GenerationTimeout(f"the request did not finish within {timeout_s:g} s")
                try:
                    item = await asyncio.wait_for(job.events.get(), left)
                except asyncio.TimeoutError:
                    raise GenerationTimeout(f"the request did not finish within {timeout_s:g} s") from None
                if item is DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.cancelled = True

    # ------------------------------------------------------------------ worker side
    def _run(self) -> None:
        while not self._stop.is_set():
            self._tick()

    def _live(self, jobs: list[Job]) -> list[Job]:
        """Drops the jobs whose caller went away or whose queue deadline passed."""
        now = time.monotonic()
        live = []
        for job in jobs:
            if job.cancelled:
                self.counters["dropped"] += 1
            elif job.deadline <= now:
                self.counters["dropped"] += 1
                job.fail(GenerationTimeout("the request timed out while queued"))
            else:
                live.append(job)
        return live

    def _submit(self, sched: ContinuousScheduler, job: Job) -> None:
        """``job`` as a row of ``sched``; a request that cannot become one fails alone."""
        try:
            sched.submit(row_request(self.runtime, job, self.max_repairs, mode=self.mode))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - a bad request fails alone
            job.fail(typed_error(err, job))
            return
        self.counters["rows"] += 1
        if job.streaming:
            self.counters["streams"] += 1

    def _tick(self) -> None:
        """One round of the worker: take jobs, admit them, run one canvas everywhere, deliver what
        finished."""
        sched = self.sched
        jobs: list[Job] = []
        try:
            jobs = self._live(take(self._q, self.sched, self.max_batch_size, self.max_wait_s))
            for job in jobs:
                self._submit(sched, job)
            jobs = []
            if sched.idle:
                return
            done = sched.step()
        except BaseException as err:  # noqa: BLE001 - the worker must survive anything
            self.counters["errors"] += 1
            for job in jobs:
                job.fail(typed_error(err, job))
            for req in sched.abandon():
                req.tag.fail(typed_error(err, req.tag))
            return
        self.counters["canvases"] = sched.counters["canvases"]
        self.counters["batches"] = sched.counters["batches_opened"]
        self.counters["largest_batch"] = max(self.counters["largest_batch"], sched.counters["largest_batch"])
        self.counters["scheduler"] = dict(sched.counters, mode_rates=sched.chooser.summary())
        for req, res in done:
            self._deliver(req.tag, res)

    def run_jobs(self, jobs: list[Job]) -> None:
        """Run ``jobs`` to completion on this thread, on a scheduler of their own (the worker's road,
        without the worker: for tests and tools)."""
        sched = ContinuousScheduler(self.runtime, max_rows=self.max_batch_size)
        for job in self._live(jobs):
            self._submit(sched, job)
        while not sched.idle:
            for req, res in sched.step():
                self._deliver(req.tag, res)

    def _deliver(self, job: Job, res: Any) -> None:
        self.counters["continuous_rows"] += 1
        if job.cancelled:
            self.counters["cancelled_rows"] += 1
            return
        if isinstance(res, BatchFailed):   # the canvas failed as a whole: this row in a batch of its own
            self._run_alone(job)
            return
        if isinstance(res, BaseException):
            job.fail(typed_error(res, job))
            return
        if not job.streaming:
            job.resolve(res)
            return
        job.push(CanvasEvent.final(res, validated=job.spec is not None, value=res.value))
        job.push(DONE)

    def _run_alone(self, job: Job) -> None:
        """A row whose batched canvas failed, rerun in a batch of its own, so only the row that
        caused the failure fails."""
        self.counters["isolated_reruns"] += 1
        solo = ContinuousScheduler(self.runtime, max_rows=1)
        try:
            solo.submit(row_request(self.runtime, job, self.max_repairs, mode=self.mode))
            while not solo.idle:
                for _, res in solo.step():
                    res = res.cause if isinstance(res, BatchFailed) else res
                    if job.cancelled:
                        self.counters["cancelled_rows"] += 1
                    elif isinstance(res, BaseException):
                        job.fail(typed_error(res, job))
                    else:
                        self._deliver(job, res)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - delivered to the request
            job.fail(typed_error(err, job))
