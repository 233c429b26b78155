"""Scheduling: rows of many requests sharing running batches (continuous batching), the mode
chooser, and the loop that drives repair sessions to completion.

- :mod:`~dgemma_struct.scheduling.requests` — :class:`RowRequest`, its :class:`RowStatus`, :class:`BatchFailed`;
- :mod:`~dgemma_struct.scheduling.scheduler` — :class:`ContinuousScheduler` (admit, one canvas, results);
- :mod:`~dgemma_struct.scheduling.mode_choice` — diffusion or AR per request;
- :mod:`~dgemma_struct.scheduling.run` — :func:`run_sessions`, prepared requests driven to completion
  on the one batch road (what ``generate``, ``generate_batch`` and ``stream`` run).

A :class:`RowRequest` names its phase with a :class:`RowStatus` (waiting, running, repairing, done,
cancelled, failed).

Never imports the verbs, the server, grounding or tools; only the verbs and the server import it.

Example::

    >>> from dgemma_struct.scheduling import ContinuousScheduler
    >>> ContinuousScheduler.__name__
    'ContinuousScheduler'
"""
from dgemma_struct.scheduling.mode_choice import ModeChooser
from dgemma_struct.scheduling.run import run_sessions
from dgemma_struct.scheduling.requests import BatchFailed, RowRequest, RowStatus
from dgemma_struct.scheduling.scheduler import ContinuousScheduler

__all__ = ["BatchFailed", "ContinuousScheduler", "ModeChooser", "RowRequest", "RowStatus", "run_sessions"]
