"""A job as a row of the worker's continuous scheduler (:func:`row_request`): prompt encoded,
constraint prepared with the job's options, a streaming job's committed canvases as its events.
Every request takes this one road (the static batch and its API feature detection are gone)."""
from __future__ import annotations

import secrets
import time
from typing import Any

from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.preparation import prepare
from dgemma_struct.results import CanvasEvent
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.scheduling.scheduler import RowRequest

from .jobs import Job


def gen_kwargs(job: Job) -> dict[str, Any]:
    """The sampling, thinking and logprobs options of ``job`` (:class:`GenerateOptions` knobs)."""
    kw: dict[str, Any] = {}
    if job.temperature is not None:
        kw["temperature"] = job.temperature
    if job.top_p is not None:
        kw["top_p"] = job.top_p
    if job.thinking not in (False, None):
        kw["thinking"] = job.thinking
        if job.max_thinking_tokens is not None:
            kw["max_thinking_tokens"] = job.max_thinking_tokens
    if job.logprobs is not None:
        kw["logprobs"] = job.logprobs
    return kw


def row_request(rt: DiffusionRuntime, job: Job, max_repairs: int, *, mode: str = "diffusion") -> RowRequest:
    """``job`` as a row for the continuous scheduler (prompt encoded, constraint prepared, its run
    deadline started; ``mode``: ``"diffusion"`` or ``"auto"``); a streaming job's committed
    canvases become its events."""
    if job.started is None:   # a rerun alone keeps the deadline its first run started
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
                     stop=lambda: job.cancelled or time.monotonic() > job.deadline, tag=job, mode=mode,
                     logprobs=job.logprobs if session is None else None)
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
