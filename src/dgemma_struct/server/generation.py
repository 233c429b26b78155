"""The calls the batch worker makes into the SDK: a job as a continuous-batching row
(:func:`row_request`), and, the static way, a group of constrained rows through
:func:`dgemma_struct.api.generate_batch`, free-text rows through the runtime, and streams through
:func:`dgemma_struct.api.stream`. Options the installed API lacks are feature-detected and left
out, so the server runs against an API without them."""
from __future__ import annotations

import dataclasses
import inspect
import secrets
import time
from typing import Any, Iterator

import dgemma_struct.api as api
from dgemma_struct.scheduling.scheduler import RowRequest
from dgemma_struct.errors import DgemmaStructError
from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.preparation import prepare
from dgemma_struct.results import CanvasEvent
from dgemma_struct.runtime import DiffusionRuntime

from .jobs import Job


def accepts(fn: Any, name: str) -> bool:
    """Whether ``fn`` takes a parameter called ``name``."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _per_row_seeds(fn: Any) -> bool:
    """Whether ``fn``'s ``seed`` takes one seed per row (every row then has its own generator)."""
    try:
        return "Sequence" in str(inspect.signature(fn).parameters["seed"].annotation)
    except (TypeError, ValueError, KeyError):
        return False


def per_row_seeds(runtime: DiffusionRuntime) -> bool:
    """Whether both the API and ``runtime`` seed each row of a batch on its own."""
    return _per_row_seeds(api.generate_batch) and _per_row_seeds(runtime.generate_ids)


def group_seed(runtime: DiffusionRuntime, group: list[Job]) -> Any:
    """One seed per row (a fresh one for ``seed=None``), or one seed for the whole group when the
    API takes only one."""
    if per_row_seeds(runtime):
        return [j.seed if j.seed is not None else secrets.randbits(62) for j in group]
    first = group[0]
    return first.seed if first.seed is not None else secrets.randbits(62)


def gen_kwargs(job: Job) -> dict[str, Any]:
    """Sampling and thinking options of ``job`` that ``generate_batch`` accepts."""
    kw: dict[str, Any] = {}
    if job.temperature is not None and accepts(api.generate_batch, "temperature"):
        kw["temperature"] = job.temperature
    if job.top_p is not None and accepts(api.generate_batch, "top_p"):
        kw["top_p"] = job.top_p
    if job.thinking not in (False, None):
        kw["thinking"] = job.thinking     # generate_batch takes it (the server checked)
        if job.max_thinking_tokens is not None:
            kw["max_thinking_tokens"] = job.max_thinking_tokens
    if job.logprobs is not None:
        kw["logprobs"] = job.logprobs     # a GenerateOptions knob
    return kw


def constrained_rows(runtime: DiffusionRuntime, group: list[Job], seed: Any, timeout: float,
                     max_repairs: int) -> list[Any]:
    """Results (or per-row exceptions) of a group of constrained jobs, run as one batched loop. A
    row whose caller timed out or went away leaves the batch at the next step."""
    first = group[0]
    return api.generate_batch([j.prompt for j in group], [j.spec for j in group], runtime=runtime,
                              max_new_tokens=first.max_new_tokens, seed=seed, max_repairs=max_repairs,
                              timeout_s=timeout, return_exceptions=True,
                              row_stop=[(lambda j=j: j.cancelled or time.monotonic() > j.deadline) for j in group],
                              **gen_kwargs(first))


