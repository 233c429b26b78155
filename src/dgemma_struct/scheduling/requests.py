"""A scheduler row's request and its phases (:class:`RowStatus`), kept beside the scheduler as
transformers keeps ``continuous_batching/requests.py``: what a caller submits, and what the
scheduler records on it as it runs.

Example::

    >>> req = RowRequest(prompt_ids=[2, 5], max_new_tokens=8, seed=0)
    >>> req.status, req.status.finished
    (<RowStatus.WAITING: 'waiting'>, False)
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generator

from dgemma_struct.errors import GenerationTimeout

if TYPE_CHECKING:
    from dgemma_struct.guide.constraint_guide import ConstraintGuide
    from dgemma_struct.guide.rows import RowState
    from dgemma_struct.repair.session import RepairSession

__all__ = ["RowRequest", "RowStatus", "BatchFailed", "status_of"]


class RowStatus(str, enum.Enum):
    """A request's phase in the scheduler: ``waiting`` to join a batch, ``running`` its first attempt,
    ``repairing`` (a repair or the AR fallback, queued or running), then one of the three ends."""

    WAITING = "waiting"
    RUNNING = "running"
    REPAIRING = "repairing"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (RowStatus.DONE, RowStatus.CANCELLED, RowStatus.FAILED)


@dataclass(eq=False)
class RowRequest:
    """One request for a :class:`ContinuousScheduler`. ``session``: a prepared constrained request
    (:func:`dgemma_struct.repair.preparation.prepare`); ``None`` is free text. ``stop()`` True drops the row
    (its caller went away or timed out: the result is a :class:`GenerationTimeout`).
    ``on_canvas(token_ids)`` sees the row's committed tokens after each canvas (stop tokens and
    padding removed, at most ``max_new_tokens``). ``tag``: anything the caller wants back."""

    prompt_ids: list[int]
    max_new_tokens: int
    seed: int
    session: RepairSession | None = None
    temperature: float | None = None
    top_p: float = 1.0
    stop: Callable[[], bool] | None = None
    on_canvas: Callable[[list[int]], None] | None = None
    tag: Any = None
    mode: str = "diffusion"            # "diffusion", "ar", or "auto" (the scheduler picks per batch)
    logprobs: int | None = None        # free text: record each token's logprob and this many alternatives
    prefix: list[int] = field(default_factory=list)   # a repair: the kept tokens it continues from
    # set by the scheduler
    status: RowStatus = RowStatus.WAITING
    admitted: float | None = None      # time.perf_counter() when it joined a batch
    t0: float | None = None            # when its first attempt joined (the request's wall time)
    plan: Generator | None = field(default=None, repr=False)   # the session's attempts, once started
    guide: ConstraintGuide | None = field(default=None, repr=False)
    row: RowState | None = field(default=None, repr=False)   # its state in the running batch
    tokens: list[int] = field(default_factory=list, repr=False)
    model_s: float = 0.0               # this row's share of its batches' model and constraint time
    mask_s: float = 0.0


def status_of(req: RowRequest, res: Any) -> RowStatus:
    """How a request that left the scheduler ended."""
    if isinstance(res, GenerationTimeout) and req.stop is not None and req.stop():
        return RowStatus.CANCELLED
    return RowStatus.FAILED if isinstance(res, BaseException) else RowStatus.DONE


class BatchFailed(Exception):
    """A batch's canvas raised: every row in it is handed back with this error (``cause``)."""

    def __init__(self, cause: BaseException):
        super().__init__(f"the batched canvas failed: {cause!r}")
        self.cause = cause
