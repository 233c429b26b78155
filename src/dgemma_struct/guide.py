"""``ConstraintGuide``: the step hook that makes a canvas obey a constraint.

Per row it keeps a :class:`~dgemma_struct.constraints.CanvasWalker` whose state is exact after the
frozen prefix. At every denoising step:

1. **Masks.** The draft (argmax canvas) is walked from the frontier; every position up to and
   including the first violation gets its exact allowed-token mask.
2. **Commit rule.** A position freezes when the sampler accepts it and every position before it
   is frozen or accepted-and-valid; frozen tokens are consumed by the matcher, never renoised.
3. **Progress rule** (``progress=True``): the frontier is accepted each step, sampled from its
   exact mask, so the entropy-bound sampler cannot stall it by accepting tail positions first.
4. **Forced tokens.** When the grammar forces a continuation (keys, braces, enum tails, EOS when
   it is the only option) those tokens are written and frozen with no forward pass.
5. **Termination.** After EOS the rest of the canvas is pad; when a canvas stops with unfrozen
   positions, they are filled by a masked greedy walk over the last logits (no extra forward).

Example::

    guide = ConstraintGuide([constraint.canvas_walker()], pad_token_id=0)
    runtime.generate(prompt, hook=guide)
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from dgemma_struct.constraints import CanvasWalker
from dgemma_struct.errors import GenerationTimeout
from dgemma_struct.hooks import StepView
from dgemma_struct.kernels import apply_token_bitmask_


class ConstraintGuide:
    """Constrains each batch row with its own walker (``None`` = unconstrained row)."""

    def __init__(self, walkers: Sequence[CanvasWalker | None], *, pad_token_id: int, progress: bool = True,
                 force_tokens: bool = True, renoise_invalid: bool = False, stall_steps: int = 8,
                 deadline: float | None = None):
        self.walkers = list(walkers)
        self.pad = pad_token_id
        self.progress = progress
        self.force_tokens = force_tokens
        self.renoise_invalid = renoise_invalid
        self.stall_steps = stall_steps
        self.deadline = deadline     # time.monotonic() value after which the run is abandoned
        B = len(self.walkers)
        self.start = [len(w.frozen_tokens) if w is not None else 0 for w in self.walkers]
        self.forced = [0] * B        # tokens written without a forward pass
        self.stalled = [0] * B       # consecutive steps without progress
        self.dead_end = [False] * B  # the walk made no progress for ``stall_steps`` steps
        self.mask_s = 0.0
        self._n_frozen = [0] * B     # frozen positions in the current canvas (a prefix)
        self._masked_rows: list[int] = []

    # ------------------------------------------------------------------ helpers
    def generated(self, row: int) -> list[int]:
        """Tokens this guide committed for ``row`` (EOS included when reached)."""
        w = self.walkers[row]
        return [] if w is None else w.frozen_tokens[self.start[row]:]

    def _freeze(self, view: StepView, b: int, tokens: list[int]) -> None:
        """Commit ``tokens`` at the frontier of row ``b`` and freeze them; after EOS, pad."""
        w = self.walkers[b]
        f = self._n_frozen[b]
        L = view.frozen.shape[1]
        tokens = tokens[: L - f]
        if not tokens:
            return
        w.commit(tokens)
        view.frozen[b, f:f + len(tokens)] = True
        view.frozen_tokens[b, f:f + len(tokens)] = torch.tensor(tokens, dtype=view.frozen_tokens.dtype)
        f += len(tokens)
        self._n_frozen[b] = f
        if w.frozen_tokens and w.frozen_tokens[-1] in w.stop_token_ids:
            view.frozen[b, f:] = True
            view.frozen_tokens[b, f:] = self.pad
            self._n_frozen[b] = L
        if self._n_frozen[b] >= L:
            view.done[b] = True

    def _apply_forced(self, view: StepView, b: int) -> None:
        if not self.force_tokens:
            return
        w = self.walkers[b]
        L = view.frozen.shape[1]
        while self._n_frozen[b] < L:
            forced = w.forced_tokens(L - self._n_frozen[b])
            if not forced:
                return
            self.forced[b] += len(forced)
            self._freeze(view, b, forced)

    # ------------------------------------------------------------------ hook
    def start_canvas(self, view: StepView) -> None:
        t0 = time.perf_counter()
        B, _ = view.frozen.shape
        self._n_frozen = [0] * B
        for b, w in enumerate(self.walkers):
            if w is None or not bool(view.active[b]):
                continue
            self._apply_forced(view, b)
        self.mask_s += time.perf_counter() - t0

    def mask_logits(self, view: StepView) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise GenerationTimeout("generation exceeded its timeout")
        t0 = time.perf_counter()
        logits = view.logits
        B, L, V = logits.shape
        draft = logits.argmax(dim=-1)
        rows, masks = [], []
        for b, w in enumerate(self.walkers):
            f = self._n_frozen[b]
            if w is None or f >= L or bool(view.done[b]):
                continue
            res = w.walk(draft[b, f:].tolist())
            n = min(res.n_valid + 1, L - f)
            rows.extend(b * L + f + i for i in range(n))
            masks.append(res.bitmasks[:n])
        if rows:
            apply_token_bitmask_(logits.view(B * L, V), np.concatenate(masks, axis=0),
                                 indices=torch.tensor(rows, dtype=torch.long, device=logits.device))
        self.mask_s += time.perf_counter() - t0

    def accept(self, view: StepView) -> None:
        t0 = time.perf_counter()
        L = view.frozen.shape[1]
        sample, accept = view.sample, view.accept
        for b, w in enumerate(self.walkers):
            f = self._n_frozen[b]
            if w is None or f >= L or bool(view.done[b]) or not bool(view.active[b]):
                continue
            # the run of accepted positions from the frontier (the frontier itself under the progress rule)
            acc = accept[b, f:].tolist()
            if self.progress:
                acc[0] = True
            k = next((i for i, a in enumerate(acc) if not a), len(acc))
            if k == 0:
                self._stall(b)
                continue
            run = sample[b, f:f + k].tolist()
            res = w.walk(run)
            if res.n_valid == 0:
                self._stall(b)
                continue
            self.stalled[b] = 0
            self._freeze(view, b, run[:res.n_valid])
            self._apply_forced(view, b)
            if self.renoise_invalid:
                view.accept[b, self._n_frozen[b]:] = False
        self.mask_s += time.perf_counter() - t0

    def _stall(self, b: int) -> None:
        self.stalled[b] += 1
        if self.stalled[b] >= self.stall_steps:
            self.dead_end[b] = True

    def finish_canvas(self, view: StepView, committed: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        L = view.frozen.shape[1]
        out = committed.clone()
        for b, w in enumerate(self.walkers):
            if w is None:
                continue
            f = self._n_frozen[b]
            if f < L and bool(view.active[b]) and view.logits.numel():
                fill = w.greedy_fill(view.logits[b, f:].float(), L - f)
                if fill:
                    self._freeze(view, b, fill)
                f = self._n_frozen[b]
                if f < L:  # nothing allowed any more (grammar finished without EOS): pad
                    view.frozen[b, f:] = True
                    view.frozen_tokens[b, f:] = self.pad
            out[b] = torch.where(view.frozen[b], view.frozen_tokens[b], out[b])
        self.mask_s += time.perf_counter() - t0
        return out

    # ------------------------------------------------------------------ AR mode
    def mask_ar_logits(self, logits: torch.Tensor, active: torch.Tensor) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise GenerationTimeout("generation exceeded its timeout")
        t0 = time.perf_counter()
        rows, masks = [], []
        for b, w in enumerate(self.walkers):
            if w is None or not bool(active[b]):
                continue
            rows.append(b)
            masks.append(w.mask()[None, :])
        if rows:
            apply_token_bitmask_(logits, np.concatenate(masks, axis=0),
                                 indices=torch.tensor(rows, dtype=torch.long, device=logits.device))
        self.mask_s += time.perf_counter() - t0

    def ar_token(self, tokens: torch.Tensor, active: torch.Tensor) -> None:
        t0 = time.perf_counter()
        for b, w in enumerate(self.walkers):
            if w is not None and bool(active[b]):
                w.commit([int(tokens[b])])
        self.mask_s += time.perf_counter() - t0
