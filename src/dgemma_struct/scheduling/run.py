"""Prepared requests driven to completion on the one batch road: every
:class:`~dgemma_struct.repair.session.RepairSession` becomes a row of a
:class:`~dgemma_struct.scheduling.scheduler.ContinuousScheduler` (diffusion or AR, with or without
logprobs), rows leave as they finish and their repairs join again. A session that asks for
``confidence`` records its tokens' logprobs and gets its per-field confidence
(:mod:`dgemma_struct.repair.field_confidence`).

Example::

    >>> from dgemma_struct.constraints import Regex
    >>> from dgemma_struct.options import GenerateOptions
    >>> from dgemma_struct.repair import prepare
    >>> from dgemma_struct.testing import tiny_runtime
    >>> rt = tiny_runtime()
    >>> opts = GenerateOptions(max_new_tokens=16)
    >>> sessions = [prepare("Two digits?", Regex("[0-9]{2}"), rt, opts.with_overrides(seed=s)) for s in (1, 2)]
    >>> [len(r.value) for r in run_sessions(rt, sessions)]
    [2, 2]
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Generator, Sequence

from dgemma_struct.errors import DgemmaStructError
from dgemma_struct.scheduling.requests import BatchFailed, RowRequest
from dgemma_struct.scheduling.scheduler import ContinuousScheduler

if TYPE_CHECKING:
    from dgemma_struct.repair.session import RepairSession
    from dgemma_struct.runtime import DiffusionRuntime

__all__ = ["run_sessions", "stream_session"]


def _stop_of(sess: RepairSession, caller_stop: Callable[[], bool] | None) -> Callable[[], bool]:
    """The row's stop poll: its caller's, or the session's deadline passed."""
    return lambda: ((caller_stop is not None and caller_stop())
                    or (sess.deadline is not None and time.monotonic() > sess.deadline))


def _row(sess: RepairSession, tag: int, stop: Callable[[], bool] | None,
         on_canvas: Callable[[list[int]], None] | None = None) -> RowRequest:
    o = sess.opts
    return RowRequest(prompt_ids=sess.prompt_ids, max_new_tokens=o.max_new_tokens, seed=sess.seed, session=sess,
                      temperature=o.temperature, top_p=o.top_p, mode=o.mode, stop=_stop_of(sess, stop), tag=tag,
                      on_canvas=on_canvas)


def _settled(sess: RepairSession, res: Any) -> Any:
    """A row's result as the caller gets it: a batch that failed as a whole is rerun alone; an
    error that is not typed (a bug) is raised."""
    if isinstance(res, BatchFailed):
        try:
            res = sess.solve()
        except DgemmaStructError as err:
            return err
    if isinstance(res, BaseException) and not isinstance(res, DgemmaStructError):
        raise res
    return res


def run_sessions(rt: DiffusionRuntime, sessions: Sequence[RepairSession],
                 stops: Sequence[Callable[[], bool] | None] | None = None) -> list[Any]:
    """Each session's :class:`~dgemma_struct.results.GenerationResult` or typed error, in order.
    ``stops[i]()`` True drops row ``i`` (a :class:`~dgemma_struct.errors.GenerationTimeout`). A row
    whose batched canvas failed as a whole is rerun alone, so only the row that breaks fails."""
    sched = ContinuousScheduler(rt, max_rows=max(1, len(sessions)))
    for j, sess in enumerate(sessions):
        sched.submit(_row(sess, j, stops[j] if stops is not None else None))
    results: list[Any] = [None] * len(sessions)
    while not sched.idle:
        for req, res in sched.step():
            results[req.tag] = _settled(sessions[req.tag], res)
    return results


def stream_session(rt: DiffusionRuntime, session: RepairSession) -> Generator[list[int], None, Any]:
    """One session on the same road, yielding its first attempt's committed tokens after each canvas
    (cut as the result will be); returns its result or typed error (``StopIteration.value``)."""
    sched = ContinuousScheduler(rt, max_rows=1)
    canvases: list[list[int]] = []
    sched.submit(_row(session, 0, None, on_canvas=canvases.append))
    result: Any = None
    while not sched.idle:
        for _, res in sched.step():
            result = _settled(session, res)
        yield from canvases
        canvases.clear()
    return result