def free_text_rows(rt: DiffusionRuntime, group: list[Job], seed: Any) -> list[Any]:
    """Unconstrained rows (``response_format`` ``text``), capped at ``max_new_tokens``."""
    out: list[Any] = [None] * len(group)
    encoded = []
    for i, j in enumerate(group):
        try:
            ids = rt.encode_prompt(j.prompt)
            rt.check_fits([ids], j.max_new_tokens)
            encoded.append((i, ids))
        except DgemmaStructError as err:
            out[i] = err
    if encoded:
        if isinstance(seed, list):
            seed = [seed[i] for i, _ in encoded]
        kw: dict[str, Any] = {}
        first = group[0]
        temp = first.temperature
        if accepts(rt.generate_ids, "top_p") and first.top_p is not None:
            kw["top_p"] = first.top_p
        if temp is not None:
            if accepts(rt.generate_ids, "temperature") and accepts(api.generate_batch, "temperature"):
                kw["temperature"] = temp       # the runtime scales its own schedule
            else:                              # scale the diffusion temperature schedule here
                f = max(temp, 0.01)
                kw["settings"] = dataclasses.replace(rt.settings, t_min=rt.settings.t_min * f,
                                                     t_max=rt.settings.t_max * f)
        if first.logprobs is not None:
            kw["logprobs"] = first.logprobs
        res = rt.generate_ids([ids for _, ids in encoded], max_new_tokens=first.max_new_tokens, seed=seed, **kw)
        for (i, _), r in zip(encoded, res):
            if len(r.token_ids) > first.max_new_tokens:
                r.token_ids = r.token_ids[:first.max_new_tokens]
                if r.logprobs is not None:
                    r.logprobs = r.logprobs[:first.max_new_tokens]
                r.text = rt.decode(r.token_ids)
                r.stats.finish_reason = "length"
            r.value = r.text
            out[i] = r
    return out


def stream_events(rt: DiffusionRuntime, job: Job, timeout: float) -> Iterator[Any]:
    """The canvas events of one streaming job (free text: the runtime's stream; ``value`` is set on
    the last event)."""
    seed = job.seed if job.seed is not None else secrets.randbits(62)
    kw = {k: v for k, v in (("temperature", job.temperature), ("top_p", job.top_p)) if v is not None}
    if job.spec is None:
        kw = {k: v for k, v in kw.items() if accepts(rt.stream, k)}
        gen = rt.stream(job.prompt, max_new_tokens=job.max_new_tokens, seed=seed, **kw)
    else:
        kw = {k: v for k, v in kw.items() if accepts(api.stream, k)}
        gen = api.stream(job.prompt, job.spec, runtime=rt, max_new_tokens=job.max_new_tokens, seed=seed,
                         timeout_s=timeout, **kw)
    try:
        for ev in gen:
            if ev.done and job.spec is None:
                ev.value = ev.text
            yield ev
    finally:
        gen.close()


def row_request(rt: DiffusionRuntime, job: Job, max_repairs: int, *, mode: str = "diffusion") -> RowRequest:
    """``job`` as a row for the continuous scheduler (prompt encoded, constraint prepared, its run
    deadline started; ``mode``: ``"diffusion"`` or ``"auto"``); a streaming job's committed
    canvases become its events."""
    job.start()
    seed = job.seed if job.seed is not None else secrets.randbits(62)
    session = None
    temperature, top_p = job.temperature, job.top_p if job.top_p is not None else 1.0
    if job.spec is None:
        ids = rt.encode_prompt(job.prompt)
        rt.check_fits([ids], job.max_new_tokens)
    else:
        knobs = dict(max_new_tokens=job.max_new_tokens, seed=seed, max_repairs=max_repairs,
                     timeout_s=max(0.001, job.deadline - time.monotonic()), **gen_kwargs(job))
        session = prepare(job.prompt, job.spec, rt, GenerateOptions.build(None, knobs, verb="generate"))
        ids, seed = session.prompt_ids, session.seed
        temperature, top_p = session.opts.temperature, session.opts.top_p
    req = RowRequest(prompt_ids=list(ids), max_new_tokens=job.max_new_tokens, seed=seed, session=session,
                     temperature=temperature, top_p=top_p,
                     stop=lambda: job.cancelled or time.monotonic() > job.deadline, tag=job, mode=mode)
    if job.streaming:
        req.on_canvas = _canvas_events(rt, job, session)
    return req


def _canvas_events(rt: DiffusionRuntime, job: Job, session: Any):
    """Each committed canvas as an unvalidated event (a JSON stream carries the partial value)."""
    counter = iter(range(1 << 30))

    def on_canvas(token_ids: list[int]) -> None:
        text = rt.decode(token_ids)
        value = session.c.partial_value(text) if session is not None else None
        job.push(CanvasEvent(row=0, canvas_index=next(counter), token_ids=token_ids, text=text, value=value))
    return on_canvas
