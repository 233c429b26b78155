"""The block-diffusion loop: encode committed tokens into the KV cache, denoise a canvas, commit
it, repeat. It reuses transformers' model forward, cache and mask builders and owns everything
else, so the constraint layer can act at every step through a :class:`~dgemma_struct.hooks.StepHook`.

With no hook it reproduces ``DiffusionGemmaForBlockDiffusion.generate`` exactly (same RNG draws in
the same order), which ``tests/runtime/test_equivalence.py`` pins. The outer loop is numbered as
transformers' is; each step is one helper below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from dgemma_struct.forward import Clock, encode
from dgemma_struct.hooks import NullHook, StepHook, StepView
from dgemma_struct.sampler import (DiffusionSettings, StableAndConfident, entropy_bound_accept, random_canvas,
                                   sample_rows, sample_tokens, step_entropy, step_entropy_at, temperature,
                                   top_p_filter)


@dataclass
class LoopOutput:
    sequences: torch.Tensor             # [B, T + n_canvases * L], prompt included
    forward_passes: torch.Tensor        # [B] decoder passes each row took part in
    canvases: int
    steps: int
    model_s: float
    hook_s: float


@dataclass
class _Run:
    """One call's fixed inputs and the batch state carried from canvas to canvas."""

    model: object
    settings: DiffusionSettings
    hook: StepHook
    reproduce: bool                 # no hook: step every row until all stop, as ``model.generate`` does
    generators: Sequence[torch.Generator] | None
    greedy: bool
    scale: float | None             # the user temperature on top of the schedule (None: 1)
    top_p: float
    pad_token_id: int | None
    eos: torch.Tensor
    cache: object
    attention_mask: torch.Tensor    # [B, T] bool, grows by L per canvas
    dec_attn: torch.Tensor          # [B, T + L] bool
    enc_pos: torch.Tensor
    dec_pos: torch.Tensor
    cur_len: int
    sequences: torch.Tensor
    finished: torch.Tensor          # [B] rows that produced a stop token
    passes: torch.Tensor            # [B] decoder passes per row
    clock: Clock
    stopper: StableAndConfident
    steps: int = 0
    canvases: int = 0

    @property
    def L(self) -> int:
        return self.model.config.canvas_length

    @property
    def V(self) -> int:
        return self.model.config.text_config.vocab_size


@dataclass
class _Canvas:
    """One canvas being denoised."""

    index: int
    canvas: torch.Tensor            # [B, L] the noisy canvas fed to the next forward
    argmax: torch.Tensor            # [B, L] the latest draft
    masks: object                   # the decoder attention masks
    done: torch.Tensor              # [B] rows whose denoising stopped
    view: StepView
    sc_logits: torch.Tensor | None = None   # the last step's logits, fed back as self-conditioning


def _one_hot_frozen(logits: torch.Tensor, frozen: torch.Tensor, frozen_tokens: torch.Tensor) -> None:
    """Frozen positions get a one-hot distribution on their token: zero entropy, always re-accepted."""
    if frozen.any():
        rows = logits[frozen]
        rows.fill_(float("-inf"))
        rows.scatter_(-1, frozen_tokens[frozen].unsqueeze(-1), 0.0)
        logits[frozen] = rows


def _encode_committed(run: _Run, canvas_index: int) -> None:
    """1.a Encode what is not cached yet: the prompt, then each committed canvas."""
    new_ids = run.sequences if canvas_index == 0 else run.sequences[:, -run.L:]
    new_ids = new_ids.clone(memory_format=torch.contiguous_format)
    with run.clock.model():
        run.cache = encode(run.model, new_ids, run.attention_mask, run.cache, run.enc_pos).past_key_values


def _start_canvas(run: _Run, canvas_index: int) -> _Canvas:
    """1.b A fresh noise canvas; the hook may freeze positions and finish rows up front."""
    model, B, L, device = run.model, run.sequences.shape[0], run.L, run.sequences.device
    canvas = random_canvas(B, L, run.V, device, run.generators, rows=~run.finished)
    masks = model.model.decoder.create_diffusion_decoder_attention_mask(
        config=model.config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=run.cache,
        decoder_attention_mask=run.dec_attn)
    run.stopper.reset()
    frozen = torch.zeros(B, L, dtype=torch.bool, device=device)
    frozen_tokens = torch.full((B, L), run.pad_token_id if run.pad_token_id is not None else 0, device=device)
    max_steps = run.settings.max_denoising_steps
    view = StepView(canvas_index=canvas_index, step=max_steps, max_steps=max_steps, logits=torch.empty(0),
                    canvas=canvas, frozen=frozen, frozen_tokens=frozen_tokens,
                    done=torch.zeros(B, dtype=torch.bool, device=device), active=~run.finished)
    with run.clock.hook():
        run.hook.start_canvas(view)
    canvas = torch.where(view.frozen, view.frozen_tokens, canvas)
    done = torch.zeros(B, dtype=torch.bool, device=device) | view.done
    return _Canvas(index=canvas_index, canvas=canvas, argmax=canvas, masks=masks, done=done, view=view)


