"""The left-to-right loop on the DiffusionGemma weights: the ``mode="ar"`` of the runtime and the
constrained API's fallback (:func:`autoregressive_loop`), and :class:`ARBatch`, a running AR batch
that rows join and leave between tokens (continuous batching in AR mode)."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from dgemma_struct.engine.canvas import FinishedRow, LoopOutput
from dgemma_struct.engine.canvas_steps import cat_caches
from dgemma_struct.engine.forward import Clock, encode, softcapped_logits
from dgemma_struct.engine.hooks import NullHook, StepHook
from dgemma_struct.engine.sampler import sample_rows, top_p_filter
from dgemma_struct.engine.token_logprobs import RAW


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
    clock = Clock(cuda=device.type == "cuda")
    pad = pad_token_id if pad_token_id is not None else 0
    for _ in range(max_new_tokens):
        with clock.model():
            out = encode(model, new_ids, attention_mask, cache, pos)
            cache = out.past_key_values
            logits = softcapped_logits(model, out.last_hidden_state[:, -1])
        steps += ~finished
        with clock.hook():
            if RAW.on:   # benchmarks / debugging: the logits before the guide masks them
                RAW.keep(logits)
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


class ARBatch:
    """A running left-to-right batch on the same weights: rows join between tokens and leave the
    moment they write a stop token or reach their ``max_tokens`` (cache rows dropped), the AR
    counterpart of :class:`~dgemma_struct.engine.canvas.CanvasBatch`. A joining prompt is left-padded to
    the batch's length and encoded into cache rows merged with the others. Joining a running batch
    needs a hook with ``join`` and ``keep_rows`` (:class:`~dgemma_struct.guide.constraint_guide.ConstraintGuide`).

    Example::

        batch = ARBatch(model, eos_token_ids=[1], pad_token_id=0, hook=guide)
        batch.admit([prompt_ids], max_tokens=[64], generators=[torch.Generator().manual_seed(0)], rows=[row])
        while batch.size:
            finished = batch.run_steps(32)
    """

    def __init__(self, model, *, eos_token_ids: Sequence[int], pad_token_id: int | None, hook: StepHook | None = None,
                 temperature: float | None = None, top_p: float = 1.0):
        self.model = model
        self.eos = list(eos_token_ids)
        self.pad = pad_token_id if pad_token_id is not None else 0
        self.hook = hook if hook is not None else NullHook()
        self.temperature = temperature
        self.top_p = top_p
        self.clock = Clock(cuda=getattr(model, "device", torch.device("cpu")).type == "cuda")
        self._reset()
        self._next_id = 0

    def _reset(self) -> None:
        self.cache = None
        self.encoded = 0                          # columns in the cache
        self.pending: torch.Tensor | None = None  # [B, k] tokens not encoded yet
        self.mask: torch.Tensor | None = None     # [B, encoded + k] bool
        self.row_ids: list[int] = []
        self.generators: list[torch.Generator] = []
        self.generated: list[list[int]] = []
        self.left: list[int] = []                 # tokens each row may still write

    @property
    def size(self) -> int:
        return len(self.row_ids)

    @property
    def width(self) -> int:
        """Columns a joining prompt is padded to (0 when empty)."""
        return 0 if not self.row_ids else self.encoded + self.pending.shape[1]

    def fits(self, prompt_len: int) -> bool:
        return not self.row_ids or prompt_len <= self.width

    @torch.no_grad()
    def admit(self, prompts: Sequence[Sequence[int]], *, max_tokens: Sequence[int],
              generators: Sequence[torch.Generator], rows: Sequence[Any] | None = None) -> list[int]:
        """Rows join before the next token; returns their ids. Every prompt must :meth:`fits`."""
        from transformers import DynamicCache

        n, device = len(prompts), self.model.device
        if not n:
            return []
        running = bool(self.row_ids)
        if running and not self.encoded:   # nothing encoded yet: everyone is padded to the longest
            grow = max(0, max(len(p) for p in prompts) - self.pending.shape[1])
            self.pending = torch.nn.functional.pad(self.pending, (grow, 0), value=self.pad)
            self.mask = torch.nn.functional.pad(self.mask, (grow, 0), value=False)
        width = self.width if running else max(len(p) for p in prompts)
        if max(len(p) for p in prompts) > width:
            raise ValueError(f"a prompt longer than {width} tokens cannot join this batch")
        ids = torch.full((n, width), self.pad, dtype=torch.long, device=device)
        mask = torch.zeros((n, width), dtype=torch.bool, device=device)
        for i, p in enumerate(prompts):
            if len(p):
                ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long, device=device)
                mask[i, width - len(p):] = True
        if not running:
            self.cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
            self.pending, self.mask = ids, mask
        elif not self.encoded:
            self.pending, self.mask = torch.cat([self.pending, ids]), torch.cat([self.mask, mask])
        else:
            cache = DynamicCache(config=self.model.config.get_text_config(decoder=True))
            pos = torch.arange(0, self.encoded, dtype=torch.int32, device=device).unsqueeze(0)
            with self.clock.model():
                cache = encode(self.model, ids[:, :-1].contiguous(), mask[:, :-1], cache, pos).past_key_values
            cat_caches(self.cache, cache)
            self.pending = torch.cat([self.pending, ids[:, -1:]])
            self.mask = torch.cat([self.mask, mask])
        new = list(range(self._next_id, self._next_id + n))
        self._next_id += n
        self.row_ids += new
        self.generators += list(generators)
        self.generated += [[] for _ in range(n)]
        self.left += [int(m) for m in max_tokens]
        if rows is not None:
            self.hook.join(list(rows), 0)
        return new

    @torch.no_grad()
    def run_steps(self, n: int) -> list[FinishedRow]:
        """Up to ``n`` tokens for every row; returns the rows that left."""
        out: list[FinishedRow] = []
        for _ in range(n):
            if not self.row_ids:
                break
            B = len(self.row_ids)
            pos = torch.arange(self.encoded, self.encoded + self.pending.shape[1], dtype=torch.int32,
                               device=self.pending.device).unsqueeze(0)
            with self.clock.model():
                enc = encode(self.model, self.pending, self.mask, self.cache, pos)
                self.cache = enc.past_key_values
                logits = softcapped_logits(self.model, enc.last_hidden_state[:, -1])
            self.encoded += self.pending.shape[1]
            active = torch.ones(B, dtype=torch.bool, device=logits.device)
            with self.clock.hook():
                if RAW.on:
                    RAW.keep(logits)
                self.hook.mask_ar_logits(logits, active)
            token = _choose(logits, ~active, temperature=self.temperature, top_p=self.top_p,
                            generators=self.generators)
            with self.clock.hook():
                self.hook.ar_token(token, active)
            leave = []
            for b, t in enumerate(token.tolist()):
                self.generated[b].append(t)
                self.left[b] -= 1
                if t in self.eos or self.left[b] <= 0:
                    leave.append(b)
            self.pending = token.unsqueeze(-1)
            self.mask = torch.nn.functional.pad(self.mask, (0, 1), value=True)
            if leave:
                out += [FinishedRow(id=self.row_ids[b], tokens=torch.tensor(self.generated[b], dtype=torch.long),
                                    passes=len(self.generated[b])) for b in leave]
                self._keep([b for b in range(B) if b not in set(leave)])
        return out

    def _keep(self, keep: list[int]) -> None:
        if hasattr(self.hook, "keep_rows"):
            self.hook.keep_rows(keep)
        if not keep:
            self._reset()
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.pending.device)
        self.cache.batch_select_indices(idx)
        self.pending, self.mask = self.pending[idx], self.mask[idx]
        for name in ("row_ids", "generators", "generated", "left"):
            setattr(self, name, [getattr(self, name)[b] for b in keep])
