"""Server-sent events: the default stream (validated rows sent as deltas, :func:`stream_validated`)
and ``stream_live`` (canvases sent as they commit, :func:`stream_live`). Every event is a
``data:`` line holding a chunk model of :mod:`.responses`; the stream ends with ``data: [DONE]``."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi.responses import StreamingResponse

from dgemma_struct.options import GenerateOptions
from dgemma_struct.errors import LengthError

from .http_errors import APIError, api_error_for
from .logprobs import chat_logprobs, completion_logprobs, delta_groups
from .protocol import apply_stop
from .responses import (ChatChunkChoice, ChatCompletionChunk, ChatDelta, CompletionChunk, CompletionChunkChoice,
                        StreamError, Usage)
from .state import ServerState

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE_EVENT = "data: [DONE]\n\n"
#: Characters of text per delta of the default stream.
DELTA_CHARS = 16


def sse_event(body: dict[str, Any]) -> str:
    """One ``data:`` event (ASCII escapes: a lone surrogate in a message cannot break the encoding)."""
    return "data: " + json.dumps(body) + "\n\n"


def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


class Chunker:
    """The events of one streamed answer (``chat.completion.chunk`` or ``text_completion``)."""

    def __init__(self, rid: str, model: str, chat: bool):
        self.rid, self.model, self.chat = rid, model, chat
        self.created = int(time.time())

    def chunk(self, text: str | None, finish: str | None, *, index: int = 0, role: bool = False,
              extra: dict | None = None, reasoning: str | None = None, choice_extra: dict | None = None) -> str:
        """A chunk of one choice: its text (and thought) delta, or its finish reason."""
        head = dict(id=self.rid, created=self.created, model=self.model, **(extra or {}))
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if text is not None:
                delta["content"] = text
            choice = ChatChunkChoice(index=index, delta=ChatDelta(**delta), finish_reason=finish,
                                     **(choice_extra or {}))
            return sse_event(ChatCompletionChunk(**head, choices=[choice]).wire())
        thought = {"reasoning_content": reasoning} if reasoning is not None else {}
        choice = CompletionChunkChoice(index=index, text=text or "", finish_reason=finish, **thought,
                                       **(choice_extra or {}))
        return sse_event(CompletionChunk(**head, choices=[choice]).wire())

    def usage(self, prompt: int, completion: int) -> str:
        """The last chunk with ``stream_options.include_usage``: no choices, the token counts."""
        cls = ChatCompletionChunk if self.chat else CompletionChunk
        return sse_event(cls(id=self.rid, created=self.created, model=self.model, choices=[],
                             usage=Usage.of(prompt, completion)).wire())


def _include_usage(req: Any) -> bool:
    return bool((req.stream_options or {}).get("include_usage"))


def _deltas(text: str, ents: list | None, chat: bool) -> list[tuple[str, dict | None]]:
    """``(delta text, choice extra)`` pairs of one row: plain ``DELTA_CHARS`` slices, or with
    logprob entries, slices at token boundaries carrying the entries of their tokens."""
    if ents is None:
        return [(text[k:k + DELTA_CHARS], None) for k in range(0, len(text), DELTA_CHARS)]
    return [(piece, {"logprobs": chat_logprobs(group) if chat else completion_logprobs(group, base=at)})
            for piece, group, at in delta_groups(ents, text, DELTA_CHARS)]


def stream_validated(state: ServerState, req: Any, rid: str, rows: list[tuple], n_prompt: int, *,
                     chat: bool, extras: list[dict] | None = None,
                     entries: list[list | None] | None = None) -> StreamingResponse:
    """The default stream: the rows ran (and were validated and repaired) exactly as without
    streaming, then their text goes out as deltas. A stream therefore never diverges from
    what was sent, and every failure is a plain HTTP error before the stream starts.
    ``entries``: per row, its logprob entries (each delta then carries those of its tokens)."""
    chunker = Chunker(rid, state.model_id, chat)
    chunk = chunker.chunk
    include_usage = _include_usage(req)

    async def sse() -> AsyncIterator[str]:
        for i, (text, finish, _, stats) in enumerate(rows):
            extra = dict(extras[i]) if extras else {}
            thought = extra.pop("reasoning_content", None) or ""
            if chat:
                yield chunk("", None, index=i, role=True)
            for k in range(0, len(thought), DELTA_CHARS):   # the thought first, as vLLM streams it
                yield chunk(None if chat else "", None, index=i, reasoning=thought[k:k + DELTA_CHARS])
            for piece, more in _deltas(text, entries[i] if entries is not None else None, chat):
                yield chunk(piece, None, index=i, choice_extra=more)
            yield chunk(None if chat else "", finish, index=i, choice_extra=extra or None,
                        extra={"dgemma_stats": stats} if stats else None)
        if include_usage:
            yield chunker.usage(n_prompt, sum(r[2] for r in rows))
        yield DONE_EVENT

    return event_stream(sse())


async def stream_live(state: ServerState, req: Any, prompt: Any, constraint: Any, options: GenerateOptions,
                      n_prompt: int, stops: list[str], *, chat: bool) -> StreamingResponse:
    """``stream_live``: committed canvases go out as they are produced. A repair may rewrite
    text already sent; the stream then ends with a 422 ``stream_diverged`` error event."""
    events = state.batcher.stream(prompt, constraint, options, timeout_s=state.config.request_timeout_s)
    try:
        first = await events.__anext__()   # errors before the first canvas are plain HTTP errors
    except StopAsyncIteration:
        first = None
    except asyncio.CancelledError:
        await events.aclose()
        raise
    except LengthError as err:
        await events.aclose()
        first = err
    except Exception as err:  # noqa: BLE001
        await events.aclose()
        raise api_error_for(err) from None
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    chunker = Chunker(rid, state.model_id, chat)
    chunk = chunker.chunk
    include_usage = _include_usage(req)
    hold = max((len(s) for s in stops), default=1) - 1   # a stop may straddle two canvases

    async def sse() -> AsyncIterator[str]:
        sent = ""
        canvases = 0
        try:
            if chat:
                yield chunk("", None, role=True)
            ev = first
            while ev is not None:
                if isinstance(ev, LengthError):
                    text = ev.partial_text or ""
                    if text.startswith(sent) and len(text) > len(sent):
                        yield chunk(text[len(sent):], None)
                    yield chunk(None if chat else "", "length")
                    if include_usage:
                        yield chunker.usage(n_prompt, state.count_tokens(text))
                    yield DONE_EVENT
                    return
                cut = apply_stop(ev.text, stops) if stops else None
                if not ev.done and cut is None:
                    canvases += 1
                    safe = ev.text[:len(ev.text) - hold] if stops and hold else ev.text
                    if safe.startswith(sent) and len(safe) > len(sent):
                        yield chunk(safe[len(sent):], None)
                        sent = safe
                else:
                    text = cut if cut is not None else ev.text
                    if not text.startswith(sent):
                        raise APIError(422, "a repair rewrote text already streamed; retry without "
                                            "stream_live (the default stream never diverges)",
                                       type="generation_error", code="stream_diverged")
                    if len(text) > len(sent):
                        yield chunk(text[len(sent):], None)
                    finish = "stop" if cut is not None else (getattr(ev, "finish_reason", None) or "stop")
                    completion = state.count_tokens(text) if cut is not None else len(ev.token_ids)
                    stats = ev.stats.to_dict() if getattr(ev, "stats", None) is not None else {}
                    yield chunk(None if chat else "", finish if finish in ("stop", "length") else "stop",
                                extra={"dgemma_stats": {"canvases": canvases, **stats, "streamed_canvases": canvases}})
                    if include_usage:
                        yield chunker.usage(n_prompt, completion)
                    yield DONE_EVENT
                    return
                try:
                    ev = await events.__anext__()
                except StopAsyncIteration:
                    ev = None
                except LengthError as err:
                    ev = err
            raise APIError(500, "the stream ended without a validated output", type="server_error",
                           code="stream_incomplete")
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except BaseException as err:  # noqa: BLE001 - ends the stream with an error event, never "stop"
            e = api_error_for(err)
            yield sse_event(StreamError(error={**e.body()["error"], "status": e.status}).wire())
        finally:
            await events.aclose()

    return event_stream(sse())
