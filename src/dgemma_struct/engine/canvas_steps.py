"""The steps of one canvas in the block-diffusion loop (:mod:`dgemma_struct.engine.canvas`): 1.a encode
what is committed, 1.b start a noise canvas, 1.c denoise (forward, mask, accept, sample, renoise,
stop), 1.d commit, 1.e pad after a stop token, 1.f move on. :class:`Run` is a batch's state from
canvas to canvas, :class:`Canvas` one canvas being denoised.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Sequence

import torch

from dgemma_struct.engine.forward import Clock, encode
from dgemma_struct.engine.hooks import StepHook, StepView
from dgemma_struct.engine.token_logprobs import RAW
from dgemma_struct.engine.sampler import (DiffusionSettings, RowSettings, StableAndConfident, entropy_at,
                                          entropy_bound_accept, random_canvas, reset_dead, sample_at, sample_tokens,
                                          temperature, top_p_filter)

__all__ = ["Run", "Canvas", "encode_committed", "start_canvas", "denoise_step", "commit_canvas", "pad_after_eos",
           "next_canvas", "cache_rows", "cat_caches"]


def _row_settings(run: "Run", entropy: torch.Tensor) -> RowSettings:
    """This step's per-row settings: the ``guided_*`` ones on the rows the hook commits left to right
    (its ``guided_rows()``, host flags; never on the reproduction path)."""
    s, guided = run.settings, getattr(run.hook, "guided_rows", None)
    rows = guided() if guided is not None and s.guides and not run.reproduce else None
    return s.for_rows(rows, entropy, greedy=run.greedy, temperature_set=run.scale is not None)


@dataclass
class Run:
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
    dec_pos: torch.Tensor
    cur_len: int
    sequences: torch.Tensor
    finished: torch.Tensor          # [B] rows that produced a stop token
    passes: torch.Tensor            # [B] decoder passes per row
    clock: Clock
    stopper: StableAndConfident
    row_ids: list[int] = field(default_factory=list)   # each batch row's id (its place in the caller's list)
    starts: list[int] = field(default_factory=list)    # column where each row's generation begins
    canvases_left: torch.Tensor | None = None          # [B] canvases each row may still run
    finished_rows: list[bool] | None = None            # ``finished`` on the host (None: read it)
    encoded: int = 0                # columns of ``sequences`` already in the cache
    steps: int = 0
    canvases: int = 0

    @property
    def L(self) -> int:
        return self.model.config.canvas_length

    @property
    def V(self) -> int:
        return self.model.config.text_config.vocab_size


@dataclass
class Canvas:
    """One canvas being denoised."""

    index: int
    canvas: torch.Tensor            # [B, L] the noisy canvas fed to the next forward
    argmax: torch.Tensor            # [B, L] the latest draft
    masks: object                   # the decoder attention masks
    done: torch.Tensor              # [B] rows whose denoising stopped
    view: StepView
    sc_logits: torch.Tensor | None = None   # the last step's logits, fed back as self-conditioning
    sub: tuple | None = None        # (rows, cache, masks) of the last sub-batch forward
    done_rows: list[bool] = field(default_factory=list)       # ``done`` on the host
    finished_rows: list[bool] = field(default_factory=list)   # ``run.finished`` on the host (fixed in a canvas)


def _one_hot_frozen(logits: torch.Tensor, view: StepView) -> None:
    """Frozen positions get a one-hot distribution on their token: zero entropy, always re-accepted.
    With the hook's ``frozen_upto`` only the frozen prefixes are touched; else masked ops over the
    canvas (no host read either way)."""
    upto = view.frozen_upto
    if upto is None:
        frozen, tok = view.frozen.unsqueeze(-1), view.frozen_tokens.unsqueeze(-1)
        keep = logits.gather(-1, tok)
        logits.masked_fill_(frozen, float("-inf"))
        logits.scatter_(-1, tok, torch.where(frozen, torch.zeros_like(keep), keep))
        return
    for b, f in enumerate(upto):
        if f:
            rows = logits[b, :f]
            rows.fill_(float("-inf"))
            rows.scatter_(-1, view.frozen_tokens[b, :f].unsqueeze(-1), 0.0)


def encode_committed(run: Run) -> None:
    """1.a Encode what is not cached yet: the prompt, then each committed canvas."""
    new_ids = run.sequences[:, run.encoded:].clone(memory_format=torch.contiguous_format)
    pos = torch.arange(run.encoded, run.cur_len, dtype=torch.int32, device=new_ids.device).unsqueeze(0)
    with run.clock.model():
        run.cache = encode(run.model, new_ids, run.attention_mask, run.cache, pos).past_key_values
    run.encoded = run.cur_len


def cache_rows(cache, rows: torch.Tensor):
    """A cache holding only ``rows`` (the decoder reads the cache and never writes it, so a
    sub-batch forward can run on this copy)."""
    sub = copy.copy(cache)
    sub.layers = []
    for layer in cache.layers:
        part = copy.copy(layer)
        if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel():
            part.keys, part.values = layer.keys[rows], layer.values[rows]
        sub.layers.append(part)
    return sub


def cat_caches(cache, other) -> None:
    """Appends ``other``'s rows to ``cache`` (both hold the same number of encoded columns)."""
    for layer, add in zip(cache.layers, other.layers):
        if not getattr(add, "is_initialized", False) or add.keys is None or not add.keys.numel():
            continue
        if getattr(layer, "cumulative_length", None) != getattr(add, "cumulative_length", None):
            raise RuntimeError("cache rows of different lengths cannot be merged")
        layer.keys = torch.cat([layer.keys, add.keys], dim=0)
        layer.values = torch.cat([layer.values, add.values], dim=0)


