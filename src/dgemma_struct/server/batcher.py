"""Dynamic batching: requests from the event loop are queued and run, grouped into batched canvas
loops, by ONE worker thread that owns the model. The event loop never runs model code.

* ``max_batch_size`` / ``max_wait_ms``: the worker takes the first waiting request, then waits up
  to ``max_wait_ms`` for more, up to ``max_batch_size`` rows, and runs them as one
  :func:`dgemma_struct.api.generate_batch` call (rows with the same ``max_new_tokens`` and seed share
  a loop; each row keeps its own constraint).
* ``max_queue``: a bounded queue; a full queue is refused at once (:class:`QueueFull` -> HTTP 429).
* Per-request timeouts: ``timeout_s`` counts from when the request starts *running* (a short
  request queued behind a long batch keeps its whole budget); the wait in the queue is bounded
  separately (``queue_timeout_s``). A request whose caller gave up (timeout, disconnect) is
  marked cancelled and dropped when the worker reaches it; in a batch already running its row
  is dropped at the next denoising step (``generate_batch(row_stop=...)``).
* Failure containment: when a batched loop fails as a whole, each of its rows is rerun alone, so
  only the row that caused it fails; errors from native code (``PanicException`` is a
  ``BaseException``) become a typed :class:`~dgemma_struct.errors.ConstraintEngineError`. The
  worker catches everything: a failing batch fails its own requests, never the thread.
* Seeds: every row has its own seed and generator (``generate_batch(seed=[...])``), so a row's
  output does not depend on its batch-mates; ``seed=None`` is a fresh random seed per row. (With
  an API that takes one seed per call, rows are grouped by seed instead, and ``None`` rows share
  one fresh seed per batch.)

Example::

    batcher = Batcher(runtime, max_batch_size=8, max_wait_ms=10)
    batcher.start()
    result = await batcher.submit("Extract ...", constraint, max_new_tokens=64)
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from dgemma_struct import api
from dgemma_struct.errors import ConstraintEngineError, DgemmaStructError, GenerationTimeout
from dgemma_struct.results import GenerationResult
from dgemma_struct.runtime import DiffusionRuntime


class QueueFull(Exception):
    """The request queue is full (the server answers 429)."""


class ShuttingDown(Exception):
    """The batcher is stopped (the server answers 503)."""


_DONE = object()


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _per_row_seeds(fn: Any) -> bool:
    """Whether ``fn``'s ``seed`` takes one seed per row (every row then has its own generator)."""
    try:
        return "Sequence" in str(inspect.signature(fn).parameters["seed"].annotation)
    except (TypeError, ValueError, KeyError):
        return False


