"""Per-request model and constraint time on the continuous path. The scheduler runs many rows in
one canvas; :class:`RowClock` reads each running batch's clock around every scheduler step and
gives each row its share (the batch's time divided by its rows), summed over the request's rows
(repairs and the AR fallback included). :func:`fill_stats` writes the sums into a result's stats
where the scheduler left them at 0, so ``dgemma_stats`` reports ``model_s``, ``mask_s``,
``other_s`` and ``denoising_steps`` on every path.

Example::

    from types import SimpleNamespace
    from dgemma_struct.results import GenerationStats
    job = SimpleNamespace(model_s=0.2, mask_s=0.05)
    res = SimpleNamespace(stats=GenerationStats(forward_passes=6, wall_s=0.5))
    fill_stats(job, res)
    assert res.stats.model_s == 0.2 and res.stats.denoising_steps == 6
"""
from __future__ import annotations

from typing import Any

__all__ = ["RowClock", "fill_stats"]


def _clock(canvas: Any) -> Any:
    """The clock of a diffusion canvas batch (``run.clock``) or an AR batch (``clock``)."""
    run = getattr(canvas, "run", None)
    return getattr(run, "clock", None) if run is not None else getattr(canvas, "clock", None)


class RowClock:
    """Snapshots before a scheduler step, shares after it."""

    @staticmethod
    def admit(sched: Any) -> list[tuple[Any, Any]]:
        """Admit the waiting rows now (what ``sched.step()`` does first; it then admits nothing
        more), so the snapshot covers the canvas they run in. ``[]`` for a scheduler without it."""
        admit = getattr(sched, "admit", None)
        return admit() if admit is not None else []

    @staticmethod
    def before(sched: Any) -> list[tuple[Any, float, float, list[Any]]]:
        snap = []
        for b in getattr(sched, "batches", ()):
            clock = _clock(b.canvas)
            jobs = [r.tag for r in b.rows.values() if r.tag is not None]
            if clock is not None and jobs:
                snap.append((clock, clock.model_s, clock.hook_s, jobs))
        return snap

    @staticmethod
    def after(snap: list[tuple[Any, float, float, list[Any]]]) -> None:
        for clock, m0, h0, jobs in snap:
            dm, dh = (clock.model_s - m0) / len(jobs), (clock.hook_s - h0) / len(jobs)
            for job in jobs:
                job.model_s += max(0.0, dm)
                job.mask_s += max(0.0, dh)


def fill_stats(job: Any, res: Any) -> None:
    """Fill the zero time fields of ``res.stats`` from ``job``'s shares; a diffusion row's
    denoising steps are its forward passes (one forward per step)."""
    s = getattr(res, "stats", None)
    if s is None:
        return
    if not s.model_s and job.model_s:
        s.model_s = job.model_s
        s.other_s = max(0.0, s.wall_s - s.model_s)
    if not s.mask_s and job.mask_s:
        s.mask_s = job.mask_s
    if not s.denoising_steps and (getattr(s, "mode", "diffusion") or "diffusion") == "diffusion":
        s.denoising_steps = s.forward_passes
