"""The guide's per-row state (:class:`RowState`) and what a finished row reports (:class:`RowOutcome`).

Example::

    >>> RowOutcome(tokens=[5, 6], complete=True, dead_end=False, forced=1, closing=False).complete
    True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

if TYPE_CHECKING:
    from dgemma_struct.constraints import CanvasWalker
    from dgemma_struct.guide.exclusion import Exclusion
    from dgemma_struct.results import TokenLogprob


@dataclass(slots=True)
class RowState:
    """One batch row under a :class:`~dgemma_struct.guide.constraint_guide.ConstraintGuide`."""

    walker: CanvasWalker | None          # None: an unconstrained row
    start: int = 0                       # walker tokens committed before this guide (a kept prefix)
    budget: int | None = None            # most tokens the row may commit, its stop token included
    stop: Callable[[], bool] | None = None   # polled each step: True drops the row (caller gone)
    n_frozen: int = 0                    # frozen positions in the current canvas (a prefix)
    forced: int = 0                      # tokens written without a forward pass
    stalled: int = 0                     # consecutive steps without progress
    dead_end: bool = False               # no progress for ``stall_steps`` steps, or nothing allowed
    no_allowed: bool = False             # the grammar allows no token at the frontier: the row was ended
    closing: bool = False                # the row entered its budget-closing window
    must_close: bool = False             # a commit would have left no closing plan in budget: close now
    cut: bool = False                    # dropped by ``stop`` (the output is not a value)
    cut_at: int | None = None            # canvas position of a cut / ended row's EOS, until written
    closing_est: tuple | None = None     # (walker length, closing plan or None): the cached estimate
    plan_hint: int | None = None         # the longest closing plan estimated so far (the first: at the row's start)
    plan_lens: list = field(default_factory=list)  # (committed, plan length) of recent estimates
    search_after: int = 0                # walker length before which no closing search runs (its back-off)
    search_gap: int = 0                  # the back-off's current length in commits
    id: int = 0                          # the row's index in its guide's ``outcome`` numbering
    canvas0: int = 0                     # the batch's canvas index when the row joined it
    lp_top: int | None = None            # record logprobs with this many alternatives (None: none)
    lp: list[TokenLogprob] = field(default_factory=list)   # the entries recorded, one per committed token
    exclusion: Exclusion | None = None   # values this row must not write again (a repair's rejected values)

    @property
    def committed(self) -> int:
        """Tokens this guide committed for the row (EOS included)."""
        return 0 if self.walker is None else len(self.walker.frozen_tokens) - self.start

    @property
    def ended(self) -> bool:
        """Cut, or ended at an empty frontier: the walker takes no more tokens."""
        return self.cut or self.no_allowed


@dataclass(frozen=True)
class RowOutcome:
    """What a row produced: its tokens (a kept prefix included, stop tokens removed), whether a
    stop token ended a complete output, and the guide's flags. ``logprobs`` (when recorded): one
    entry per token this guide committed, stop tokens removed (a kept prefix has none here)."""

    tokens: list[int]
    complete: bool
    dead_end: bool
    forced: int
    closing: bool
    cut: bool = False
    logprobs: list[TokenLogprob] | None = None


class CanvasWrites:
    """What a hook call decides on the host for the step's tensors: positions to freeze (and their
    tokens) and rows whose canvas is done. :meth:`flush` writes them in one transfer and one
    scatter, instead of a small copy per commit; ``done`` stays readable on the host."""

    def __init__(self) -> None:
        self.done: list[bool] = []
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._tokens: list[int] = []
        self._done_changed = False

    def reset(self, n_rows: int) -> None:
        """A new canvas of ``n_rows`` rows: nothing frozen, no row done."""
        self.done = [False] * n_rows
        self._rows, self._cols, self._tokens = [], [], []
        self._done_changed = False

    def freeze(self, b: int, start: int, tokens: list[int]) -> None:
        """Row ``b``'s positions ``start, start + 1, ...`` freeze on ``tokens``."""
        self._rows += [b] * len(tokens)
        self._cols += range(start, start + len(tokens))
        self._tokens += tokens

    def finish(self, b: int) -> None:
        """Row ``b``'s canvas is done."""
        if not self.done[b]:
            self.done[b] = self._done_changed = True

    def flush(self, frozen: torch.Tensor, frozen_tokens: torch.Tensor, done: torch.Tensor) -> None:
        """Writes what was decided since the last flush into the step's tensors."""
        device = frozen.device
        if self._rows:
            ix = torch.tensor([self._rows, self._cols, self._tokens], dtype=torch.long)
            if device.type == "cuda":
                ix = ix.pin_memory()
            ix = ix.to(device, non_blocking=True)
            frozen.index_put_((ix[0], ix[1]), torch.ones((), dtype=torch.bool, device=device))
            frozen_tokens.index_put_((ix[0], ix[1]), ix[2].to(frozen_tokens.dtype))
            self._rows, self._cols, self._tokens = [], [], []
        if self._done_changed:
            done.copy_(torch.tensor(self.done, dtype=torch.bool).to(device, non_blocking=True))
            self._done_changed = False
