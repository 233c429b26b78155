"""A request as the batch worker sees it (:class:`Job`), and how a failure reaches its caller
(:func:`typed_error`). Jobs are made on the event loop and run on the worker thread; results go
back through the loop (``call_soon_threadsafe``)."""
from __future__ import annotations

import asyncio
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dgemma_struct.errors import ConstraintEngineError, DgemmaStructError
from dgemma_struct.options import GenerateOptions

#: What the worker pushes to a streaming job after its last event.
DONE = object()


@dataclass
class Job:
    prompt: Any
    spec: Any                       # a compiled Constraint, any spec generate() accepts, or None (free text)
    options: GenerateOptions        # every generation knob, built once from the request (seed None: fresh)
    deadline: float                 # time.monotonic(); while queued: the queue deadline, then the run deadline
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future | None = None
    events: asyncio.Queue | None = None   # streaming jobs
    cancelled: bool = False
    enqueued: float = field(default_factory=time.monotonic)
    timeout_s: float | None = None  # run time allowed once the job starts (None: keep ``deadline``)
    started: float | None = None
    on_done: Callable[["Job", Any], None] | None = None   # called once with the result or error (metrics)

    def start(self) -> None:
        """The worker starts running this job: its run deadline begins now."""
        self.started = time.monotonic()
        if self.timeout_s is not None:
            self.deadline = self.started + self.timeout_s

    @property
    def streaming(self) -> bool:
        return self.events is not None

    def _post(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:   # the loop is closed: nobody is waiting any more
            pass

    def _finished(self, value: Any) -> None:
        hook, self.on_done = self.on_done, None
        if hook is not None:
            try:
                hook(self, value)
            except Exception:  # noqa: BLE001 - an observer never fails a request
                pass

    def resolve(self, value: Any) -> None:
        """Hand a non-streaming job its result (or exception)."""
        self._finished(value)
        def _set(fut: asyncio.Future, v: Any) -> None:
            if not fut.done():
                if isinstance(v, BaseException):
                    fut.set_exception(v)
                else:
                    fut.set_result(v)
        if self.future is not None:
            self._post(_set, self.future, value)

    def push(self, item: Any) -> None:
        """Hand a streaming job its next event (an exception, or :data:`DONE` at the end)."""
        if isinstance(item, BaseException) or getattr(item, "done", False):
            self._finished(item)
        if self.events is not None:
            self._post(self.events.put_nowait, item)

    def fail(self, err: BaseException) -> None:
        """Deliver ``err`` to whoever waits for this job."""
        if self.streaming:
            self.push(err)
        else:
            self.resolve(err)


def typed_error(err: BaseException, job: Job) -> BaseException:
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


def take(q: "queue.Queue[Job]", sched: Any, max_batch_size: int, max_wait_s: float) -> list[Job]:
    """The continuous worker's waiting jobs, at most as many as ``sched`` has room for; an idle
    worker waits up to 0.1 s for the first, then ``max_wait_s`` for more."""
    room = max_batch_size - sched.running - len(sched.waiting)
    jobs: list[Job] = []
    if sched.idle:
        try:
            jobs.append(q.get(timeout=0.1))
        except queue.Empty:
            return []
        end = time.monotonic() + max_wait_s
        while len(jobs) < room:
            left = end - time.monotonic()
            try:
                jobs.append(q.get(timeout=left) if left > 0 else q.get_nowait())
            except queue.Empty:
                break
        return jobs
    while len(jobs) < room:
        try:
            jobs.append(q.get_nowait())
        except queue.Empty:
            break
    return jobs
