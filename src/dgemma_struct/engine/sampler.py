"""Sampling pieces of the diffusion loop: temperature schedule, entropy-bound acceptance,
renoising and the stable-and-confident stopping rule.

They compute exactly what transformers' ``EntropyBoundSampler``,
``LinearTemperatureScheduleLogitsProcessor`` and ``StableAndConfidentStoppingCriteria`` compute,
drawing from torch's global RNG in the same order, so an unconstrained run reproduces
``model.generate`` token for token. Unlike transformers they work on *masked* logits (``-inf`` on
forbidden tokens), where ``Categorical(logits=...).entropy()`` is still well defined.

Example::

    >>> import torch
    >>> from dgemma_struct.engine.sampler import entropy_bound_accept
    >>> logits = torch.tensor([[[9.0, 0.0], [0.0, 0.0], [0.0, 1.0]]])   # entropies 0.001, 0.693, 0.582
    >>> entropy_bound_accept(logits, entropy_bound=0.1).tolist()   # the highest accepted one is free
    [[True, False, True]]
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import torch

from dgemma_struct.kernels import masked_stats, resolve_backend

#: the SDK's own decoding settings beside a checkpoint's generation config (``guided_entropy_bound``)
CHECKPOINT_SETTINGS_FILE = "dgemma_struct.json"

# positions per entropy chunk, in logit elements: on CPU a chunk's two temporaries stay a few MB
ENTROPY_CHUNK = 1 << 22
ENTROPY_CHUNK_CUDA = 1 << 25


@dataclass(frozen=True)
class DiffusionSettings:
    """Denoising settings, read from the checkpoint's generation config by default.

    ``guided_entropy_bound`` / ``guided_confidence_threshold``: the entropy bound and the stopping
    rule's confidence threshold of the rows a constraint guide commits left to right (``None``: the
    free rows' value). Under the guide a position past the frontier is committed only when
    everything before it is, and the grammar's forced tokens cost no forward, so a lower bound there
    buys accuracy for few forwards; a threshold of 0 never stops a guided canvas early, so the guide
    commits it position by position instead of taking the rest of the draft at once.
    ``guided_greedy``: guided rows take the argmax where the sampler would draw, when the request
    sets no temperature (a row still varies with its seed: the canvas starts from seeded noise).
    A checkpoint sets them in its :data:`CHECKPOINT_SETTINGS_FILE` (transformers' DiffusionGemma
    generation config rejects keys it does not know).

        >>> DiffusionSettings(entropy_bound=1.0, guided_entropy_bound=0.0).bound(guided=True)
        0.0
        >>> DiffusionSettings(confidence_threshold=0.3, guided_confidence_threshold=0.0).confidence(guided=False)
        0.3
    """

    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_threshold: int = 1
    confidence_threshold: float = 0.005
    guided_entropy_bound: float | None = None
    guided_confidence_threshold: float | None = None
    guided_greedy: bool = False

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

    def with_checkpoint_file(self, data: dict) -> "DiffusionSettings":
        """These settings with a checkpoint's :data:`CHECKPOINT_SETTINGS_FILE` applied: the keys
        the generation config cannot hold (transformers' DiffusionGemma config rejects unknown ones).

            >>> DiffusionSettings().with_checkpoint_file({"guided_entropy_bound": 0}).guided_entropy_bound
            0.0
        """
        unknown = set(data) - set(GUIDED_KEYS)
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)} (known: {', '.join(GUIDED_KEYS)})")
        out = {}
        for key in GUIDED_KEYS:
            g = data.get(key, getattr(self, key))
            if key == "guided_greedy":
                if not isinstance(g, bool):
                    raise ValueError(f"{key} must be true or false, got {g!r}")
                out[key] = g
                continue
            number = isinstance(g, (int, float)) and not isinstance(g, bool)
            if g is not None and not (number and math.isfinite(g) and g >= 0):
                raise ValueError(f"{key} must be a number >= 0 or null, got {g!r}")
            out[key] = None if g is None else float(g)
        return dataclasses.replace(self, **out)

    def bound(self, guided: bool) -> float:
        """The entropy bound of a row the guide commits (``guided``) or of a free row."""
        return self.guided_entropy_bound if guided and self.guided_entropy_bound is not None else self.entropy_bound

    def confidence(self, guided: bool) -> float:
        """The stopping rule's confidence threshold of a row the guide commits (``guided``) or of a free row."""
        g = self.guided_confidence_threshold
        return g if guided and g is not None else self.confidence_threshold

    @property
    def guides(self) -> bool:
        """Whether any ``guided_*`` setting is set (else every row decodes alike)."""
        return (self.guided_entropy_bound is not None or self.guided_confidence_threshold is not None
                or self.guided_greedy)

    def for_rows(self, rows: Sequence[bool] | None, like: torch.Tensor, *, greedy: bool = False,
                 temperature_set: bool = False) -> "RowSettings":
        """One step's settings for a batch whose rows ``rows`` a guide commits (``None``: none).
        ``greedy``: the request asked for temperature 0; ``temperature_set``: it set another
        temperature (then ``guided_greedy`` does not apply).

            >>> s = DiffusionSettings(confidence_threshold=0.5, guided_confidence_threshold=0.0, guided_greedy=True)
            >>> r = s.for_rows([True, False], torch.zeros(2, 4))
            >>> r.confidence.tolist(), r.greedy
            ([0.0, 0.5], [True, False])
        """
        rows = list(rows) if rows is not None and any(rows) else None

        def per_row(pick) -> float | torch.Tensor:
            if rows is None or all(rows) or pick(True) == pick(False):
                return pick(bool(rows))
            return torch.tensor([pick(g) for g in rows], dtype=like.dtype, device=like.device)

        bound = per_row(self.bound)
        row_greedy: bool | list[bool] = greedy
        if not greedy and not temperature_set and self.guided_greedy and rows is not None:
            row_greedy = True if all(rows) else rows
        return RowSettings(bound.unsqueeze(-1) if isinstance(bound, torch.Tensor) else bound,
                           per_row(self.confidence), row_greedy)


@dataclass(frozen=True)
class RowSettings:
    """One step's per-row settings: the entropy bound (``[B, 1]`` when rows differ), the stopping
    rule's confidence threshold (``[B]`` when rows differ) and greedy sampling (per row when rows differ)."""

    bound: float | torch.Tensor
    confidence: float | torch.Tensor
    greedy: bool | list[bool]


#: the keys of :data:`CHECKPOINT_SETTINGS_FILE`: settings of the rows a constraint guide commits
GUIDED_KEYS = ("guided_entropy_bound", "guided_confidence_threshold", "guided_greedy")


def temperature(settings: DiffusionSettings, cur_step: int) -> float:
    """Linear schedule: ``t_max`` at the first step (cur_step = N), towards ``t_min`` at the last."""
    return settings.t_min + (settings.t_max - settings.t_min) * (cur_step / settings.max_denoising_steps)


def _entropy(logits: torch.Tensor, scratch: tuple[torch.Tensor, torch.Tensor] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    # Categorical's operations in its order, in place where it allocates: bitwise the same values
    # with two full-vocabulary temporaries instead of four (at vocab 262,144 x canvas 256 each is
    # 268 MB, and allocating them cost more than the arithmetic); ``scratch``: two buffers of at
    # least the logits' shape the temporaries are written into instead (same values)
    lse = logits.logsumexp(dim=-1, keepdim=True)
    if scratch is None:
        norm = logits - lse
        probs = torch.softmax(norm, dim=-1)
    else:
        n = logits.shape[0]
        norm = torch.sub(logits, lse, out=scratch[0][:n])
        probs = torch._softmax(norm, -1, False, out=scratch[1][:n])
    norm.clamp_(min=torch.finfo(norm.dtype).min)
    ent = -probs.mul_(norm).sum(-1)
    return ent, torch.isneginf(lse.squeeze(-1))


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy per position, computed with exactly the operations of
    ``torch.distributions.Categorical(logits=...).entropy()`` (so an unconstrained run reproduces
    transformers bit for bit) but NaN-free: a position whose logits are all ``-inf`` (no allowed
    token) gets entropy 0 instead of NaN, and no argument validation pass is spent."""
    ent, dead = _entropy(logits)
    return torch.where(dead, torch.zeros_like(ent), ent)


def entropy_chunk(logits: torch.Tensor) -> int:
    """Positions per chunk of :func:`entropy_at`: its temporaries stay far below one canvas row."""
    per = ENTROPY_CHUNK_CUDA if logits.is_cuda else ENTROPY_CHUNK
    return max(1, per // max(1, logits.shape[-1]))


def entropy_at(logits: torch.Tensor, starts: Sequence[int | None], backend: str = "torch"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropies of ``[B, L, V]`` logits at positions ``starts[b]..L-1`` of each row (``None``: none
    of the row), 0 elsewhere, and the positions with no finite logit (``dead``, bool ``[B, L]``;
    their entropy is ``log V``, the caller resets their logits: :func:`reset_dead`). Computed in
    chunks of positions (bitwise the values of :func:`step_entropy`: every operation is per
    position), so no temporary comes near the logits' size, and with no host read. ``backend``
    ``"auto"``: on CUDA, where the Triton kernels pass their self-check, the fused masked-statistics
    kernel (one pass per position, no temporaries; equal to the torch values to ~1e-5, not bitwise;
    ``"triton"`` forces it, e.g. under ``TRITON_INTERPRET=1``)."""
    B, L, V = logits.shape
    flat = logits.view(B * L, V)
    ent = torch.zeros(B * L, dtype=logits.dtype, device=logits.device)
    dead = torch.zeros(B * L, dtype=torch.bool, device=logits.device)
    spans: list[list[int]] = []
    for b, s in enumerate(starts):  # runs of positions, merged across rows
        if s is None or s >= L:
            continue
        if spans and spans[-1][1] == b * L + s:
            spans[-1][1] = (b + 1) * L
        else:
            spans.append([b * L + s, (b + 1) * L])
    if backend != "torch" and resolve_backend(backend, logits) == "triton":
        for lo, hi in spans:
            st = masked_stats(flat[lo:hi], backend="triton")
            ent[lo:hi], dead[lo:hi] = st.entropy, torch.isneginf(st.logsumexp)
        return torch.where(dead, torch.full_like(ent, math.log(V)), ent).view(B, L), dead.view(B, L)
    step = entropy_chunk(logits)
    scratch = None
    if spans:  # two chunk-sized buffers for the whole step (far below one canvas row)
        n = min(step, max(hi - lo for lo, hi in spans))
        scratch = (flat.new_empty((n, V)), flat.new_empty((n, V)))
    for lo, hi in spans:
        for i in range(lo, hi, step):
            j = min(hi, i + step)
            ent[i:j], dead[i:j] = _entropy(flat[i:j], scratch)
    ent = torch.where(dead, torch.full_like(ent, math.log(V)), ent)
    return ent.view(B, L), dead.view(B, L)


def reset_dead(logits: torch.Tensor, dead_rows: Sequence[Sequence[bool]]) -> None:
    """Positions with no finite logit (host flags, ``[B][L]``) get uniform logits, in place: the
    loop never carries an empty distribution forward."""
    for b, row in enumerate(dead_rows):
        for p, d in enumerate(row):
            if d:
                logits[b, p] = 0.0


def step_entropy(logits: torch.Tensor) -> torch.Tensor:
    """:func:`token_entropy` for the denoising loop, which must never carry an empty distribution
    forward (the logits also feed the next step's self-conditioning): a position with no finite
    logit is reset **in place** to uniform logits (entropy ``log V``, never accepted first, never
    NaN)."""
    ent, dead = _entropy(logits)
    logits.masked_fill_(dead.unsqueeze(-1), 0.0)
    return torch.where(dead, torch.full_like(ent, math.log(logits.shape[-1])), ent)


def step_entropy_at(logits: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """:func:`step_entropy` computed only at the positions ``need`` (bool ``[B, L]``); 0 elsewhere.
    For a frozen (one-hot) position 0 is exactly what the full computation gives, so the constrained
    loop skips frozen positions and rows that stopped denoising without changing any decision.
    (Reads ``need`` once; the loop itself calls :func:`entropy_at` with positions it knows.)"""
    rows = need.tolist()
    starts = [next((p for p, x in enumerate(r) if x), None) for r in rows]
    ent, dead = entropy_at(logits, starts)
    reset_dead(logits, [[d and x for d, x in zip(dr, nr)] for dr, nr in zip(dead.tolist(), rows)])
    return torch.where(need, ent, torch.zeros_like(ent))


def dead_positions(logits: torch.Tensor) -> torch.Tensor:
    """``[...]`` bool: positions where no token has a finite logit (an empty allowed set)."""
    return torch.isneginf(logits.amax(dim=-1))


def entropy_bound_accept(logits: torch.Tensor, entropy_bound: float | torch.Tensor,
                         entropy: torch.Tensor | None = None) -> torch.Tensor:
    """Accept the k lowest-entropy positions with ``sum(H) - max(H) <= entropy_bound`` (a float,
    or a ``[B, 1]`` tensor: one bound per row)."""
    ent = token_entropy(logits) if entropy is None else entropy
    sorted_ent, order = torch.sort(ent, dim=-1, descending=False)
    selected = (torch.cumsum(sorted_ent, dim=-1) - sorted_ent) <= entropy_bound
    return torch.scatter(torch.zeros_like(selected), dim=-1, index=order, src=selected)


def random_canvas(batch_size: int, canvas_length: int, vocab_size: int, device,
                  generators: Sequence[torch.Generator | None] | None = None,
                  rows: torch.Tensor | Sequence[bool] | None = None) -> torch.Tensor:
    """Uniform noise tokens. With ``generators`` (one per row) each row draws from its own
    generator, and only the rows in ``rows`` (bool ``[B]``, a tensor or host flags) draw at all
    (the others get 0): a row's draws then do not depend on which other rows share its batch."""
    if generators is None:
        return torch.randint(low=0, high=vocab_size, size=(batch_size, canvas_length), device=device)
    if isinstance(rows, torch.Tensor):
        rows = rows.tolist()
    out = torch.zeros((batch_size, canvas_length), dtype=torch.long, device=device)
    for b, g in enumerate(generators):
        if rows is None or rows[b]:
            torch.randint(low=0, high=vocab_size, size=(canvas_length,), device=device, generator=g, out=out[b])
    return out


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering on ``[N, V]`` logits: keep the smallest set of tokens whose probability
    reaches ``top_p`` (always at least the most likely one); the rest become ``-inf``."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1, dtype=torch.float32)
    drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p   # mass strictly before this token
    drop[..., 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def sample_tokens(logits: torch.Tensor) -> torch.Tensor:
    """One multinomial draw per position from ``softmax(logits)`` (float32), as transformers does."""
    B, L, V = logits.shape
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return torch.multinomial(probs.view(-1, V), num_samples=1).squeeze(-1).view(B, L)


def sample_rows(logits: torch.Tensor, *, fill: torch.Tensor, where: torch.Tensor,
                generators: Sequence[torch.Generator | None], scale: float = 1.0, top_p: float = 1.0,
                greedy: bool = False) -> torch.Tensor:
    """Draws tokens only at the positions ``where`` (bool ``[B, L]``), each row from its own
    generator; elsewhere the result is ``fill``. ``scale`` divides the logits (the user
    temperature on top of the schedule), ``top_p`` filters them, ``greedy`` takes the argmax.
    Positions with no finite logit draw nothing (they keep ``fill``): never NaN. (Reads ``where``
    once; :func:`sample_at` takes the positions from the host.)"""
    positions = [[p for p, x in enumerate(r) if x] for r in where.tolist()]
    return sample_at(logits, fill=fill, positions=positions, generators=generators, scale=scale, top_p=top_p,
                     greedy=greedy)


def sample_at(logits: torch.Tensor, *, fill: torch.Tensor, positions: Sequence[Sequence[int]],
              generators: Sequence[torch.Generator | None], scale: float = 1.0, top_p: float = 1.0,
              greedy: bool | Sequence[bool] = False) -> torch.Tensor:
    """:func:`sample_rows` with the positions given per row on the host (ascending): one index
    transfer, no host read; a row draws exactly what :func:`sample_rows` draws for it. ``greedy``:
    for every row, or per row."""
    out = fill.clone()
    flat = [p for ps in positions for p in ps]
    if not flat:
        return out
    index = torch.tensor(flat, dtype=torch.long)
    if logits.is_cuda:
        index = index.pin_memory().to(logits.device, non_blocking=True)
    at = 0
    for b, ps in enumerate(positions):
        if not ps:
            continue
        idx = index[at:at + len(ps)]
        at += len(ps)
        rows = logits[b].index_select(0, idx)
        live = ~torch.isneginf(rows.amax(dim=-1))
        rows.masked_fill_(~live.unsqueeze(-1), 0.0)   # an empty distribution never reaches multinomial
        if greedy if isinstance(greedy, bool) else greedy[b]:
            drawn = rows.argmax(dim=-1)
        else:
            if scale != 1.0:
                rows = rows / scale
            rows = top_p_filter(rows, top_p)
            probs = torch.softmax(rows, dim=-1, dtype=torch.float32)
            drawn = torch.multinomial(probs, num_samples=1, generator=generators[b]).squeeze(-1)
        out[b].index_copy_(0, idx, torch.where(live, drawn, out[b].index_select(0, idx)))
    return out


class StableAndConfident:
    """Stop a row when its argmax canvas was unchanged for ``stability_threshold`` steps and the
    mean token entropy is below ``confidence_threshold``."""

    def __init__(self, stability_threshold: int, confidence_threshold: float):
        self.stability_threshold = stability_threshold
        self.confidence_threshold = confidence_threshold
        self.history: torch.Tensor | None = None

    def reset(self) -> None:
        self.history = None

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor, entropy: torch.Tensor | None = None,
                 confidence_threshold: float | torch.Tensor | None = None) -> torch.Tensor:
        """Per row, whether it stops. ``confidence_threshold``: this step's threshold instead of
        the one given at construction (a float, or a ``[B]`` tensor: one per row)."""
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
        limit = self.confidence_threshold if confidence_threshold is None else confidence_threshold
        return stable & (ent.mean(dim=-1) < limit)