def start_canvas(run: Run, canvas_index: int) -> Canvas:
    """1.b A fresh noise canvas; the hook may freeze positions and finish rows up front."""
    model, B, L, device = run.model, run.sequences.shape[0], run.L, run.sequences.device
    finished_rows = run.finished_rows if run.finished_rows is not None else run.finished.tolist()
    live = [not f for f in finished_rows]
    canvas = random_canvas(B, L, run.V, device, run.generators, rows=live)
    masks = model.model.decoder.create_diffusion_decoder_attention_mask(
        config=model.config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=run.cache,
        decoder_attention_mask=run.dec_attn)
    run.stopper.reset()
    frozen = torch.zeros(B, L, dtype=torch.bool, device=device)
    frozen_tokens = torch.full((B, L), run.pad_token_id if run.pad_token_id is not None else 0, device=device)
    max_steps = run.settings.max_denoising_steps
    view = StepView(canvas_index=canvas_index, step=max_steps, max_steps=max_steps, logits=torch.empty(0),
                    canvas=canvas, frozen=frozen, frozen_tokens=frozen_tokens,
                    done=torch.zeros(B, dtype=torch.bool, device=device), active=~run.finished, active_rows=live,
                    frozen_upto=[0] * B if run.reproduce else None)
    with run.clock.hook():
        run.hook.start_canvas(view)
    canvas = torch.where(view.frozen, view.frozen_tokens, canvas)
    done = torch.zeros(B, dtype=torch.bool, device=device) | view.done
    done_rows = [False] * B if run.reproduce else view.done_rows if view.done_rows is not None else done.tolist()
    return Canvas(index=canvas_index, canvas=canvas, argmax=canvas, masks=masks, done=done, view=view,
                  done_rows=list(done_rows), finished_rows=finished_rows)


def _mask(run: Run, c: Canvas, logits: torch.Tensor, cur_step: int, active: torch.Tensor,
          active_rows: list[bool]) -> torch.Tensor:
    """The hook's ``mask_logits``; returns the argmax of the masked logits."""
    view = c.view
    with run.clock.hook():
        _one_hot_frozen(logits, view)
        view.step, view.logits, view.canvas = cur_step, logits, c.canvas
        view.active, view.active_rows, view.sample_at, view.sample_at_pos = active, active_rows, None, None
        # the draft before masking, computed once for the hook; the hook reports the positions it
        # changed (``touched_spans`` / ``touched``) so only those are argmaxed again
        view.draft, view.touched, view.touched_spans = torch.argmax(logits, dim=-1), None, None
        if RAW.on:   # benchmarks / debugging: the logits before the guide masks them
            RAW.keep(logits)
        run.hook.mask_logits(view)
        if run.reproduce:  # no hook: nothing changed the logits
            return view.draft
        if view.touched_spans is not None:
            argmax = view.draft.clone()
            for b, lo, hi in view.touched_spans:
                argmax[b, lo:hi] = torch.argmax(logits[b, lo:hi], dim=-1)
            return argmax
        if view.touched is None:
            return torch.argmax(logits, dim=-1)
        return torch.where(view.touched, torch.argmax(logits, dim=-1), view.draft)


def _draw(run: Run, c: Canvas, logits: torch.Tensor, argmax: torch.Tensor, positions: list[list[int]] | None,
          greedy: bool | list[bool]) -> torch.Tensor:
    """The denoiser's sample: per-row generators draw only at ``positions`` (where the step can
    change the canvas); the global RNG draws every position, as transformers does. ``greedy``: for
    every row or per row (the argmax where the sampler would draw)."""
    if run.generators is not None:
        return sample_at(logits, fill=argmax, positions=positions, generators=run.generators, top_p=run.top_p,
                         greedy=greedy)
    if greedy is True:
        return argmax
    if run.top_p < 1.0:
        B, L, V = logits.shape
        drawn = sample_tokens(top_p_filter(logits.view(-1, V), run.top_p).view(B, L, V))
    else:
        drawn = sample_tokens(logits)
    if greedy is False:
        return drawn
    rows = torch.tensor(greedy, device=argmax.device)
    return torch.where(rows[:, None], argmax, drawn)