@dataclass
class Job:
    prompt: Any
    spec: Any                       # a compiled Constraint, any spec generate() accepts, or None (free text)
    max_new_tokens: int
    seed: int | None
    deadline: float                 # time.monotonic(); while queued: the queue deadline, then the run deadline
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future | None = None
    events: asyncio.Queue | None = None   # streaming jobs
    cancelled: bool = False
    enqueued: float = field(default_factory=time.monotonic)
    timeout_s: float | None = None  # run time allowed once the job starts (None: keep ``deadline``)
    temperature: float | None = None
    top_p: float | None = None
    started: float | None = None
    thinking: Any = False           # False, True (thought block required) or "optional"
    max_thinking_tokens: int | None = None

    def start(self) -> None:
        """The worker starts running this job: its run deadline begins now."""
        self.started = time.monotonic()
        if self.timeout_s is not None:
            self.deadline = self.started + self.timeout_s

    @property
    def sampling(self) -> tuple:
        return (self.temperature, self.top_p)

    @property
    def streaming(self) -> bool:
        return self.events is not None

    def _post(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:   # the loop is closed: nobody is waiting any more
            pass

    def resolve(self, value: Any) -> None:
        def _set(fut: asyncio.Future, v: Any) -> None:
            if not fut.done():
                if isinstance(v, BaseException):
                    fut.set_exception(v)
                else:
                    fut.set_result(v)
        if self.future is not None:
            self._post(_set, self.future, value)

    def push(self, item: Any) -> None:
        if self.events is not None:
            self._post(self.events.put_nowait, item)


class Batcher:
    """Owns one runtime and one worker thread; see the module docstring."""

    def __init__(self, runtime: DiffusionRuntime, *, max_batch_size: int = 8, max_wait_ms: float = 10.0,
                 max_queue: int = 64, max_repairs: int = 2, queue_timeout_s: float | None = None):
        if max_batch_size < 1 or max_queue < 1:
            raise ValueError("max_batch_size and max_queue must be >= 1")
        self.runtime = runtime
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_repairs = max_repairs
        self.queue_timeout_s = queue_timeout_s
        self._q: "queue.Queue[Job]" = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters = {"batches": 0, "rows": 0, "largest_batch": 0, "dropped": 0, "streams": 0, "errors": 0,
                         "isolated_reruns": 0, "cancelled_rows": 0}

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
            self._fail(job, ShuttingDown("the server is shutting down"))

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def queue_depth(self) -> int:
        return self._q.qsize()

    # ------------------------------------------------------------------ event-loop side
    def _enqueue(self, job: Job) -> None:
        if not self.alive:
            raise ShuttingDown("the generation worker is not running")
        try:
            self._q.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"the request queue is full ({self._q.maxsize} waiting); retry later") from None

    def _job(self, prompt: Any, spec: Any, max_new_tokens: int, seed: int | None, timeout_s: float,
             temperature: float | None, top_p: float | None, **kw: Any) -> Job:
        loop = asyncio.get_running_loop()
        wait = self.queue_timeout_s if self.queue_timeout_s is not None else timeout_s
        return Job(prompt, spec, max_new_tokens, seed, time.monotonic() + wait, loop, timeout_s=timeout_s,
                   temperature=temperature, top_p=top_p, **kw)

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

    async def submit(self, prompt: Any, spec: Any, *, max_new_tokens: int, seed: int | None = 0,
                     timeout_s: float = 60.0, temperature: float | None = None,
                     top_p: float | None = None, thinking: Any = False,
                     max_thinking_tokens: int | None = None) -> GenerationResult:
        """Queue one request and wait for its result; raises the row's typed error,
        :class:`QueueFull`, or :class:`GenerationTimeout` (``timeout_s`` after it started running,
        or when it waited longer than ``queue_timeout_s`` in the queue)."""
        job = self._job(prompt, spec, max_new_tokens, seed, timeout_s, temperature, top_p,
                        future=asyncio.get_running_loop().create_future(), thinking=thinking,
                        max_thinking_tokens=max_thinking_tokens)
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

    async def stream(self, prompt: Any, spec: Any, *, max_new_tokens: int, seed: int | None = 0,
                     timeout_s: float = 60.0, temperature: float | None = None,
                     top_p: float | None = None) -> AsyncIterator[Any]:
        """Queue a streaming request; yields :class:`~dgemma_struct.results.CanvasEvent` objects,
        the last with ``done=True``. Typed errors are raised from the iterator. Closing the
        iterator early (client disconnect) cancels the request without touching the worker."""
        job = self._job(prompt, spec, max_new_tokens, seed, timeout_s, temperature, top_p, events=asyncio.Queue())
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
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.cancelled = True

    # ------------------------------------------------------------------ worker side
    def _fail(self, job: Job, err: BaseException) -> None:
        if job.streaming:
            job.push(err)
        else:
            job.resolve(err)

    def _collect(self) -> list[Job]:
        try:
            first = self._q.get(timeout=0.1)
        except queue.Empty:
            return []
        batch = [first]
        if first.streaming:
            return batch
        end = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch_size:
            left = end - time.monotonic()
            try:
                job = self._q.get(timeout=left) if left > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            batch.append(job)
            if job.streaming:
                break
        return batch

    def _run(self) -> None:
        while not self._stop.is_set():
            batch: list[Job] = []
            try:
                batch = self._collect()
                if not batch:
                    continue
                now = time.monotonic()
                live = []
                for job in batch:
                    if job.cancelled:
                        self.counters["dropped"] += 1
                    elif job.deadline <= now:
                        self.counters["dropped"] += 1
                        self._fail(job, GenerationTimeout("the request timed out while queued"))
                    else:
                        live.append(job)
                streams = [j for j in live if j.streaming]
                rows = [j for j in live if not j.streaming]
                groups: dict[tuple, list[Job]] = {}
                per_row = _per_row_seeds(api.generate_batch) and _per_row_seeds(self.runtime.generate_ids)
                for j in rows:
                    key = (j.max_new_tokens, j.spec is None, j.sampling, j.thinking, j.max_thinking_tokens) + (
                        () if per_row else (j.seed,))
                    groups.setdefault(key, []).append(j)
                for group in groups.values():
                    self._run_group(group)
                for j in streams:
                    self._run_stream(j)
            except BaseException as err:  # noqa: BLE001 - the worker must survive anything
                self.counters["errors"] += 1
                for job in batch:
                    self._fail(job, _typed(err, job))

    def _gen_kwargs(self, job: Job) -> dict[str, Any]:
        """Sampling options the installed API accepts (feature-detected, so the server works with
        an API that lacks them: they are then not applied)."""
        kw: dict[str, Any] = {}
        if job.temperature is not None and _accepts(api.generate_batch, "temperature"):
            kw["temperature"] = job.temperature
        if job.top_p is not None and _accepts(api.generate_batch, "top_p"):
            kw["top_p"] = job.top_p
        if job.thinking not in (False, None):
            kw["thinking"] = job.thinking     # generate_batch takes it (the server checked)
            if job.max_thinking_tokens is not None:
                kw["max_thinking_tokens"] = job.max_thinking_tokens
        return kw

    def _run_group(self, group: list[Job], *, isolated: bool = False) -> None:
        for j in group:
            j.start()
        if not isolated:
            self.counters["batches"] += 1
            self.counters["rows"] += len(group)
            self.counters["largest_batch"] = max(self.counters["largest_batch"], len(group))
        timeout = max(0.001, max(j.deadline for j in group) - time.monotonic())
        first = group[0]
        if _per_row_seeds(api.generate_batch) and _per_row_seeds(self.runtime.generate_ids):
            seed: Any = [j.seed if j.seed is not None else secrets.randbits(62) for j in group]
        else:
            seed = first.seed if first.seed is not None else secrets.randbits(62)
        try:
            if first.spec is None:
                results = self._free_text(group, seed)
            else:
                # a row whose caller timed out or went away leaves the batch at the next step
                results = api.generate_batch([j.prompt for j in group], [j.spec for j in group],
                                             runtime=self.runtime, max_new_tokens=first.max_new_tokens,
                                             seed=seed, max_repairs=self.max_repairs, timeout_s=timeout,
                                             return_exceptions=True,
                                             row_stop=[(lambda j=j: j.cancelled or time.monotonic() > j.deadline)
                                                       for j in group], **self._gen_kwargs(first))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - PanicException is a BaseException
            if len(group) > 1 and not isinstance(err, GenerationTimeout):
                # one row broke the batched loop: rerun each row alone, so only that row fails
                self.counters["isolated_reruns"] += 1
                for j in group:
                    if not j.cancelled:
                        self._run_group([j], isolated=True)
                return
            results = [_typed(err, j) for j in group]
        for job, res in zip(group, results):
            if job.cancelled:
                self.counters["cancelled_rows"] += 1
            else:
                job.resolve(res if not isinstance(res, BaseException) else _typed(res, job))

    def _free_text(self, group: list[Job], seed: Any) -> list[Any]:
        """Unconstrained rows (``response_format`` ``text``), capped at ``max_new_tokens``."""
        rt = self.runtime
        out: list[Any] = [None] * len(group)
        encoded = []
        for i, j in enumerate(group):
            try:
                ids = rt.encode_prompt(j.prompt)
                rt._batch([ids], j.max_new_tokens)
                encoded.append((i, ids))
            except DgemmaStructError as err:
                out[i] = err
        if encoded:
            if isinstance(seed, list):
                seed = [seed[i] for i, _ in encoded]
            kw: dict[str, Any] = {}
            first = group[0]
            temp = first.temperature
            if _accepts(rt.generate_ids, "top_p") and first.top_p is not None:
                kw["top_p"] = first.top_p
            if temp is not None:
                if _accepts(rt.generate_ids, "temperature") and _accepts(api.generate_batch, "temperature"):
                    kw["temperature"] = temp       # the runtime scales its own schedule
                else:                              # scale the diffusion temperature schedule here
                    f = max(temp, 0.01)
                    kw["settings"] = dataclasses.replace(rt.settings, t_min=rt.settings.t_min * f,
                                                         t_max=rt.settings.t_max * f)
            res = rt.generate_ids([ids for _, ids in encoded], max_new_tokens=first.max_new_tokens, seed=seed, **kw)
            for (i, _), r in zip(encoded, res):
                if len(r.token_ids) > first.max_new_tokens:
                    r.token_ids = r.token_ids[:first.max_new_tokens]
                    r.text = rt.decode(r.token_ids)
                    r.stats.finish_reason = "length"
                r.value = r.text
                out[i] = r
        return out

    def _run_stream(self, job: Job) -> None:
        self.counters["streams"] += 1
        job.start()
        timeout = max(0.001, job.deadline - time.monotonic())
        seed = job.seed if job.seed is not None else secrets.randbits(62)
        try:
            kw = {k: v for k, v in (("temperature", job.temperature), ("top_p", job.top_p)) if v is not None}
            if job.spec is None:
                kw = {k: v for k, v in kw.items() if _accepts(self.runtime.stream, k)}
                gen = self.runtime.stream(job.prompt, max_new_tokens=job.max_new_tokens, seed=seed, **kw)
            else:
                kw = {k: v for k, v in kw.items() if _accepts(api.stream, k)}
                gen = api.stream(job.prompt, job.spec, runtime=self.runtime, max_new_tokens=job.max_new_tokens,
                                 seed=seed, timeout_s=timeout, **kw)
            try:
                for ev in gen:
                    if job.cancelled:
                        return
                    if ev.done and job.spec is None:
                        ev.value = ev.text
                    job.push(ev)
            finally:
                gen.close()
            job.push(_DONE)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - delivered to the request
            job.push(_typed(err, job))


def _typed(err: BaseException, job: Job) -> BaseException:
    """``err`` as the request should see it: typed errors as they are; anything else raised while
    running a constrained row (native engine faults, ``PanicException``) as a
    :class:`ConstraintEngineError`; other failures as they are (the server maps them to 500)."""
    if isinstance(err, DgemmaStructError):
        return err
    if job.spec is not None:
        e = ConstraintEngineError(f"the constraint engine failed on this request: {type(err).__name__}: "
                                  f"{str(err)[:500]}")
        e.__cause__ = err if isinstance(err, Exception) else None
        return e
    return err if isinstance(err, Exception) else RuntimeError(repr(err))
