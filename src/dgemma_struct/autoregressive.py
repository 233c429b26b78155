"""The left-to-right loop on the DiffusionGemma weights: the ``mode="ar"`` of the runtime and the
constrained API's fallback."""
from __future__ import annotations

from typing import Sequence

import torch

from dgemma_struct.canvas import LoopOutput
from dgemma_struct.forward import Clock, encode, softcapped_logits
from dgemma_struct.hooks import NullHook, StepHook
from dgemma_struct.sampler import sample_rows, top_p_filter


def _choose(logits: torch.Tensor, finished: torch.Tensor, *, temperature: float | None, top_p: float,
            generators: Sequence[torch.Generator] | None) -> torch.Tensor:
    """One token per row: greedy for ``temperature`` 0/``None``, else a draw (per-row generators
    draw only for unfinished rows)."""
    if temperature and generators is not None:
        return sample_rows(logits[:, None], fill=torch.argmax(logits, dim=-1)[:, None], where=~finished[:, None],
                           generators=generators, scale=temperature, top_p=top_p)[:, 0]
    if temperature:
        scaled = logits / temperature
        if top_p < 1.0:
            scaled = top_p_filter(scaled, top_p)
        return torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(-1)
    return torch.argmax(logits, dim=-1)


@torch.no_grad()
def autoregressive_loop(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                        eos_token_ids: list[int], pad_token_id: int | None, temperature: float | None = 0.0,
                        hook: StepHook | None = None, top_p: float = 1.0,
                        generators: Sequence[torch.Generator] | None = None) -> LoopOutput:
    """Left-to-right decoding on the same weights: the causal encoder with its KV cache, the tied
    ``lm_head`` and final-logit softcapping. ``temperature`` 0 or ``None`` is greedy; sampling
    draws from torch's global RNG, or with ``generators`` each row from its own (only while it is
    unfinished). ``top_p`` < 1 filters each draw to its nucleus. The hook masks each row's logits
    before the choice."""
    from transformers import DynamicCache

    hook = hook if hook is not None else NullHook()
    device = input_ids.device
    B, cur_len = input_ids.shape
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    attention_mask = attention_mask.bool()
    eos = torch.tensor(eos_token_ids, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    steps = torch.zeros(B, dtype=torch.int, device=device)
    new_ids = input_ids
    pos = torch.arange(0, cur_len, dtype=torch.int32, device=device).unsqueeze(0)
    generated = []
    clock = Clock()
    pad = pad_token_id if pad_token_id is not None else 0
    for _ in range(max_new_tokens):
        with clock.model():
            out = encode(model, new_ids, attention_mask, cache, pos)
            cache = out.past_key_values
            logits = softcapped_logits(model, out.last_hidden_state[:, -1])
        steps += ~finished
        with clock.hook():
            hook.mask_ar_logits(logits, ~finished)
        token = _choose(logits, finished, temperature=temperature, top_p=top_p, generators=generators)
        token = torch.where(finished, torch.full_like(token, pad), token)
        with clock.hook():
            hook.ar_token(token, ~finished)
        generated.append(token)
        finished = finished | torch.isin(token, eos)
        if torch.all(finished):
            break
        new_ids = token.unsqueeze(-1)
        attention_mask = torch.nn.functional.pad(attention_mask, (0, 1), value=True)
        pos = torch.tensor([[cur_len]], dtype=torch.int32, device=device)
        cur_len += 1
    sequences = torch.cat([input_ids, torch.stack(generated, dim=1)], dim=1) if generated else input_ids
    return LoopOutput(sequences=sequences, forward_passes=steps, canvases=0, steps=len(generated),
                      model_s=clock.model_s, hook_s=clock.hook_s)
