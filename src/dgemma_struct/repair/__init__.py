"""One constrained request from call to value: prepared into a
:class:`~dgemma_struct.repair.session.RepairSession` (:mod:`~dgemma_struct.repair.preparation`), then run,
validated and renoised from where it goes wrong (:mod:`~dgemma_struct.constraints.json_locate`), with an AR
fallback when repairs are spent.

Never imports ``scheduling``, the verbs or the server (the isolated-compile pool is looked up
lazily, see :func:`~dgemma_struct.repair.preparation.isolated_constraint_for`).

Example::

    >>> from dgemma_struct.repair import Redo
    >>> Redo(prefix=[5, 6], reasons=["a: too short"]).prefix
    [5, 6]
"""
from dgemma_struct.repair.preparation import constraint_for, prepare
from dgemma_struct.repair.session import Accept, GiveUp, LeastJunk, Redo, RepairSession

__all__ = ["Accept", "GiveUp", "LeastJunk", "Redo", "RepairSession", "constraint_for", "prepare"]
