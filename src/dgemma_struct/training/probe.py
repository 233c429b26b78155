"""Cheap, low-variance checks of the diffusion decoder during a run (issue #33):

- :func:`probe_losses`: its loss on held-out extraction answers at a fixed noise rate (1.0 is the
  all-random canvas inference starts from), alongside the AR loss of the same encoder pass;
- :func:`frontier_accuracy`: teacher-forced next-token accuracy, the AR head against the decoder
  at the frontier of a canvas whose prefix is the clean answer and whose rest is random, which is
  the canvas the constraint guide decodes from (it freezes left to right and renoises the rest).

    >>> from dgemma_struct.training.recipe import embedded_path, load_init
    >>> tok, model = load_init(embedded_path())
    >>> out = probe_losses(model, tok, n=2, noise=(1.0,))
    >>> sorted(out)
    ['ar', 'diffusion@1.0']
    >>> sorted(frontier_accuracy(model, tok, n=1)["held_out_families"])
    ['ar', 'diffusion_all_random', 'diffusion_frontier', 'tokens']
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


def frontier_accuracy(model, tokenizer, n: int = 20, seed: int = EVAL_SEED) -> dict[str, dict[str, float]]:
    """Per evaluation split, over the first canvas of each of ``n`` answers, the share of answer
    positions ``k`` whose token is the argmax of: the AR head after the prompt and ``answer[:k]``
    (``ar``); the decoder on a canvas holding ``answer[:k]`` then uniform-random tokens, at
    position ``k`` (``diffusion_frontier``); the decoder on an all-random canvas, at every position
    (``diffusion_all_random``). One random draw per example, seeded, so checkpoints compare on the
    same canvases."""
    from transformers import DynamicCache

    from dgemma_struct.training.train import softcapped_logits

    L, V = model.config.canvas_length, model.config.text_config.vocab_size
    was_training = model.training
    model.eval()
    out: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for split, examples in eval_examples(n, seed=seed).items():
            hits = {"ar": 0, "diffusion_frontier": 0, "diffusion_all_random": 0}
            total = 0
            for i, e in enumerate(examples):
                prompt, answer = encode_example(tokenizer, e)
                answer = answer[:L]
                K = len(answer)
                gen = torch.Generator().manual_seed(seed + i)
                batch = make_batch([(prompt, answer)] * K, L, V, gen, random.Random(seed + i))
                want = torch.tensor(answer)
                rand = torch.randint(0, V, (K, L), generator=gen)
                canvas = torch.where(torch.arange(L)[None, :] < torch.arange(K)[:, None], batch["clean"], rand)
                # one encoder pass for the K canvases: they share the prompt and the answer
                cache = DynamicCache(config=model.config.get_text_config(decoder=True))
                enc = model.model.encoder(input_ids=batch["ids"][:1], attention_mask=batch["attn"][:1],
                                          past_key_values=cache)
                T = batch["ids"].shape[1]
                ar = softcapped_logits(model, enc.last_hidden_state[:, T - 1 - K:T - 1])[0].argmax(-1)
                cache.batch_repeat_interleave(K)
                kw = dict(past_key_values=cache, decoder_attention_mask=batch["dec_mask"],
                          decoder_position_ids=batch["dec_pos"])
                front = model(decoder_input_ids=canvas, **kw).logits.argmax(-1)
                everywhere = model(decoder_input_ids=rand, **kw).logits[0, :K].argmax(-1)
                hits["ar"] += int((ar == want).sum())
                hits["diffusion_frontier"] += int((front[torch.arange(K), torch.arange(K)] == want).sum())
                hits["diffusion_all_random"] += int((everywhere == want).sum())
                total += K
            out[split] = {k: round(v / max(1, total), 4) for k, v in hits.items()} | {"tokens": total}
    model.train(was_training)
    return out
