"""The guide: the step hook that constrains a batch of rows, one
:class:`~dgemma_struct.guide.rows.RowState` per row.

- :mod:`~dgemma_struct.guide.constraint_guide` — :class:`ConstraintGuide` (the canvas rules: exact
  masks to the first violation, commit, progress, forced tokens);
- :mod:`~dgemma_struct.guide.lookahead` — its AR half, with the mask computed ahead on a worker;
- :mod:`~dgemma_struct.guide.canonical` — AR: canonical tokens where the grammar forces what follows;
- :mod:`~dgemma_struct.guide.rows` — a row's state and outcome;
- :mod:`~dgemma_struct.guide.budget` — closing a value before its token budget runs out.

The guide never imports ``repair``, ``scheduling``, the verbs or the server.

Example::

    >>> from dgemma_struct.guide import ConstraintGuide
    >>> ConstraintGuide([None], pad_token_id=0).rows[0].walker is None
    True
"""
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.guide.rows import RowOutcome, RowState

__all__ = ["ConstraintGuide", "RowOutcome", "RowState"]
