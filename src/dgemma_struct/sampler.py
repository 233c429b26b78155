"""Sampling pieces of the diffusion loop: temperature schedule, entropy-bound acceptance,
renoising and the stable-and-confident stopping rule.

They compute exactly what transformers' ``EntropyBoundSampler``,
``LinearTemperatureScheduleLogitsProcessor`` and ``StableAndConfidentStoppingCriteria`` compute,
drawing from torch's global RNG in the same order, so an unconstrained run reproduces
``model.generate`` token for token. Unlike transformers they work on *masked* logits (``-inf`` on
forbidden tokens), where ``Categorical(logits=...).entropy()`` is still well defined.

Example::

    >>> import torch
    >>> from dgemma_struct.sampler import entropy_bound_accept
    >>> logits = torch.tensor([[[9.0, 0.0], [0.0, 0.0]]])
    >>> entropy_bound_accept(logits, entropy_bound=0.1).tolist()
    [[True, False]]
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DiffusionSettings:
    """Denoising settings, read from the checkpoint's generation config by default."""

    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005

    @classmethod
    def from_generation_config(cls, gc) -> "DiffusionSettings":
        defaults = cls()
        sc = getattr(gc, "sampler_config", None)
        return cls(
            max_denoising_steps=gc.max_denoising_steps or defaults.max_denoising_steps,
            entropy_bound=sc.entropy_bound if sc is not None else defaults.entropy_bound,
            t_min=gc.t_min if gc.t_min is not None else defaults.t_min,
            t_max=gc.t_max if gc.t_max is not None else defaults.t_max,
            stability_threshold=(gc.stability_threshold if gc.stability_threshold is not None
                                 else defaults.stability_threshold),
            confidence_threshold=(gc.confidence_threshold if gc.confidence_threshold is not None
                                  else defaults.confidence_threshold),
        )


def temperature(settings: DiffusionSettings, cur_step: int) -> float:
    """Linear schedule: ``t_max`` at the first step (cur_step = N), towards ``t_min`` at the last."""
    return settings.t_min + (settings.t_max - settings.t_min) * (cur_step / settings.max_denoising_steps)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    return torch.distributions.Categorical(logits=logits).entropy()


def entropy_bound_accept(logits: torch.Tensor, entropy_bound: float,
                         entropy: torch.Tensor | None = None) -> torch.Tensor:
    """Accept the k lowest-entropy positions with ``sum(H) - max(H) <= entropy_bound``."""
    ent = token_entropy(logits) if entropy is None else entropy
    sorted_ent, order = torch.sort(ent, dim=-1, descending=False)
    selected = (torch.cumsum(sorted_ent, dim=-1) - sorted_ent) <= entropy_bound
    return torch.scatter(torch.zeros_like(selected), dim=-1, index=order, src=selected)


def random_canvas(batch_size: int, canvas_length: int, vocab_size: int, device) -> torch.Tensor:
    return torch.randint(low=0, high=vocab_size, size=(batch_size, canvas_length), device=device)


def sample_tokens(logits: torch.Tensor) -> torch.Tensor:
    """One multinomial draw per position from ``softmax(logits)`` (float32), as transformers does."""
    B, L, V = logits.shape
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return torch.multinomial(probs.view(-1, V), num_samples=1).squeeze(-1).view(B, L)


class StableAndConfident:
    """Stop a row when its argmax canvas was unchanged for ``stability_threshold`` steps and the
    mean token entropy is below ``confidence_threshold``."""

    def __init__(self, stability_threshold: int, confidence_threshold: float):
        self.stability_threshold = stability_threshold
        self.confidence_threshold = confidence_threshold
        self.history: torch.Tensor | None = None

    def reset(self) -> None:
        self.history = None

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor,
                 entropy: torch.Tensor | None = None) -> torch.Tensor:
        if self.stability_threshold == 0:
            stable = torch.ones(logits.shape[0], device=logits.device, dtype=torch.bool)
        else:
            if self.history is None:
                self.history = torch.full((self.stability_threshold, *argmax.shape), -1, dtype=argmax.dtype,
                                          device=argmax.device)
            stable = (self.history == argmax[None]).all(dim=-1).all(dim=0)
            self.history = torch.roll(self.history, shifts=-1, dims=0)
            self.history[-1] = argmax
        ent = token_entropy(logits) if entropy is None else entropy
        return stable & (ent.mean(dim=-1) < self.confidence_threshold)