def _forward(run: Run, c: Canvas, rows_on: list[bool], scale: float) -> tuple[torch.Tensor, bool]:
    """The decoder's logits ``[B, L, V]`` and whether they are already divided by ``scale``. With a
    hook, only the rows still denoising are forwarded; the others keep their last logits (written
    into the last step's buffer when it can take them: no new canvas-sized buffer): a batch costs
    what its live rows cost, not what its slowest row costs."""
    model = run.model
    if run.reproduce or all(rows_on):
        return model(decoder_input_ids=c.canvas, self_conditioning_logits=c.sc_logits, decoder_attention_mask=c.masks,
                     past_key_values=run.cache, decoder_position_ids=run.dec_pos).logits, False
    key = tuple(b for b, on in enumerate(rows_on) if on)
    if c.sub is None or c.sub[0] != key:
        rows = torch.tensor(key, dtype=torch.long).to(c.canvas.device, non_blocking=True)
        cache = cache_rows(run.cache, rows)
        masks = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config, inputs_embeds=c.canvas[rows].unsqueeze(-1), past_key_values=cache,
            decoder_attention_mask=run.dec_attn[rows])
        c.sub = (key, cache, masks, rows)
    _, cache, masks, rows = c.sub
    sc = c.sc_logits.index_select(0, rows) if c.sc_logits is not None else None
    part = model(decoder_input_ids=c.canvas.index_select(0, rows), self_conditioning_logits=sc,
                 decoder_attention_mask=masks, past_key_values=cache, decoder_position_ids=run.dec_pos).logits
    part = part.div_(scale)
    B, L = c.canvas.shape
    full = c.sc_logits
    if full is None or full.dtype != part.dtype:
        full = part.new_zeros((B, L, part.shape[-1]))
        if c.sc_logits is not None:  # rows that stopped keep their last logits
            for b, on in enumerate(rows_on):
                if not on:
                    full[b].copy_(c.sc_logits[b])
    return full.index_copy_(0, rows, part), True


def _host_flags(run: Run, c: Canvas, accept: torch.Tensor, dead: torch.Tensor) -> dict:
    """One host read for what the step decides on the host: the acceptances, the empty positions,
    and (for a hook without host hints) the frozen positions and ``sample_at``."""
    view = c.view
    parts = {"accept": accept, "dead": dead}
    if not run.reproduce and view.frozen_upto is None:
        parts["frozen"] = view.frozen
    if view.sample_at is not None and view.sample_at_pos is None:
        parts["sample_at"] = view.sample_at
    if run.reproduce and run.generators is None:   # only empty positions matter
        return {"dead": dead.tolist()}
    return dict(zip(parts, torch.stack(list(parts.values())).tolist()))


def _positions(run: Run, c: Canvas, host: dict, rows_on: list[bool]) -> list[list[int]]:
    """Each row's draw positions: accepted and not frozen, plus the hook's ``sample_at``."""
    view, L = c.view, run.L
    extra: dict[int, set] = {}
    for b, p in view.sample_at_pos or ():
        extra.setdefault(b, set()).add(p)
    out = []
    for b, on in enumerate(rows_on):
        if not on:
            out.append([])
            continue
        acc = host["accept"][b]
        lo = view.frozen_upto[b] if view.frozen_upto is not None else 0
        frozen = host.get("frozen", [None] * (b + 1))[b]
        ps = {p for p in range(lo, L) if acc[p] and not (frozen and frozen[p])} | extra.get(b, set())
        if "sample_at" in host:
            ps |= {p for p, x in enumerate(host["sample_at"][b]) if x}
        out.append(sorted(ps))
    return out


