"""A job as a row of the worker's continuous scheduler (:func:`row_request`): prompt encoded,
constraint prepared with the job's options, a streaming job's committed canvases as its events.
Every request takes this one road (the static batch and its API feature detection are gone)."""
from __future__ import annotations

import secrets
import time
from typing import Any

from dgemma_struct.repair.preparation import prepare
from dgemma_struct.results import CanvasEvent
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.scheduling.requests import RowRequest

from .jobs import Job


#: the generation knobs a server request carries (the rest are the server's own: repairs, timeout)
JOB_KNOBS = ("max_new_tokens", "seed", "temperature", "top_p", "thinking", "max_thinking_tokens", "logprobs",
             "confidence")


def row_request(rt: DiffusionRuntime, job: Job, max_repairs: int, *, mode: str = "diffusion") -> RowRequest:
    """``job`` as a row for the continuous scheduler (prompt encoded, constraint prepared, its run
    deadline started; ``mode``: ``"diffusion"`` or ``"auto"``); a streaming job's committed
    canvases become its events."""
    if job.started is None:   # a rerun alone keeps the deadline its first run started
        job.start()
    o = job.options
    if o.seed is None:
        o = o.with_overrides(seed=secrets.randbits(62))
    session = None
    if job.spec is None:
        ids = rt.encode_prompt(job.prompt)
        rt.check_fits([ids], o.max_new_tokens)
    else:
        o = o.with_overrides(max_repairs=max_repairs, timeout_s=max(0.001, job.deadline - time.monotonic()))
        session = prepare(job.prompt, job.spec, rt, o)
        ids = session.prompt_ids
    req = RowRequest(prompt_ids=list(ids), max_new_tokens=o.max_new_tokens, seed=o.seed, session=session,
                     temperature=o.temperature, top_p=o.top_p,
                     stop=lambda: job.cancelled or time.monotonic() > job.deadline, tag=job, mode=mode,
                     logprobs=o.logprobs if session is None else None)
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
