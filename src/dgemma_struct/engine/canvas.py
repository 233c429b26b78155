"""The block-diffusion loop: encode committed tokens into the KV cache, denoise a canvas, commit
it, repeat. It reuses transformers' model forward, cache and mask builders and owns everything
else, so the constraint layer can act at every step through a :class:`~dgemma_struct.engine.hooks.StepHook`.

With no hook it reproduces ``DiffusionGemmaForBlockDiffusion.generate`` exactly (same RNG draws in
the same order), which ``tests/runtime/test_equivalence.py`` pins. The outer loop is numbered as
transformers' is; each step is one helper in :mod:`dgemma_struct.engine.canvas_steps`.

:class:`CanvasBatch` holds a running batch: rows **join** at canvas boundaries (their prompts
encoded and their cache rows merged, left-padded to the batch's length) and **leave** as soon as
they finish (their cache rows dropped); inside a canvas, rows whose denoising stopped are left out
of the forward. :func:`diffusion_loop` is one such batch from start to end; the server's scheduler
keeps batches running and admits requests into them (:mod:`dgemma_struct.scheduling.scheduler`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from dgemma_struct.engine.canvas_steps import (Run, cat_caches, commit_canvas, denoise_step, encode_committed,
                                        next_canvas, pad_after_eos, start_canvas)
from dgemma_struct.engine.forward import Clock, encode
from dgemma_struct.engine.hooks import NullHook, StepHook
from dgemma_struct.engine.sampler import DiffusionSettings, StableAndConfident


@dataclass
class LoopOutput:
    sequences: torch.Tensor             # [B, T + n_canvases * L], prompt included
    forward_passes: torch.Tensor        # [B] decoder passes each row took part in
    canvases: int
    steps: int
    model_s: float
    hook_s: float


@dataclass
class FinishedRow:
    """A row that left a :class:`CanvasBatch`: its id, the tokens it generated (whole canvases:
    pad after a stop token, nothing cut) and the decoder passes it took part in."""

    id: int
    tokens: torch.Tensor
    passes: int


def _evict(run: Run, kept: list[int]) -> None:
    """Only the rows at ``kept`` stay: their cache rows, masks and state."""
    rows = torch.tensor(kept, dtype=torch.long).to(run.sequences.device, non_blocking=True)
    run.cache.batch_select_indices(rows)
    run.sequences, run.attention_mask, run.dec_attn = run.sequences[rows], run.attention_mask[rows], run.dec_attn[rows]
    run.finished, run.passes, run.canvases_left = run.finished[rows], run.passes[rows], run.canvases_left[rows]
    if run.finished_rows is not None:
        run.finished_rows = [run.finished_rows[b] for b in kept]
    if run.generators is not None:
        run.generators = [run.generators[b] for b in kept]
    run.row_ids = [run.row_ids[b] for b in kept]
    run.starts = [run.starts[b] for b in kept]
    run.hook.keep_rows(kept)


class CanvasBatch:
    """A running block-diffusion batch. Rows join with :meth:`admit` between canvases and leave
    as soon as they finish (a stop token, or their canvases spent); :meth:`run_canvas` denoises and
    commits one canvas for every row and returns the rows that left.

    Rows that join a running batch are left-padded to its length and their prompt is encoded into
    cache rows merged with the others (positions are shared: relative distances inside each row are
    what they would be alone). That needs a hook with ``join(rows, canvas_index)`` and
    ``keep_rows(positions)`` (:class:`~dgemma_struct.guide.constraint_guide.ConstraintGuide` has both) and
    per-row generators, so a row's output does not depend on who shares its batch.

    Example::

        batch = CanvasBatch(model, settings=settings, eos_token_ids=[1], pad_token_id=0, hook=guide)
        ids = batch.admit([prompt_ids], canvases=[4], generators=[torch.Generator().manual_seed(0)],
                          rows=[row_state])
        while batch.size:
            for row in batch.run_canvas():
                print(row.id, row.tokens)
    """

    def __init__(self, model, *, settings: DiffusionSettings, eos_token_ids: Sequence[int], pad_token_id: int | None,
                 hook: StepHook | None = None, temperature_scale: float | None = None, top_p: float = 1.0):
        self.model = model
        self.settings = settings
        self.eos_token_ids = list(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.hook = hook
        self.temperature_scale = temperature_scale
        self.top_p = top_p
        self.run: Run | None = None
        self.last: Run | None = None     # the run that ended last (for its counters)
        self._next_id = 0

    # ------------------------------------------------------------------ state
    @property
    def size(self) -> int:
        """Rows in the batch now."""
        return 0 if self.run is None else len(self.run.row_ids)

    @property
    def width(self) -> int:
        """The batch's length in tokens (prompt columns and committed canvases); 0 when empty."""
        return 0 if self.run is None else self.run.cur_len

    @property
    def evicts(self) -> bool:
        """Whether finished rows leave at once (a hook that can drop rows; not the reproduction mode)."""
        return self.hook is not None and hasattr(self.hook, "keep_rows")

    def fits(self, prompt_len: int) -> bool:
        """Whether a prompt of ``prompt_len`` tokens can join now (it must fit the batch's length)."""
        return self.run is None or prompt_len <= self.run.cur_len or self.run.encoded == 0

    # ------------------------------------------------------------------ joining
    def _new_run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 generators: Sequence[torch.Generator] | None, canvases: Sequence[int]) -> Run:
        config, device = self.model.config, input_ids.device
        L = config.canvas_length
        B, cur_len = input_ids.shape
        attention_mask = attention_mask.bool()
        s = self.temperature_scale
        from transformers import DynamicCache

        return Run(
            model=self.model, settings=self.settings, hook=self.hook if self.hook is not None else NullHook(),
            reproduce=self.hook is None, generators=list(generators) if generators is not None else None,
            greedy=s == 0, scale=s if s not in (None, 0) else None, top_p=self.top_p, pad_token_id=self.pad_token_id,
            eos=torch.tensor(self.eos_token_ids, device=device),
            cache=DynamicCache(config=config.get_text_config(decoder=True)), attention_mask=attention_mask,
            dec_attn=torch.nn.functional.pad(attention_mask, (0, L), value=True),
            dec_pos=torch.arange(cur_len, cur_len + L, dtype=torch.int32, device=device).unsqueeze(0),
            cur_len=cur_len, sequences=input_ids, finished=torch.zeros(B, dtype=torch.bool, device=device),
            passes=torch.zeros(B, dtype=torch.int, device=device), clock=Clock(cuda=device.type == "cuda"),
            stopper=StableAndConfident(self.settings.stability_threshold, self.settings.confidence_threshold),
            row_ids=list(range(self._next_id, self._next_id + B)), starts=[cur_len] * B,
            canvases_left=torch.tensor(list(canvases), dtype=torch.int, device=device))

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, canvases: Sequence[int],
              generators: Sequence[torch.Generator] | None = None) -> list[int]:
        """Starts an empty batch on a left-padded ``[B, T]`` batch (``attention_mask`` 0 on the
        padding); returns the rows' ids. (:meth:`admit` takes unpadded prompts.)"""
        if self.run is not None:
            raise RuntimeError("the batch is running; use admit()")
        if generators is not None and len(generators) != input_ids.shape[0]:
            raise ValueError(f"{len(generators)} generators for {input_ids.shape[0]} rows")
        self.run = self._new_run(input_ids, attention_mask, generators, canvases)
        self._next_id += input_ids.shape[0]
        return list(self.run.row_ids)

    @torch.no_grad()
    def admit(self, prompts: Sequence[Sequence[int]], *, canvases: Sequence[int],
              generators: Sequence[torch.Generator], rows: Sequence[Any] | None = None) -> list[int]:
        """Rows join before the next canvas: ``prompts`` (token ids), the canvases each may run,
        one generator each, and the hook's state for each (``rows``, passed to ``hook.join``).
        Returns their ids. Every prompt must :meth:`fits`."""
        n = len(prompts)
        if not n:
            return []
        if len(generators) != n or len(canvases) != n or (rows is not None and len(rows) != n):
            raise ValueError("admit() needs one generator, canvas count (and hook row) per prompt")
        device = self.model.device
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        run = self.run
        if run is not None and not self.evicts:
            raise RuntimeError("joining a running batch needs a hook with join() and keep_rows()")
        width = max(len(p) for p in prompts)
        if run is not None:
            if run.encoded and width > run.cur_len:
                raise ValueError(f"a prompt of {width} tokens cannot join a batch {run.cur_len} tokens long")
            if width > run.cur_len:  # nothing encoded yet: the batch is left-padded further
                grow = width - run.cur_len
                run.sequences = torch.nn.functional.pad(run.sequences, (grow, 0), value=pad)
                run.attention_mask = torch.nn.functional.pad(run.attention_mask, (grow, 0), value=False)
                run.dec_attn = torch.nn.functional.pad(run.dec_attn, (grow, 0), value=False)
                run.starts = [st + grow for st in run.starts]
                run.cur_len = width
                run.dec_pos = run.dec_pos + grow
            width = run.cur_len
        ids = torch.full((n, width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((n, width), dtype=torch.bool, device=device)
        for i, p in enumerate(prompts):
            if len(p):
                ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long, device=device)
                mask[i, width - len(p):] = True
        if run is None:
            self.start(ids, mask, canvases=canvases, generators=generators)
            new_ids = list(self.run.row_ids)
        else:
            new = self._new_run(ids, mask, generators, canvases)
            if run.encoded:  # the columns the batch has cached, encoded for the new rows alone
                pos = torch.arange(0, run.encoded, dtype=torch.int32, device=device).unsqueeze(0)
                with run.clock.model():
                    enc = encode(self.model, ids[:, :run.encoded].contiguous(), mask[:, :run.encoded], new.cache, pos)
                cat_caches(run.cache, enc.past_key_values)
            run.sequences = torch.cat([run.sequences, ids])
            run.attention_mask = torch.cat([run.attention_mask, mask])
            run.dec_attn = torch.cat([run.dec_attn, new.dec_attn])
            run.finished = torch.cat([run.finished, new.finished])
            run.finished_rows = None
            run.passes = torch.cat([run.passes, new.passes])
            run.canvases_left = torch.cat([run.canvases_left, new.canvases_left])
            run.generators = list(run.generators or []) + list(generators)
            new_ids = list(new.row_ids)
            run.row_ids += new_ids
            run.starts += [width] * n
            self._next_id += n
        if rows is not None:
            self.run.hook.join(list(rows), self.run.canvases)
        return new_ids

    # ------------------------------------------------------------------ one canvas
    @torch.no_grad()
    def run_canvas(self, on_canvas: Callable[[int, torch.Tensor, list[int]], None] | None = None,
                   on_draft: Callable[[int, torch.Tensor, list[int]], None] | None = None) -> list[FinishedRow]:
        """Denoises and commits one canvas for every row; returns the rows that left.
        ``on_canvas(i, tokens[B, L], row_ids)`` sees the committed canvas, ``on_draft`` each draft."""
        run = self.run
        if run is None:
            return []
        canvas_index = run.canvases
        encode_committed(run)                                               # 1.a
        c = start_canvas(run, canvas_index)                                 # 1.b
        for cur_step in reversed(range(1, run.settings.max_denoising_steps + 1)):  # 1.c
            if not run.reproduce and all(d or f for d, f in zip(c.done_rows, c.finished_rows)):
                break
            denoise_step(run, c, cur_step)
            if on_draft is not None:
                on_draft(canvas_index, c.argmax, run.row_ids)
            if all(c.done_rows):
                break
        commit_canvas(run, c)                                               # 1.d
        pad_after_eos(run)                                                  # 1.e
        if on_canvas is not None:
            on_canvas(canvas_index, run.sequences[:, -run.L:], run.row_ids)
        run.canvases_left -= 1
        # one host read per canvas: who leaves, and their decoder passes
        flags, passes, finished = torch.stack([(run.finished | (run.canvases_left <= 0)).int(), run.passes.int(),
                                               run.finished.int()]).tolist()
        leaving, run.finished_rows = [bool(x) for x in flags], [bool(x) for x in finished]
        if not self.evicts and not all(leaving):
            leaving = [False] * len(leaving)   # rows stay until all are done (as model.generate)
        out = [FinishedRow(id=run.row_ids[b], tokens=run.sequences[b, run.starts[b]:], passes=passes[b])
               for b, gone in enumerate(leaving) if gone]
        if all(leaving):
            if self.evicts:
                run.hook.keep_rows([])
            self.last, self.run = run, None
            return out
        if out:
            _evict(run, [b for b, gone in enumerate(leaving) if not gone])
        next_canvas(run)                                                    # 1.f
        return out


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
    L = model.config.canvas_length
    B = input_ids.shape[0]
    batch = CanvasBatch(model, settings=settings, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, hook=hook,
                        temperature_scale=temperature_scale, top_p=top_p)
    batch.start(input_ids, attention_mask, canvases=[-(-max_new_tokens // L)] * B, generators=generators)
    fill = pad_token_id if pad_token_id is not None else eos_token_ids[0]

    def full(rows: torch.Tensor, ids: list[int]) -> torch.Tensor:  # rows that left are pad
        if len(ids) == B:
            return rows
        out = torch.full((B, rows.shape[1]), fill, dtype=rows.dtype, device=rows.device)
        out[ids] = rows
        return out

    canvas_cb = (lambda i, t, ids: on_canvas(i, full(t, ids))) if on_canvas is not None else None
    draft_cb = (lambda i, t, ids: on_draft(i, full(t, ids))) if on_draft is not None else None
    rows: dict[int, FinishedRow] = {}
    while batch.size:
        for row in batch.run_canvas(canvas_cb, draft_cb):
            rows[row.id] = row
    run = batch.last
    width = run.canvases * L
    new = torch.full((B, width), fill, dtype=input_ids.dtype, device=input_ids.device)
    passes = torch.zeros(B, dtype=torch.int, device=input_ids.device)
    for b, row in rows.items():
        new[b, :row.tokens.shape[0]] = row.tokens
        passes[b] = row.passes
    return LoopOutput(sequences=torch.cat([input_ids, new], dim=1), forward_passes=passes, canvases=run.canvases,
                      steps=run.steps, model_s=run.clock.model_s, hook_s=run.clock.hook_s)