def denoise_step(run: Run, c: Canvas, cur_step: int) -> None:
    """1.c One denoising step: forward, mask, accept by entropy, sample, renoise, check the stop.
    Host reads outside the forward: the hook's (a constraint guide: the draft, the sample), one for
    the acceptances (:func:`_host_flags`) and one for the rows that stopped; none per row."""
    B = len(c.done_rows)
    rows_on = [not (d or f) for d, f in zip(c.done_rows, c.finished_rows)]
    unfinished = ~(c.done | run.finished)
    run.passes += unfinished
    run.steps += 1
    t_step = temperature(run.settings, cur_step)
    scale = t_step * run.scale if run.scale is not None else t_step
    with run.clock.model():
        raw, scaled = _forward(run, c, rows_on, scale)
    # in place: the forward's logits are ours, and the values are those of ``raw / t``
    logits = raw if scaled else raw.div_(scale)
    active = unfinished
    view = c.view
    argmax = _mask(run, c, logits, cur_step, active, rows_on)

    # one entropy per step, shared by the acceptance rule and the stopping rule; frozen positions
    # (one-hot: entropy 0) and stopped rows need none
    if run.reproduce:
        starts = [0] * B
    else:
        upto = view.frozen_upto
        starts = [(upto[b] if upto is not None else 0) if on else None for b, on in enumerate(rows_on)]
    # (the reproduction path keeps transformers' exact operations; a hook's step may use the fused kernel)
    entropy, dead = entropy_at(logits, starts, backend="torch" if run.reproduce else "auto")
    if not run.reproduce and view.frozen_upto is None:
        entropy = torch.where(view.frozen, torch.zeros_like(entropy), entropy)
    row = _row_settings(run, entropy)
    accept = entropy_bound_accept(logits, row.bound, entropy=entropy)
    host = _host_flags(run, c, accept, dead)
    if any(any(r) for r in host["dead"]):  # NaN-free: an emptied position becomes uniform
        reset_dead(logits, host["dead"])
    positions = _positions(run, c, host, rows_on) if run.generators is not None else None
    sample = _draw(run, c, logits, argmax, positions, row.greedy)

    with run.clock.hook():
        view.sample, view.argmax, view.accept = sample, argmax, accept
        view.active, view.active_rows, view.accept_rows = active, rows_on, host.get("accept")
        run.hook.accept(view)
        frozen, frozen_tokens = view.frozen, view.frozen_tokens
        sample = torch.where(frozen, frozen_tokens, view.sample)
        argmax = torch.where(frozen, frozen_tokens, view.argmax)
        accept = view.accept | frozen

    accepted = torch.where(accept, sample, c.canvas)
    L = accept.shape[1]
    new_canvas = torch.where(~accept, random_canvas(B, L, run.V, accept.device, run.generators, rows=rows_on),
                             accepted)
    if any(c.done_rows):  # rows that stopped keep their canvas, draft and self-conditioning
        argmax = torch.where(c.done[:, None], c.argmax, argmax)
        new_canvas = torch.where(c.done[:, None], c.canvas, new_canvas)
        if c.sc_logits is not None and not scaled:  # (a sub-batch forward kept them already)
            for b, d in enumerate(c.done_rows):
                if d:
                    logits[b].copy_(c.sc_logits[b])
    c.done |= run.stopper(argmax, logits, entropy=entropy, confidence_threshold=row.confidence)
    c.done |= view.done
    c.done_rows = c.done.tolist()
    c.canvas, c.argmax = new_canvas, argmax
    c.sc_logits = logits.to(run.model.model.decoder.embed_tokens.weight.dtype)


def commit_canvas(run: Run, c: Canvas) -> None:
    """1.d The hook's ``finish_canvas`` turns the last draft into the committed tokens."""
    view = c.view
    with run.clock.hook():
        if c.sc_logits is not None:  # else no step ran: the hook finished every row up front
            view.logits = c.sc_logits
        # every row that generated in this canvas ends it, whether the stopper ended its
        # denoising early (a batch) or at the last step: none commits unchecked positions
        view.active, view.active_rows = ~run.finished, [not f for f in c.finished_rows]
        committed = run.hook.finish_canvas(view, c.argmax)
    run.sequences = torch.cat([run.sequences, committed], dim=-1)
    run.canvases += 1


def pad_after_eos(run: Run) -> None:
    """1.e This canvas's tokens after a stop token, and all tokens of rows finished before, become pad."""
    L, pad = run.L, run.pad_token_id
    is_eos = torch.isin(run.sequences[:, -L:], run.eos)
    if pad is not None:
        csum = is_eos.cumsum(dim=-1)
        after = (csum > 0) & ~((csum == 1) & is_eos)
        run.sequences[:, -L:].masked_fill_(after | run.finished[:, None], pad)
    run.finished = run.finished | is_eos.any(dim=-1)


def next_canvas(run: Run) -> None:
    """1.f Positions and masks move on by one canvas."""
    L = run.L
    run.cur_len += L
    run.dec_attn = torch.nn.functional.pad(run.dec_attn, (0, L), value=True)
    run.attention_mask = torch.nn.functional.pad(run.attention_mask, (0, L), value=True)
    run.dec_pos = torch.arange(run.cur_len, run.cur_len + L, dtype=torch.int32,
                               device=run.sequences.device).unsqueeze(0)
