"""The per-step hook through which the constraint layer steers the canvas loop.

The loop calls, for every canvas: ``start_canvas`` once, then per denoising step ``mask_logits``
(edit ``view.logits`` in place) and ``accept`` (edit ``view.accept``, ``view.sample``,
``view.frozen``, ``view.frozen_tokens``, ``view.done``), then ``finish_canvas`` which returns the
tokens to commit. Frozen positions are enforced by the loop: their logits become one-hot on the
frozen token (so the entropy-bound sampler re-accepts them at zero entropy), they are never
renoised, and their token is what the canvas commits. In AR mode, ``mask_ar_logits`` sees one row
of logits per sequence and ``ar_token`` the chosen tokens. Without a hook the loops run a
:class:`NullHook` (and the diffusion loop then steps every row as ``model.generate`` does).

Example (a hook that forbids token 7 everywhere)::

    class NoSeven(NullHook):
        def mask_logits(self, view):
            view.logits[..., 7] = float("-inf")
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class StepView:
    """What a hook sees and may edit at one denoising step. Shapes: B rows, L canvas positions."""

    canvas_index: int
    step: int                    # steps remaining, N..1 (as transformers counts)
    max_steps: int
    logits: torch.Tensor         # [B, L, V] temperature-scaled logits (editable in place)
    canvas: torch.Tensor         # [B, L] the noisy canvas fed to this step's forward
    frozen: torch.Tensor         # [B, L] bool: committed positions (editable)
    frozen_tokens: torch.Tensor  # [B, L] long: their tokens (editable)
    done: torch.Tensor           # [B] bool: the hook declares the row's canvas finished (editable)
    sample: torch.Tensor | None = None   # [B, L] denoiser sample (editable in ``accept``)
    argmax: torch.Tensor | None = None   # [B, L] argmax of the (masked) logits
    accept: torch.Tensor | None = None   # [B, L] bool: the sampler's acceptances (editable)
    active: torch.Tensor | None = None   # [B] bool: rows still denoising (at the canvas end: still generating)
    # [B, L] bool a hook may set in ``mask_logits``: positions that need a sample even when the
    # sampler does not accept them (the guide's frontier). With per-row generators the loop draws
    # only at accepted positions and these; ``sample`` holds the argmax elsewhere.
    sample_at: torch.Tensor | None = None
    # [B, L] argmax of ``logits`` before ``mask_logits`` (frozen positions one-hot already), and
    # ``touched``: [B, L] bool a hook may set to the positions whose logits it changed; then the
    # loop re-takes the argmax only there (``None``: the loop assumes any position may have changed)
    draft: torch.Tensor | None = None
    touched: torch.Tensor | None = None
    # Host-side hints (plain Python, so the loop needs no host read of a device tensor). The loop
    # sets ``active_rows`` (``active`` on the host) and ``accept_rows`` (``accept`` on the host,
    # before ``accept`` is called). A hook may set: ``frozen_upto`` (row b's frozen positions are
    # exactly ``0..frozen_upto[b]-1``), ``done_rows`` (``done`` on the host), ``touched_spans``
    # (``(row, start, end)``: the only positions whose logits ``mask_logits`` changed; replaces
    # ``touched``) and ``sample_at_pos`` (``(row, position)`` pairs; replaces ``sample_at``).
    active_rows: list[bool] | None = None
    accept_rows: list[list[bool]] | None = None
    frozen_upto: list[int] | None = None
    done_rows: list[bool] | None = None
    touched_spans: list[tuple[int, int, int]] | None = None
    sample_at_pos: list[tuple[int, int]] | None = None


@runtime_checkable
class StepHook(Protocol):
    def start_canvas(self, view: StepView) -> None: ...

    def mask_logits(self, view: StepView) -> None: ...

    def accept(self, view: StepView) -> None: ...

    def finish_canvas(self, view: StepView, committed: torch.Tensor) -> torch.Tensor: ...

    def mask_ar_logits(self, logits: torch.Tensor, active: torch.Tensor) -> None: ...

    def ar_token(self, tokens: torch.Tensor, active: torch.Tensor) -> None: ...


class NullHook:
    """A hook that changes nothing; subclass it and override what you need."""

    def start_canvas(self, view: StepView) -> None:
        pass

    def mask_logits(self, view: StepView) -> None:
        pass

    def accept(self, view: StepView) -> None:
        pass

    def finish_canvas(self, view: StepView, committed: torch.Tensor) -> torch.Tensor:
        return committed

    def mask_ar_logits(self, logits: torch.Tensor, active: torch.Tensor) -> None:
        pass

    def ar_token(self, tokens: torch.Tensor, active: torch.Tensor) -> None:
        pass
