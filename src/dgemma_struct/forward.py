"""The model calls both generation loops share: encoding new tokens into the KV cache, the AR
head, and one clock for model and hook time."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from dgemma_struct.profiling import model_section


@dataclass
class Clock:
    """Seconds spent in the model's forward passes and in the hook (with the loop's work for it)."""

    model_s: float = 0.0
    hook_s: float = 0.0

    @contextmanager
    def model(self) -> Iterator[None]:
        t0 = time.perf_counter()
        with model_section():
            yield
        self.model_s += time.perf_counter() - t0

    @contextmanager
    def hook(self) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.hook_s += time.perf_counter() - t0


def encode(model, new_ids: torch.Tensor, attention_mask: torch.Tensor, cache, position_ids: torch.Tensor):
    """Runs the causal encoder over ``new_ids`` (appending to ``cache``); returns its output
    (``past_key_values``, ``last_hidden_state``). ``attention_mask``: bool ``[B, cached + new]``."""
    B = new_ids.shape[0]
    masks = model.model.encoder.create_masks_for_generate(
        config=model.config, inputs_embeds=torch.empty((B, new_ids.shape[1], 0), dtype=model.dtype,
                                                       device=new_ids.device),
        attention_mask=attention_mask, past_key_values=cache, position_ids=position_ids)
    return model.model.encoder(input_ids=new_ids, attention_mask=masks, past_key_values=cache,
                               position_ids=position_ids)


def softcapped_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """The tied ``lm_head`` with the final-logit softcapping, in float32."""
    cap = model.final_logit_softcapping
    logits = model.lm_head(hidden).float()
    return torch.tanh(logits / cap) * cap if cap else logits
