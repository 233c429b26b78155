"""A cheap, low-variance check of the diffusion decoder during a run: its loss on held-out
extraction answers at a fixed noise rate (1.0 is the all-random canvas inference starts from),
alongside the AR loss of the same encoder pass. Used for the fine-tuning ablation (issue #33).

    >>> from dgemma_struct.training.recipe import embedded_path, load_init
    >>> tok, model = load_init(embedded_path())
    >>> out = probe_losses(model, tok, n=2, noise=(1.0,))
    >>> sorted(out)
    ['ar', 'diffusion@1.0']
"""
from __future__ import annotations

import random

import torch

from dgemma_struct.training.generalise import EVAL_SEED, EVAL_SPLITS, eval_examples
from dgemma_struct.training.train import encode_example, loss_on_batch, make_batch


def probe_losses(model, tokenizer, n: int = 16, noise: tuple[float, ...] = (1.0, 0.5), seed: int = EVAL_SEED,
                 batch_size: int = 16) -> dict[str, float]:
    """Mean AR loss and diffusion loss at each rate in ``noise`` over ``n`` examples of each
    evaluation split (no self-conditioning; every block of each answer once)."""
    examples = [e for s in EVAL_SPLITS for e in eval_examples(n, seed=seed)[s]]
    encoded = [encode_example(tokenizer, e) for e in examples]
    L, V = model.config.canvas_length, model.config.text_config.vocab_size
    sums: dict[str, list[float]] = {"ar": []} | {f"diffusion@{t}": [] for t in noise}
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for t in noise:
            gen = torch.Generator().manual_seed(seed)
            for i in range(0, len(encoded), batch_size):
                batch = make_batch(encoded[i:i + batch_size], L, V, gen, random.Random(seed + i))
                noisy = torch.randint(0, V, batch["clean"].shape, generator=gen)
                keep = torch.rand(batch["clean"].shape, generator=gen) >= t
                batch["noisy"] = torch.where(keep, batch["clean"], noisy)
                diff, ar = loss_on_batch(model, batch, False)
                sums[f"diffusion@{t}"].append(diff.item())
                if t == noise[0]:
                    sums["ar"].append(ar.item())
    model.train(was_training)
    return {k: round(sum(v) / len(v), 4) for k, v in sums.items()}
