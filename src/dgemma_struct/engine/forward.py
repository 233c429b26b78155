"""The model calls both generation loops share: encoding new tokens into the KV cache, the AR
head, and one clock for model and hook time."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch

from dgemma_struct.engine.profiling import model_section


class Clock:
    """Seconds spent in the model's forward passes (``model_s``) and in the hook, with the loop's
    work for it (``hook_s``). On CPU (or with ``cuda=False``) host ``perf_counter`` time; with
    ``cuda=True`` each section is timed by a pair of CUDA events on the current stream (the work
    the section queued, not its launches), read -- with one wait for the last event -- only when
    ``model_s`` / ``hook_s`` is asked for."""

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = bool(cuda) and torch.cuda.is_available()
        self._s = {"model": 0.0, "hook": 0.0}
        self._events: dict[str, list] = {"model": [], "hook": []}

    def _total(self, kind: str) -> float:
        pending = self._events[kind]
        if pending:
            pending[-1][1].synchronize()
            self._s[kind] += sum(a.elapsed_time(b) for a, b in pending) / 1e3
            pending.clear()
        return self._s[kind]

    @property
    def model_s(self) -> float:
        return self._total("model")

    @property
    def hook_s(self) -> float:
        return self._total("hook")

    @contextmanager
    def _section(self, kind: str) -> Iterator[None]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events[kind].append((start, end))
            return
        t0 = time.perf_counter()
        yield
        self._s[kind] += time.perf_counter() - t0

    @contextmanager
    def model(self) -> Iterator[None]:
        with model_section(), self._section("model"):
            yield

    @contextmanager
    def hook(self) -> Iterator[None]:
        with self._section("hook"):
            yield


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
