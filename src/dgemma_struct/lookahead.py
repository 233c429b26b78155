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
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

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
