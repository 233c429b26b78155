"""The block-diffusion loop: encode committed tokens into the KV cache, denoise a canvas, commit
it, repeat. It reuses transformers' model forward, cache and mask builders and owns everything
else, so the constraint layer can act at every step through a :class:`~dgemma_struct.hooks.StepHook`.

With no hook it reproduces ``DiffusionGemmaForBlockDiffusion.generate`` exactly (same RNG draws in
the same order), which ``tests/runtime/test_equivalence.py`` pins.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from dgemma_struct.hooks import StepHook, StepView
from dgemma_struct.sampler import (DiffusionSettings, StableAndConfident, entropy_bound_accept,
                                   random_canvas, sample_rows, sample_tokens, step_entropy, step_entropy_at, temperature,
                                   top_p_filter)


@dataclass
class LoopOutput:
    sequences: torch.Tensor             # [B, T + n_canvases * L], prompt included
    forward_passes: torch.Tensor        # [B] decoder passes each row took part in
    canvases: int
    steps: int
    model_s: float
    hook_s: float
    drafts: list = field(default_factory=list)


def _softcap(model, hidden: torch.Tensor) -> torch.Tensor:
    cap = model.final_logit_softcapping
    logits = model.lm_head(hidden).float()
    return torch.tanh(logits / cap) * cap if cap else logits


def _one_hot_frozen(logits: torch.Tensor, frozen: torch.Tensor, frozen_tokens: torch.Tensor) -> None:
    """Frozen positions get a one-hot distribution on their token: zero entropy, always re-accepted."""
    if frozen.any():
        rows = logits[frozen]
        rows.fill_(float("-inf"))
        rows.scatter_(-1, frozen_tokens[frozen].unsqueeze(-1), 0.0)
        logits[frozen] = rows


@torch.no_grad()
def diffusion_loop(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                   settings: DiffusionSettings, eos_token_ids: list[int], pad_token_id: int | None,
                   hook: StepHook | None = None,
                   on_canvas: Callable[[int, torch.Tensor], None] | None = None,
                   on_draft: Callable[[int, torch.Tensor], None] | None = None,
                   temperature_scale: float | None = None, top_p: float = 1.0,
                   generators: Sequence[torch.Generator] | None = None) -> LoopOutput:
    """Runs block diffusion on a left-padded batch. ``on_canvas(i, tokens[B, L])`` sees each
    committed canvas, ``on_draft(i, argmax[B, L])`` each step's draft.

    ``temperature_scale``: ``None`` or 1 = the checkpoint's schedule; ``s > 0`` scales the whole
    schedule (``t_min``/``t_max``) by ``s``; ``0`` = greedy (the argmax is taken where the sampler
    would draw; acceptance still uses the unscaled schedule's entropies). ``top_p`` < 1 filters
    each draw to its nucleus.

    ``generators``: one ``torch.Generator`` per row. Without them every draw comes from torch's
    global RNG in transformers' order (an unconstrained run reproduces ``model.generate``). With
    them each row draws from its own generator, only at the positions the step can change
    (positions the sampler accepts and ``view.sample_at``), and only while it is still denoising:
    a row's output is then independent of the rows batched with it."""
    from transformers import DynamicCache

    config = model.config
    L = config.canvas_length
    V = config.text_config.vocab_size
    device = input_ids.device
    B, cur_len = input_ids.shape
    n_canvases = -(-max_new_tokens // L)
    eos = torch.tensor(eos_token_ids, device=device)
    cache = DynamicCache(config=config.get_text_config(decoder=True))
    stopper = StableAndConfident(settings.stability_threshold, settings.confidence_threshold)
    attention_mask = attention_mask.bool()
    dec_attn = torch.nn.functional.pad(attention_mask, (0, L), value=True)
    enc_pos = torch.arange(0, cur_len, dtype=torch.int32, device=device).unsqueeze(0)
    dec_pos = torch.arange(cur_len, cur_len + L, dtype=torch.int32, device=device).unsqueeze(0)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    passes = torch.zeros(B, dtype=torch.int, device=device)
    sequences = input_ids
    model_s = hook_s = 0.0
    steps_total = 0
    canvases = 0
    embed_dtype = model.model.decoder.embed_tokens.weight.dtype
    greedy = temperature_scale == 0
    scale = temperature_scale if temperature_scale not in (None, 0) else None
    if generators is not None and len(generators) != B:
        raise ValueError(f"{len(generators)} generators for {B} rows")

    for canvas_index in range(n_canvases):
        # 1.a encode what is not cached yet
        new_ids = (sequences if canvas_index == 0 else sequences[:, -L:]).clone(memory_format=torch.contiguous_format)
        t0 = time.perf_counter()
        enc_masks = model.model.encoder.create_masks_for_generate(
            config=config, inputs_embeds=torch.empty((B, new_ids.shape[1], 0), dtype=model.dtype, device=device),
            attention_mask=attention_mask, past_key_values=cache, position_ids=enc_pos)
        cache = model.model.encoder(input_ids=new_ids, attention_mask=enc_masks, past_key_values=cache,
                                    position_ids=enc_pos).past_key_values
        model_s += time.perf_counter() - t0

        # 1.b fresh canvas
        canvas = random_canvas(B, L, V, device, generators, rows=~finished)
        sc_logits = None
        masks = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=cache, decoder_attention_mask=dec_attn)
        finished_denoising = torch.zeros(B, dtype=torch.bool, device=device)
        stopper.reset()
        argmax = canvas
        frozen = torch.zeros(B, L, dtype=torch.bool, device=device)
        frozen_tokens = torch.full((B, L), pad_token_id if pad_token_id is not None else 0, device=device)
        view = None
        if hook is not None:
            view = StepView(canvas_index=canvas_index, step=settings.max_denoising_steps,
                            max_steps=settings.max_denoising_steps, logits=torch.empty(0), canvas=canvas,
                            frozen=frozen, frozen_tokens=frozen_tokens,
                            done=torch.zeros(B, dtype=torch.bool, device=device), active=~finished)
            t0 = time.perf_counter()
            hook.start_canvas(view)
            hook_s += time.perf_counter() - t0
            frozen, frozen_tokens = view.frozen, view.frozen_tokens
            canvas = torch.where(frozen, frozen_tokens, canvas)
            finished_denoising |= view.done

        # 1.c denoise
        for cur_step in reversed(range(1, settings.max_denoising_steps + 1)):
            if hook is not None and torch.all(finished_denoising | finished):
                break
            passes += ~(finished_denoising | finished)
            steps_total += 1
            t0 = time.perf_counter()
            raw = model(decoder_input_ids=canvas, self_conditioning_logits=sc_logits, decoder_attention_mask=masks,
                        past_key_values=cache, decoder_position_ids=dec_pos).logits
            model_s += time.perf_counter() - t0
            t_step = temperature(settings, cur_step)
            # in place: the forward's logits are ours, and the values are those of ``raw / t``
            logits = raw.div_(t_step * scale if scale is not None else t_step)
            active = ~(finished | finished_denoising)

            new_argmax = None
            if hook is not None:
                t0 = time.perf_counter()
                _one_hot_frozen(logits, frozen, frozen_tokens)
                view.step, view.logits, view.canvas = cur_step, logits, canvas
                view.frozen, view.frozen_tokens = frozen, frozen_tokens
                view.active, view.sample_at = active, None
                # the draft before masking, computed once for the hook; the hook reports the
                # positions it changed (``view.touched``) so only those are argmaxed again
                view.draft, view.touched = torch.argmax(logits, dim=-1), None
                hook.mask_logits(view)
                if view.touched is not None:
                    new_argmax = view.draft.clone()
                    if view.touched.any():
                        new_argmax[view.touched] = torch.argmax(logits[view.touched], dim=-1)
                hook_s += time.perf_counter() - t0

            # one entropy per step, shared by the acceptance rule and the stopping rule
            if hook is not None:  # frozen positions (one-hot: entropy 0) and stopped rows need none
                entropy = step_entropy_at(logits, active[:, None] & ~frozen)
            else:  # NaN-free: an emptied position becomes uniform
                entropy = step_entropy(logits)
            accept = entropy_bound_accept(logits, settings.entropy_bound, entropy=entropy)
            if new_argmax is None:
                new_argmax = torch.argmax(logits, dim=-1)
            if generators is not None:
                where = accept & ~frozen & active[:, None]
                if hook is not None and view.sample_at is not None:
                    where |= view.sample_at & active[:, None]
                sample = sample_rows(logits, fill=new_argmax, where=where, generators=generators, top_p=top_p,
                                     greedy=greedy)
            elif greedy:
                sample = new_argmax
            else:
                drawn = logits
                if top_p < 1.0:
                    drawn = top_p_filter(drawn.view(-1, V), top_p).view(B, L, V)
                sample = sample_tokens(drawn)

            if hook is not None:
                t0 = time.perf_counter()
                view.sample, view.argmax, view.accept = sample, new_argmax, accept
                view.active = active
                hook.accept(view)
                frozen, frozen_tokens = view.frozen, view.frozen_tokens
                sample = torch.where(frozen, frozen_tokens, view.sample)
                new_argmax = torch.where(frozen, frozen_tokens, view.argmax)
                accept = view.accept | frozen
                hook_s += time.perf_counter() - t0

            accepted = torch.where(accept, sample, canvas)
            new_canvas = torch.where(~accept, random_canvas(B, L, V, device, generators, rows=active), accepted)

            if finished_denoising.any():
                new_argmax = torch.where(finished_denoising[:, None], argmax, new_argmax)
                new_canvas = torch.where(finished_denoising[:, None], canvas, new_canvas)
                if sc_logits is not None:  # None when a row was finished by the hook before step 1
                    # rows only (the values of a full-vocabulary ``torch.where``, without its copy)
                    logits[finished_denoising] = sc_logits[finished_denoising].to(logits.dtype)
            finished_denoising |= stopper(new_argmax, logits, entropy=entropy)
            if hook is not None:
                finished_denoising |= view.done
            canvas, argmax = new_canvas, new_argmax
            sc_logits = logits.to(embed_dtype)
            if on_draft is not None:
                on_draft(canvas_index, argmax)
            if torch.all(finished_denoising):
                break

        # 1.d commit
        committed = argmax
        if hook is not None:
            t0 = time.perf_counter()
            if sc_logits is not None:  # else no step ran: the hook finished every row up front
                view.logits = sc_logits
            # every row that generated in this canvas ends it, whether the stopper ended its
            # denoising early (a batch) or at the last step: none commits unchecked positions
            view.active = ~finished
            committed = hook.finish_canvas(view, argmax)
            hook_s += time.perf_counter() - t0
        sequences = torch.cat([sequences, committed], dim=-1)
        canvases += 1

        # 1.e EOS: this canvas's tokens after EOS, and all tokens of rows finished before, become pad
        is_eos = torch.isin(sequences[:, -L:], eos)
        finished_now = is_eos.any(dim=-1)
        if pad_token_id is not None and (finished | finished_now).any():
            sequences[finished, -L:] = pad_token_id
            csum = is_eos.cumsum(dim=-1)
            after = (csum > 0) & ~((csum == 1) & is_eos)
            tail = sequences[:, -L:]
            tail[after] = pad_token_id
        finished = finished | finished_now
        if on_canvas is not None:
            on_canvas(canvas_index, sequences[:, -L:])
        if torch.all(finished):
            break

        # 1.f next canvas
        cur_len += L
        dec_attn = torch.nn.functional.pad(dec_attn, (0, L), value=True)
        attention_mask = torch.nn.functional.pad(attention_mask, (0, L), value=True)
        enc_pos = dec_pos
        dec_pos = torch.arange(cur_len, cur_len + L, dtype=torch.int32, device=device).unsqueeze(0)

    return LoopOutput(sequences=sequences, forward_passes=passes, canvases=canvases, steps=steps_total,
                      model_s=model_s, hook_s=hook_s)


@torch.no_grad()
def autoregressive_loop(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
                        eos_token_ids: list[int], pad_token_id: int | None, temperature: float | None = 0.0,
                        hook: StepHook | None = None,
                        on_token: Callable[[torch.Tensor], None] | None = None, top_p: float = 1.0,
                        generators: Sequence[torch.Generator] | None = None) -> LoopOutput:
    """Left-to-right decoding on the same weights: the causal encoder with its KV cache, the tied
    ``lm_head`` and final-logit softcapping. ``temperature`` 0 or ``None`` is greedy; sampling
    draws from torch's global RNG, or with ``generators`` each row from its own (only while it is
    unfinished). ``top_p`` < 1 filters each draw to its nucleus. The hook masks each row's logits
    before the choice."""
    from transformers import DynamicCache

    config = model.config
    device = input_ids.device
    B, cur_len = input_ids.shape
    cache = DynamicCache(config=config.get_text_config(decoder=True))
    attention_mask = attention_mask.bool()
    eos = torch.tensor(eos_token_ids, device=device)
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    steps = torch.zeros(B, dtype=torch.int, device=device)
    new_ids = input_ids
    pos = torch.arange(0, cur_len, dtype=torch.int32, device=device).unsqueeze(0)
    generated = []
    model_s = hook_s = 0.0
    pad = pad_token_id if pad_token_id is not None else 0
    for _ in range(max_new_tokens):
        t0 = time.perf_counter()
        masks = model.model.encoder.create_masks_for_generate(
            config=config, inputs_embeds=torch.empty((B, new_ids.shape[1], 0), dtype=model.dtype, device=device),
            attention_mask=attention_mask, past_key_values=cache, position_ids=pos)
        out = model.model.encoder(input_ids=new_ids, attention_mask=masks, past_key_values=cache, position_ids=pos)
        cache = out.past_key_values
        logits = _softcap(model, out.last_hidden_state[:, -1])
        model_s += time.perf_counter() - t0
        steps += ~finished
        if hook is not None:
            t0 = time.perf_counter()
            hook.mask_ar_logits(logits, ~finished)
            hook_s += time.perf_counter() - t0
        if temperature and generators is not None:
            token = sample_rows(logits[:, None], fill=torch.argmax(logits, dim=-1)[:, None],
                                where=~finished[:, None], generators=generators, scale=temperature,
                                top_p=top_p)[:, 0]
        elif temperature:
            scaled = logits / temperature
            if top_p < 1.0:
                scaled = top_p_filter(scaled, top_p)
            token = torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(-1)
        else:
            token = torch.argmax(logits, dim=-1)
        token = torch.where(finished, torch.full_like(token, pad), token)
        if hook is not None:
            t0 = time.perf_counter()
            hook.ar_token(token, ~finished)
            hook_s += time.perf_counter() - t0
        generated.append(token)
        if on_token is not None:
            on_token(token)
        finished = finished | torch.isin(token, eos)
        if torch.all(finished):
            break
        new_ids = token.unsqueeze(-1)
        attention_mask = torch.nn.functional.pad(attention_mask, (0, 1), value=True)
        pos = torch.tensor([[cur_len]], dtype=torch.int32, device=device)
        cur_len += 1
    sequences = torch.cat([input_ids, torch.stack(generated, dim=1)], dim=1) if generated else input_ids
    return LoopOutput(sequences=sequences, forward_passes=steps, canvases=0, steps=len(generated), model_s=model_s,
                      hook_s=hook_s)
