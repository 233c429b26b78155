"""The event stream of ``POST /v1/responses`` with ``stream: true``, in the order the ``openai``
SDK's stream helpers (``client.responses.stream``) accumulate it: ``response.created``,
``response.in_progress``, then per output item ``response.output_item.added``, its deltas
(``response.content_part.added`` + ``response.output_text.delta`` ... ``.done`` +
``response.content_part.done`` for a message; ``response.function_call_arguments.delta`` / ``.done``;
``response.custom_tool_call_input.delta`` / ``.done``; ``response.reasoning_text.delta`` / ``.done``)
and ``response.output_item.done``, and last ``response.completed`` (``response.incomplete`` when
the answer ran out of budget). Every event carries a ``sequence_number``.

As the chat stream's default (:func:`.sse.stream_validated`), the rows ran and were validated (and
repaired) first: the stream never sends text that a repair later rewrites.

>>> [e["type"] for e in response_events({"status": "completed", "output": []})]
['response.created', 'response.in_progress', 'response.completed']
"""
from __future__ import annotations

import copy
import json
from typing import Any, Iterator

from fastapi.responses import StreamingResponse

from .sse import DELTA_CHARS, SSE_HEADERS


def _pieces(text: str) -> list[str]:
    return [text[k:k + DELTA_CHARS] for k in range(0, len(text), DELTA_CHARS)]


def _item_events(item: dict[str, Any], index: int) -> Iterator[dict[str, Any]]:
    """The events of one finished output item, from ``output_item.added`` to ``output_item.done``."""
    kind, iid = item["type"], item["id"]
    at = {"item_id": iid, "output_index": index}
    if kind == "message":
        yield {"type": "response.output_item.added", "output_index": index,
               "item": {**item, "status": "in_progress", "content": []}}
        for j, part in enumerate(item["content"]):
            yield {"type": "response.content_part.added", **at, "content_index": j,
                   "part": {**part, "text": "", "logprobs": []}}
            for piece in _pieces(part["text"]):
                yield {"type": "response.output_text.delta", **at, "content_index": j, "delta": piece, "logprobs": []}
            yield {"type": "response.output_text.done", **at, "content_index": j, "text": part["text"],
                   "logprobs": []}
            yield {"type": "response.content_part.done", **at, "content_index": j, "part": part}
    elif kind == "function_call":
        yield {"type": "response.output_item.added", "output_index": index,
               "item": {**item, "arguments": "", "status": "in_progress"}}
        for piece in _pieces(item["arguments"]):
            yield {"type": "response.function_call_arguments.delta", **at, "delta": piece}
        yield {"type": "response.function_call_arguments.done", **at, "name": item["name"],
               "arguments": item["arguments"]}
    elif kind == "custom_tool_call":
        yield {"type": "response.output_item.added", "output_index": index, "item": {**item, "input": ""}}
        for piece in _pieces(item["input"]):
            yield {"type": "response.custom_tool_call_input.delta", **at, "delta": piece}
        yield {"type": "response.custom_tool_call_input.done", **at, "input": item["input"]}
    else:   # reasoning
        yield {"type": "response.output_item.added", "output_index": index,
               "item": {**item, "content": [], "status": "in_progress"}}
        for j, part in enumerate(item.get("content") or []):
            for piece in _pieces(part["text"]):
                yield {"type": "response.reasoning_text.delta", **at, "content_index": j, "delta": piece}
            yield {"type": "response.reasoning_text.done", **at, "content_index": j, "text": part["text"]}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def response_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of the stream of ``body`` (a finished ``response`` object), numbered."""
    start = copy.deepcopy(body)
    start.update(status="in_progress", output=[], output_text="", usage=None, incomplete_details=None)
    events = [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start}]
    for i, item in enumerate(body["output"]):
        events.extend(_item_events(item, i))
    done = "response.completed" if body["status"] == "completed" else "response.incomplete"
    events.append({"type": done, "response": body})
    return [{**e, "sequence_number": k} for k, e in enumerate(events)]


def stream_response(body: dict[str, Any]) -> StreamingResponse:
    """The SSE response of :func:`response_events` (``event:`` and ``data:`` lines, as OpenAI sends them)."""
    def lines() -> Iterator[str]:
        for e in response_events(body):
            yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream", headers=SSE_HEADERS)