def _mask(run: _Run, c: _Canvas, logits: torch.Tensor, cur_step: int, active: torch.Tensor) -> torch.Tensor:
    """The hook's ``mask_logits``; returns the argmax of the masked logits."""
    view = c.view
    frozen, frozen_tokens = view.frozen, view.frozen_tokens
    with run.clock.hook():
        _one_hot_frozen(logits, frozen, frozen_tokens)
        view.step, view.logits, view.canvas = cur_step, logits, c.canvas
        view.active, view.sample_at = active, None
        # the draft before masking, computed once for the hook; the hook reports the positions it
        # changed (``view.touched``) so only those are argmaxed again
        view.draft, view.touched = torch.argmax(logits, dim=-1), None
        run.hook.mask_logits(view)
        if run.reproduce:  # no hook: nothing changed the logits
            return view.draft
        if view.touched is None:
            return torch.argmax(logits, dim=-1)
        argmax = view.draft.clone()
        if view.touched.any():
            argmax[view.touched] = torch.argmax(logits[view.touched], dim=-1)
        return argmax


def _draw(run: _Run, c: _Canvas, logits: torch.Tensor, argmax: torch.Tensor, accept: torch.Tensor,
          frozen: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
    """The denoiser's sample: per-row generators draw only where the step can change the canvas;
    the global RNG draws every position, as transformers does."""
    if run.generators is not None:
        where = accept & ~frozen & active[:, None]
        if c.view.sample_at is not None:
            where |= c.view.sample_at & active[:, None]
        return sample_rows(logits, fill=argmax, where=where, generators=run.generators, top_p=run.top_p,
                           greedy=run.greedy)
    if run.greedy:
        return argmax
    if run.top_p < 1.0:
        B, L, V = logits.shape
        return sample_tokens(top_p_filter(logits.view(-1, V), run.top_p).view(B, L, V))
    return sample_tokens(logits)


def _denoise_step(run: _Run, c: _Canvas, cur_step: int) -> None:
    """1.c One denoising step: forward, mask, accept by entropy, sample, renoise, check the stop."""
    unfinished = ~(c.done | run.finished)
    run.passes += unfinished
    run.steps += 1
    with run.clock.model():
        raw = run.model(decoder_input_ids=c.canvas, self_conditioning_logits=c.sc_logits,
                        decoder_attention_mask=c.masks, past_key_values=run.cache,
                        decoder_position_ids=run.dec_pos).logits
    t_step = temperature(run.settings, cur_step)
    # in place: the forward's logits are ours, and the values are those of ``raw / t``
    logits = raw.div_(t_step * run.scale if run.scale is not None else t_step)
    active = unfinished
    frozen = c.view.frozen
    argmax = _mask(run, c, logits, cur_step, active)

    # one entropy per step, shared by the acceptance rule and the stopping rule
    if run.reproduce:  # NaN-free: an emptied position becomes uniform
        entropy = step_entropy(logits)
    else:  # frozen positions (one-hot: entropy 0) and stopped rows need none
        entropy = step_entropy_at(logits, active[:, None] & ~frozen)
    accept = entropy_bound_accept(logits, run.settings.entropy_bound, entropy=entropy)
    sample = _draw(run, c, logits, argmax, accept, frozen, active)

    view = c.view
    with run.clock.hook():
        view.sample, view.argmax, view.accept = sample, argmax, accept
        view.active = active
        run.hook.accept(view)
        frozen, frozen_tokens = view.frozen, view.frozen_tokens
        sample = torch.where(frozen, frozen_tokens, view.sample)
        argmax = torch.where(frozen, frozen_tokens, view.argmax)
        accept = view.accept | frozen

    accepted = torch.where(accept, sample, c.canvas)
    B, L = accept.shape
    new_canvas = torch.where(~accept, random_canvas(B, L, run.V, accept.device, run.generators, rows=active),
                             accepted)
    if c.done.any():  # rows that stopped keep their canvas, draft and self-conditioning
        argmax = torch.where(c.done[:, None], c.argmax, argmax)
        new_canvas = torch.where(c.done[:, None], c.canvas, new_canvas)
        if c.sc_logits is not None:  # None when a row was finished by the hook before step 1
            # rows only (the values of a full-vocabulary ``torch.where``, without its copy)
            logits[c.done] = c.sc_logits[c.done].to(logits.dtype)
    c.done |= run.stopper(argmax, logits, entropy=entropy)
    c.done |= view.done
    c.canvas, c.argmax = new_canvas, argmax
    c.sc_logits = logits.to(run.model.model.decoder.embed_tokens.weight.dtype)


def _commit_canvas(run: _Run, c: _Canvas) -> None:
    """1.d The hook's ``finish_canvas`` turns the last draft into the committed tokens."""
    view = c.view
    with run.clock.hook():
        if c.sc_logits is not None:  # else no step ran: the hook finished every row up front
            view.logits = c.sc_logits
        # every row that generated in this canvas ends it, whether the stopper ended its
        # denoising early (a batch) or at the last step: none commits unchecked positions
        view.active = ~run.finished
        committed = run.hook.finish_canvas(view, c.argmax)
    run.sequences = torch.cat([run.sequences, committed], dim=-1)
    run.canvases += 1


def _pad_after_eos(run: _Run) -> None:
    """1.e This canvas's tokens after a stop token, and all tokens of rows finished before, become pad."""
    L, pad = run.L, run.pad_token_id
    is_eos = torch.isin(run.sequences[:, -L:], run.eos)
    finished_now = is_eos.any(dim=-1)
    if pad is not None and (run.finished | finished_now).any():
        run.sequences[run.finished, -L:] = pad
        csum = is_eos.cumsum(dim=-1)
        after = (csum > 0) & ~((csum == 1) & is_eos)
        tail = run.sequences[:, -L:]
        tail[after] = pad
    run.finished = run.finished | finished_now


def _next_canvas(run: _Run) -> None:
    """1.f Positions and masks move on by one canvas."""
    L = run.L
    run.cur_len += L
    run.dec_attn = torch.nn.functional.pad(run.dec_attn, (0, L), value=True)
    run.attention_mask = torch.nn.functional.pad(run.attention_mask, (0, L), value=True)
    run.enc_pos = run.dec_pos
    run.dec_pos = torch.arange(run.cur_len, run.cur_len + L, dtype=torch.int32,
                               device=run.sequences.device).unsqueeze(0)


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

    ``hook``: ``None`` steps every row until all rows stop (as ``model.generate``); with a hook,
    rows the hook or the stopper finished are skipped (their entropy is not computed).

    ``generators``: one ``torch.Generator`` per row. Without them every draw comes from torch's
    global RNG in transformers' order (an unconstrained run reproduces ``model.generate``). With
    them each row draws from its own generator, only at the positions the step can change
    (positions the sampler accepts and ``view.sample_at``), and only while it is still denoising:
    a row's output is then independent of the rows batched with it."""
    from transformers import DynamicCache

    config = model.config
    L = config.canvas_length
    device = input_ids.device
    B, cur_len = input_ids.shape
    if generators is not None and len(generators) != B:
        raise ValueError(f"{len(generators)} generators for {B} rows")
    attention_mask = attention_mask.bool()
    run = _Run(
        model=model, settings=settings, hook=hook if hook is not None else NullHook(), reproduce=hook is None,
        generators=generators, greedy=temperature_scale == 0,
        scale=temperature_scale if temperature_scale not in (None, 0) else None, top_p=top_p,
        pad_token_id=pad_token_id, eos=torch.tensor(eos_token_ids, device=device),
        cache=DynamicCache(config=config.get_text_config(decoder=True)), attention_mask=attention_mask,
        dec_attn=torch.nn.functional.pad(attention_mask, (0, L), value=True),
        enc_pos=torch.arange(0, cur_len, dtype=torch.int32, device=device).unsqueeze(0),
        dec_pos=torch.arange(cur_len, cur_len + L, dtype=torch.int32, device=device).unsqueeze(0),
        cur_len=cur_len, sequences=input_ids, finished=torch.zeros(B, dtype=torch.bool, device=device),
        passes=torch.zeros(B, dtype=torch.int, device=device), clock=Clock(),
        stopper=StableAndConfident(settings.stability_threshold, settings.confidence_threshold))

    for canvas_index in range(-(-max_new_tokens // L)):
        _encode_committed(run, canvas_index)                                 # 1.a
        c = _start_canvas(run, canvas_index)                                 # 1.b
        for cur_step in reversed(range(1, settings.max_denoising_steps + 1)):  # 1.c
            if not run.reproduce and torch.all(c.done | run.finished):
                break
            _denoise_step(run, c, cur_step)
            if on_draft is not None:
                on_draft(canvas_index, c.argmax)
            if torch.all(c.done):
                break
        _commit_canvas(run, c)                                               # 1.d
        _pad_after_eos(run)                                                  # 1.e
        if on_canvas is not None:
            on_canvas(canvas_index, run.sequences[:, -L:])
        if torch.all(run.finished):
            break
        _next_canvas(run)                                                    # 1.f

    return LoopOutput(sequences=run.sequences, forward_passes=run.passes, canvases=run.canvases, steps=run.steps,
                      model_s=run.clock.model_s, hook_s=run.clock.hook_s)
