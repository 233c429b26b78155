"""The fine-tuning recipe of :func:`~dgemma_struct.training.train.train`: the learning-rate schedule,
the corpus mix, the start checkpoint, and the diffusion objective's knobs.

Why the diffusion decoder learns the copy skill slower than the AR head (issue #33): one encoder
pass gives the AR loss on every answer token, but the decoder sees one 32-token block of the
answer at one noise rate, so it gets a fraction of the signal per batch; half of that signal is at
low noise, where a block is mostly clean and neighbours give the answer away, while inference
starts from an all-random canvas and commits its first tokens at the highest noise; and its
self-conditioning logits are raw, while inference feeds back logits divided by a temperature of
0.3-0.8 computed on the previous, noisier canvas; and constrained decoding commits a canvas left
to right (a clean frozen prefix, noise after the frontier), a pattern uniform corruption almost
never shows. :class:`DiffusionRecipe` holds the knobs that address each: several blocks (views)
per encoder pass, a loss weight, noise rates drawn towards 1, self-conditioning as inference does
it, and clean-prefix corruption.

Measured on the shipped checkpoint (``benchmarks/frontier_accuracy.py``): given a clean answer
prefix and a random rest, the decoder names the next token 38-42% of the time where the AR head,
on the same prefix, names it 78-82%. The loss averages over all 32 positions, most of them far
from the frontier and unknowable, so the one position constrained decoding commits next gets
1/32 of the signal. ``frontier`` blocks (clean prefix, *everything* after it random, as the guide
leaves a canvas) and ``frontier_weight`` (an extra loss on the first random position) train that
position directly.

    >>> lr_at(0, 100, lr=1e-3, warmup=10, floor=0.1)
    0.0001
    >>> round(lr_at(100, 100, lr=1e-3, warmup=10, floor=0.1), 6)
    0.0001
    >>> DiffusionRecipe(t_dist="high").draw_t(4, __import__("torch").Generator().manual_seed(0)).shape
    torch.Size([4, 1])
"""
from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # torch is imported where it is used: the CLI reads T_DISTS to build its parser
    import torch

T_DISTS = ("uniform", "high")


