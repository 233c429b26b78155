"""Streaming constrained generation: ``stream`` (committed canvases as events, the last one
validated) and ``stream_json`` (the value as it grows), with ``partial_json`` for drafts.

Example::

    >>> partial_json('{"a":[1,2')
    {'a': [1, 2]}
"""
from __future__ import annotations

import json
import typing
from typing import Any, Iterator

from dgemma_struct.constraints import JsonValidator
from dgemma_struct.errors import DgemmaStructError, GenerationFailed
from dgemma_struct.options import GenerateOptions
from dgemma_struct.prompts import Prompt
from dgemma_struct.repair.preparation import prepare
from dgemma_struct.results import CanvasEvent
from dgemma_struct.scheduling.run import stream_session
from dgemma_struct.runtime import DiffusionRuntime

# the knobs ``stream`` takes as keywords (the loop is diffusion; one repair, no fallback)
STREAM_KNOBS = ("max_new_tokens", "seed", "strict", "strict_objects", "whitespace", "timeout_s", "separators",
                "bounded_numbers", "field_budget", "confidence")
_STREAM_FIXED = dict(mode="diffusion", max_repairs=1, fallback=False, n=1, return_details=False)


def partial_json(text: str) -> Any:
    """The value of an unfinished JSON text, by pydantic-core's partial JSON parser
    (``from_json(..., allow_partial="trailing-strings")``): open strings, arrays and objects are
    closed, an incomplete trailing key or literal is dropped. Returns ``None`` when nothing parses.

    >>> partial_json('{"a":"hel')
    {'a': 'hel'}
    """
    return JsonValidator.partial(text)


def _partial_instance(model: type, data: Any) -> Any:
    """A pydantic instance built from a partial value without validation (``model_construct``,
    nested models too): what a streaming UI shows while the answer grows."""
    from pydantic import BaseModel

    if not (isinstance(model, type) and issubclass(model, BaseModel)) or not isinstance(data, dict):
        return data
    values = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in data:
            continue
        v, ann = data[key], field.annotation
        sub = [a for a in (typing.get_args(ann) or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(v, dict) and sub:
            v = _partial_instance(sub[0], v)
        elif isinstance(v, list):
            inner = [a for a in typing.get_args(ann) for a in (typing.get_args(a) or (a,))
                     if isinstance(a, type) and issubclass(a, BaseModel)]
            if inner:
                v = [_partial_instance(inner[0], x) if isinstance(x, dict) else x for x in v]
        values[name] = v
    return model.model_construct(**values)


def stream(prompt: Prompt, spec: Any, *, runtime: DiffusionRuntime | None = None,
           temperature: float | None = None, top_p: float | None = None,
           options: GenerateOptions | None = None, **knobs: Any) -> Iterator[CanvasEvent]:
    """Streams committed canvases of a constrained diffusion run as partial text (and, for JSON,
    ``event.value`` = the partial value, :func:`partial_json`). Every event before the last has
    ``validated=False``. The final event (``done=True``, ``validated=True``) carries the validated
    value; if validation fails (after one repair, as a non-streaming call would) the stream raises
    a typed error instead of ending with bad data.

    Keywords: ``max_new_tokens`` (128), ``seed`` (0), ``strict``, ``strict_objects``, ``whitespace``, ``timeout_s``,
    ``separators``, ``bounded_numbers``, ``field_budget``, ``confidence`` (the final event's
    ``confidence``), ``temperature`` and ``top_p`` (``None``: from ``options``, default 1.0), as in
    :func:`~dgemma_struct.api.generate`; they override ``options``. The loop is always diffusion."""
    sampling = {k: v for k, v in (("temperature", temperature), ("top_p", top_p)) if v is not None}
    opts = GenerateOptions.build(options, {**knobs, **sampling}, verb="stream",
                                 allowed=STREAM_KNOBS + ("temperature", "top_p")).with_overrides(**_STREAM_FIXED)
    session = prepare(prompt, spec, runtime, opts)
    run = stream_session(session.rt, session)   # the batch road, one row
    index = 0
    while True:
        try:
            token_ids = next(run)
        except StopIteration as end:
            result = end.value
            break
        text = session.rt.decode(token_ids)
        yield CanvasEvent(row=0, canvas_index=index, token_ids=token_ids, text=text,
                          value=session.c.partial_value(text))
        index += 1
    if isinstance(result, DgemmaStructError):
        raise result
    if result is None:  # pragma: no cover - the scheduler always ends a row with a result
        raise GenerationFailed("the stream ended without a result")
    yield CanvasEvent.final(result, validated=True, value=result.value)


def stream_json(prompt: Prompt, schema: Any, **opts: Any) -> Iterator[Any]:
    """Yields the value as it grows: for a pydantic model, partial instances built without
    validation (missing fields absent, strings possibly cut short) after each committed canvas,
    then, last, the validated instance; for a JSON Schema, partial JSON values then the valid one.
    Use :func:`stream` for the events themselves (``validated`` tells a draft from the final
    value). Options as :func:`stream`.

    >>> for person in stream_json("Extract as JSON.\\nAda is 36.", Person):   # doctest: +SKIP
    ...     print(person)
    """
    from pydantic import BaseModel

    model = schema if isinstance(schema, type) and issubclass(schema, BaseModel) else None
    last = None
    for ev in stream(prompt, schema, **opts):
        if ev.done:
            yield ev.value
            return
        if ev.value is None:
            continue
        value = _partial_instance(model, ev.value) if model is not None else ev.value
        key = json.dumps(ev.value, sort_keys=True, default=str)
        if key != last:  # only when the value grew
            last = key
            yield value
