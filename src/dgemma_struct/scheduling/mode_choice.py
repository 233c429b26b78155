"""Load-aware mode choice: diffusion and AR share the weights, and which gives more finished rows
per second depends on how many rows run together (DiffusionGemma's report puts the crossover near 32
concurrent requests on an H100; on a small CPU model it comes much earlier). A
:class:`ModeChooser` measures both as they run and picks, for each new batch, the mode with the
higher rate at the current load.

Load levels are powers of two of the rows running (1, 2-3, 4-7, ...). A level where a mode has not
run for ``min_seconds`` yet is explored first (diffusion before AR), so every choice is made from
measurements taken on this machine, with this model, in this process.

Example::

    >>> c = ModeChooser(min_seconds=0.0)
    >>> c.record("diffusion", rows=8, seconds=1.0, finished=8)
    >>> c.record("ar", rows=8, seconds=1.0, finished=20)
    >>> c.pick(load=8)
    'ar'
"""
from __future__ import annotations

from dgemma_struct.prompts import MODES

__all__ = ["ModeChooser", "MODES"]


class ModeChooser:
    """Finished rows per second, per mode and load level; see the module docstring."""

    def __init__(self, *, min_seconds: float = 2.0):
        self.min_seconds = min_seconds
        self.seen: dict[tuple[str, int], list[float]] = {}   # (mode, level) -> [finished rows, seconds]
        self.picks = {m: 0 for m in MODES}

    @staticmethod
    def level(rows: int) -> int:
        """The load level of ``rows`` running rows (0 for none, then 1, 2, 3, ... per doubling)."""
        return max(0, int(rows)).bit_length()

    def record(self, mode: str, *, rows: int, seconds: float, finished: int) -> None:
        """One step of a ``mode`` batch of ``rows`` rows took ``seconds`` and finished ``finished``."""
        acc = self.seen.setdefault((mode, self.level(rows)), [0.0, 0.0])
        acc[0] += finished
        acc[1] += seconds

    def rate(self, mode: str, load: int) -> float | None:
        """Finished rows per second of ``mode`` at ``load`` rows (``None``: not measured enough)."""
        acc = self.seen.get((mode, self.level(load)))
        if acc is None or acc[1] < self.min_seconds or acc[1] <= 0:
            return None
        return acc[0] / acc[1]

    def pick(self, load: int) -> str:
        """The mode for a new batch when ``load`` rows will run."""
        rates = {m: self.rate(m, load) for m in MODES}
        missing = [m for m in MODES if rates[m] is None]
        mode = missing[0] if missing else max(MODES, key=lambda m: rates[m])
        self.picks[mode] += 1
        return mode

    def summary(self) -> dict[str, dict[str, float]]:
        """``{mode: {level: rows/s}}`` of what was measured (for stats endpoints)."""
        out: dict[str, dict[str, float]] = {m: {} for m in MODES}
        for (mode, lv), (done, secs) in sorted(self.seen.items()):
            if secs > 0:
                out[mode][str(lv)] = round(done / secs, 3)
        return out