def lr_at(step: float, total: float, *, lr: float, warmup: int, floor: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay from ``lr`` to ``floor * lr`` at ``total``.

    >>> lr_at(50, 100, lr=1.0, warmup=0, floor=0.0)
    0.5
    """
    frac = min(1.0, max(0.0, step / total)) if total > 0 else 0.0
    warm = min(1.0, (step + 1) / warmup) if warmup else 1.0
    return lr * warm * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * frac)))


@dataclass(frozen=True)
class DiffusionRecipe:
    """Knobs of the diffusion objective (defaults: the objective the shipped checkpoint was trained with).

    ``views``: blocks denoised per encoder pass (different blocks of the answer when it has several,
    each with its own noise); ``weight``: the diffusion loss's weight against the AR loss;
    ``t_dist``: ``"uniform"`` (t ~ U(0.02, 1)) or ``"high"`` (density rising linearly towards 1,
    where inference commits its first tokens); ``self_condition``: probability of a self-conditioned
    batch; ``sc_like_inference``: the self-conditioning logits come from a noisier canvas (the
    previous step's) and are divided by a temperature drawn from ``sc_temperature``, as the sampler does;
    ``prefix``: probability that a block keeps a clean prefix of random length and only the rest is
    noised, as under constrained decoding (which freezes a canvas left to right); ``frontier``:
    probability that a block keeps a clean prefix of random length and *every* position after it is
    random (the canvas the guide's progress rule decodes from); ``frontier_weight``: weight of an
    extra loss term, the cross-entropy at each block's first random position.

    >>> DiffusionRecipe().views
    1
    """

    views: int = 1
    weight: float = 1.0
    t_dist: str = "uniform"
    self_condition: float = 0.5
    sc_like_inference: bool = False
    sc_temperature: tuple[float, float] = (0.3, 0.8)
    prefix: float = 0.0
    frontier: float = 0.0
    frontier_weight: float = 0.0

    def __post_init__(self) -> None:
        from dgemma_struct.errors import InvalidRequestError

        if self.t_dist not in T_DISTS:
            raise InvalidRequestError(f"t_dist must be one of {T_DISTS}, got {self.t_dist!r}")
        if self.views < 1 or self.weight <= 0 or not 0 <= self.self_condition <= 1:
            raise InvalidRequestError("diffusion_views must be >= 1, diffusion_weight > 0, self_condition in [0, 1]")
        if not 0 <= self.frontier <= 1 or self.frontier_weight < 0:
            raise InvalidRequestError("frontier must be in [0, 1] and frontier_weight >= 0")

    def draw_t(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """``n`` noise rates, shape ``[n, 1]``."""
        import torch

        u = torch.rand(n, 1, generator=gen)
        if self.t_dist == "high":
            return 0.02 + 0.98 * u.sqrt()
        return u.clamp_min(0.02)

    def corrupt_mask(self, t: torch.Tensor, shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
        """Which positions of ``shape`` = (rows, L) are replaced by random tokens, given each row's ``t``.

        >>> m = DiffusionRecipe(prefix=1.0).corrupt_mask(__import__("torch").ones(2, 1), (2, 8), None)
        >>> bool(m[:, -1].all())
        True
        """
        import torch

        n, L = shape
        mask = torch.rand(n, L, generator=gen) < t
        if self.prefix:
            keep = torch.randint(0, L, (n, 1), generator=gen)
            on = torch.rand(n, 1, generator=gen) < self.prefix
            mask &= ~(on & (torch.arange(L)[None, :] < keep))
        if self.frontier:
            keep = torch.randint(0, L, (n, 1), generator=gen)
            on = torch.rand(n, 1, generator=gen) < self.frontier
            mask = torch.where(on, torch.arange(L)[None, :] >= keep, mask)
        return mask

    def frontier_loss(self, logits: torch.Tensor, clean: torch.Tensor, noise_mask: torch.Tensor) -> torch.Tensor:
        """``frontier_weight`` times the mean cross-entropy at each row's first random position
        (rows with none are left out; 0 when no row has one).

        >>> import torch
        >>> r = DiffusionRecipe(frontier_weight=2.0)
        >>> logits = torch.zeros(1, 4, 5); logits[0, 2, 3] = 50.0
        >>> float(r.frontier_loss(logits, torch.tensor([[0, 0, 3, 1]]), torch.tensor([[False, False, True, True]])))
        0.0
        """
        import torch
        import torch.nn.functional as F

        # no host read (a sync per view on a GPU): rows without a random position weigh 0
        rows = noise_mask.any(dim=1)
        first = noise_mask.int().argmax(dim=1)
        at = torch.arange(len(first), device=logits.device)
        ce = F.cross_entropy(logits[at, first], clean[at, first], reduction="none")
        return self.frontier_weight * (ce * rows).sum() / rows.sum().clamp_min(1)

    def as_dict(self) -> dict[str, Any]:
        """The recipe as JSON-able settings (for the training meta).

        >>> DiffusionRecipe().as_dict()["t_dist"]
        'uniform'
        """
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def pick_blocks(n_blocks: int, views: int, rng: random.Random) -> list[int]:
    """``views`` block indices: distinct while the answer has enough blocks, then drawn again.

    >>> pick_blocks(1, 3, random.Random(0))
    [0, 0, 0]
    """
    if views == 1:
        return [rng.randrange(n_blocks)]
    first = rng.sample(range(n_blocks), min(views, n_blocks))
    return first + [rng.randrange(n_blocks) for _ in range(views - len(first))]


def self_condition_logits(model, kwargs: dict, noisy: torch.Tensor, recipe: DiffusionRecipe, vocab: int,
                          gen: torch.Generator) -> torch.Tensor:
    """The self-conditioning logits of one view (no gradient): the model's logits on this canvas
    or, with ``sc_like_inference``, on a noisier one, divided by a sampling temperature."""
    import torch

    with torch.no_grad():
        canvas = noisy
        if recipe.sc_like_inference:
            more = torch.rand(noisy.shape, generator=gen).to(noisy.device) < 0.25
            canvas = torch.where(more, torch.randint(0, vocab, noisy.shape, generator=gen).to(noisy.device), noisy)
        logits = model(**{**kwargs, "decoder_input_ids": canvas}).logits.detach()
        if recipe.sc_like_inference:
            lo, hi = recipe.sc_temperature
            temp = lo + (hi - lo) * torch.rand(noisy.shape[0], 1, 1, generator=gen).to(logits.device)
            logits = logits / temp
    return logits


def mixed_corpus(makers: dict[str, Callable], name: str, size: int, seed: int, mix: float,
                 fresh_names: float = 0.0, short_records: float = 0.0, tables: float = 0.0,
                 absent: float = 0.0, phrasings: float = 0.0) -> list[dict]:
    """``size`` examples of corpus ``name``; with ``mix`` > 0 that share of them is the original
    corpus (``makers["default"]``: families, tool calls, short answers, thinking), shuffled in;
    ``fresh_names`` of those original examples name their people with invented names
    (:func:`~dgemma_struct.training.generalise.fresh_names`: its 70 listed names otherwise make a
    copy after any other name fail); ``short_records`` of the corpus are two- or three-field
    records in one sentence that end in a number
    (:func:`~dgemma_struct.training.generalise.short_record_example`); ``tables`` of it are extraction
    records laid out as a Markdown table (:func:`~dgemma_struct.training.generalise.table_record_corpus`);
    ``absent`` of it ask for optional fields the source does not hold
    (:func:`~dgemma_struct.training.generalise.absent_record_corpus`); ``phrasings`` of it are asked for
    by composed instructions (:func:`~dgemma_struct.training.generalise.phrasing_record_corpus`).

    >>> from dgemma_struct.training.corpus import make_corpus
    >>> len(mixed_corpus({"default": make_corpus}, "default", 10, 0, 0.5))
    10
    """
    from dgemma_struct.errors import InvalidRequestError

    if not 0 <= mix < 1:
        raise InvalidRequestError(f"mix must be in [0, 1), got {mix!r}")
    if not 0 <= fresh_names <= 1:
        raise InvalidRequestError(f"fresh_names must be in [0, 1], got {fresh_names!r}")
    from dgemma_struct.training.generalise import (absent_record_corpus, phrasing_record_corpus, short_record_corpus,
                                                   table_record_corpus)

    shares = (("short_records", short_records, short_record_corpus), ("tables", tables, table_record_corpus),
              ("absent", absent, absent_record_corpus), ("phrasings", phrasings, phrasing_record_corpus))
    for i, (what, share, _) in enumerate(shares):  # each extra share leaves room for the main corpus
        before = [n for n, _, _ in shares[:i]]
        if not 0 <= share < 1 - mix - sum(v for _, v, _ in shares[:i]):
            raise InvalidRequestError(f"{what} must be in [0, {' - '.join(['1', 'mix', *before])}), got {share!r}")
    n_orig = round(size * mix)
    extras = [(round(size * share), make) for _, share, make in shares]
    out = makers[name](size - n_orig - sum(n for n, _ in extras), seed=seed)
    for n, make in extras:
        if n:
            out = out + make(n, seed=seed)
    if n_orig:
        orig = makers["default"](n_orig, seed=seed + 1)
        if fresh_names:
            from dgemma_struct.training.generalise import fresh_names as rename

            r = random.Random(f"{seed}:fresh_names")
            orig = [rename(r, e) if r.random() < fresh_names else e for e in orig]
        out = out + orig
    if n_orig or any(n for n, _ in extras):
        random.Random(seed).shuffle(out)
    return out


def load_init(path: str | Path):
    """(tokenizer, model) of the checkpoint to fine-tune; a typed error when it is not one."""
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    from dgemma_struct.errors import ModelLoadError

    path = Path(path)
    if not (path / "config.json").exists():
        raise ModelLoadError(f"init_from: {str(path)!r} holds no checkpoint (config.json)")
    return AutoTokenizer.from_pretrained(path), DiffusionGemmaForBlockDiffusion.from_pretrained(path)


def embedded_path() -> Path:
    """Where the shipped checkpoint lives (``init_from="embedded"`` means this).

    >>> (embedded_path() / "config.json").exists()
    True
    """
    import dgemma_struct.embedded as emb

    return Path(emb.__file__).parent
