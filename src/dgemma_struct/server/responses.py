"""Response bodies of the OpenAI-compatible endpoints, as pydantic models (the routes declare them
as ``response_model``, so ``/openapi.json`` carries their schemas).

A field named in a model's ``optional`` set is on the wire only when it was given (an extension
such as ``reasoning_content`` or ``grounding``, or a field OpenAI sends only sometimes); every
other field is always sent, ``null`` included. :meth:`Wire.wire` gives the JSON-ready dict.

>>> Usage.of(3, 4).wire()
{'prompt_tokens': 3, 'completion_tokens': 4, 'total_tokens': 7}
>>> AssistantMessage(content="hi").wire()
{'role': 'assistant', 'content': 'hi', 'refusal': None}
>>> AssistantMessage(content="hi", reasoning_content=None).wire()["reasoning_content"] is None
True
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from .http_errors import safe_json_bytes

__all__ = ["Wire", "Usage", "FunctionCall", "CustomCall", "CustomCallDelta", "ToolCallOut", "AssistantMessage", "ChatChoice", "ChatCompletion",
           "CompletionChoice", "Completion", "FunctionCallDelta", "ToolCallDelta", "ChatDelta", "ChatChunkChoice",
           "ChatCompletionChunk", "CompletionChunkChoice", "CompletionChunk", "ModelCard", "ModelList", "Health",
           "ErrorDetail", "ErrorResponse", "StreamError", "error_responses", "json_response"]


class Wire(BaseModel):
    """A part of a response body; see the module docstring for which fields are sent."""

    optional: ClassVar[frozenset[str]] = frozenset()

    def model_post_init(self, context: Any) -> None:
        self.__pydantic_fields_set__.update(n for n in type(self).model_fields if n not in self.optional)

    def wire(self) -> dict[str, Any]:
        """The body as a JSON-ready dict (optional fields only when given)."""
        return self.model_dump(exclude_unset=True)


class Usage(Wire):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, completion: int) -> "Usage":
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


# ------------------------------------------------------------------ chat.completion / text_completion
class FunctionCall(Wire):
    name: str
    arguments: str                  # a JSON object, as text (OpenAI's shape)


class CustomCall(Wire):
    name: str
    input: str                      # a custom tool's free-form input (it matches the tool's grammar)


class ToolCallOut(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"function", "custom"})
    id: str
    type: Literal["function", "custom"] = "function"
    function: Optional[FunctionCall] = None
    custom: Optional[CustomCall] = None


class AssistantMessage(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"reasoning_content", "function_call", "tool_calls"})
    role: Literal["assistant"] = "assistant"
    content: Optional[str] = None
    refusal: Optional[str] = None
    reasoning_content: Optional[str] = None     # the thought (vLLM's name), when thinking was asked for
    function_call: Optional[FunctionCall] = None   # legacy ``functions`` requests
    tool_calls: Optional[list[ToolCallOut]] = None


class ChatChoice(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"grounding", "choice_probabilities", "field_confidence"})
    index: int
    message: AssistantMessage
    logprobs: Optional[Any] = None
    finish_reason: str
    grounding: Optional[dict[str, Any]] = None  # ``{"spans": [...]}`` of a grounded answer
    choice_probabilities: Optional[dict[str, float]] = None  # ``{option: p}`` (extension)
    field_confidence: Optional[dict[str, float]] = None      # ``{JSON Pointer: p}`` (extension)


class ChatCompletion(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"dgemma_stats"})
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    system_fingerprint: Optional[str] = None
    usage: Usage
    dgemma_stats: Optional[Any] = None          # the generation stats (a list when there are several rows)


class CompletionChoice(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"reasoning_content", "grounding", "choice_probabilities",
                                                    "field_confidence"})
    index: int
    text: str
    logprobs: Optional[Any] = None
    finish_reason: str
    reasoning_content: Optional[str] = None
    grounding: Optional[dict[str, Any]] = None
    choice_probabilities: Optional[dict[str, float]] = None
    field_confidence: Optional[dict[str, float]] = None


class Completion(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"dgemma_stats"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    system_fingerprint: Optional[str] = None
    usage: Usage
    dgemma_stats: Optional[Any] = None


# ------------------------------------------------------------------ streaming chunks (SSE ``data:``)
class FunctionCallDelta(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"name"})
    name: Optional[str] = None
    arguments: str


class CustomCallDelta(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"name"})
    name: Optional[str] = None
    input: str


class ToolCallDelta(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"id", "type", "function", "custom"})
    index: int
    id: Optional[str] = None
    type: Optional[Literal["function", "custom"]] = None
    function: Optional[FunctionCallDelta] = None
    custom: Optional[CustomCallDelta] = None


class ChatDelta(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"role", "reasoning_content", "content", "function_call",
                                                     "tool_calls"})
    role: Optional[Literal["assistant"]] = None
    reasoning_content: Optional[str] = None
    content: Optional[str] = None
    function_call: Optional[FunctionCallDelta] = None
    tool_calls: Optional[list[ToolCallDelta]] = None


class ChatChunkChoice(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"grounding", "field_confidence"})
    index: int
    delta: ChatDelta
    logprobs: Optional[Any] = None
    finish_reason: Optional[str] = None
    grounding: Optional[dict[str, Any]] = None
    field_confidence: Optional[dict[str, float]] = None


class ChatCompletionChunk(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"system_fingerprint", "usage", "dgemma_stats"})
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None               # the last chunk, with ``stream_options.include_usage``
    dgemma_stats: Optional[Any] = None


class CompletionChunkChoice(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"reasoning_content", "grounding", "choice_probabilities",
                                                    "field_confidence"})
    index: int
    text: str
    logprobs: Optional[Any] = None
    finish_reason: Optional[str] = None
    reasoning_content: Optional[str] = None
    grounding: Optional[dict[str, Any]] = None
    field_confidence: Optional[dict[str, float]] = None


class CompletionChunk(Wire):
    optional: ClassVar[frozenset[str]] = frozenset({"usage", "dgemma_stats"})
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Optional[Usage] = None
    dgemma_stats: Optional[Any] = None


# ------------------------------------------------------------------ models, health, errors
class ModelCard(Wire):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dgemma-struct"


class ModelList(Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(Wire):
    """``/health``: ``status`` (``ok``, ``loading``, ``warming_up``, ``draining`` or ``worker_down``);
    once loaded, the model id, the queue depth, readiness (``ready``, ``warmed``, ``draining``,
    ``warmup_s``), the batcher's counters, the remembered verdicts and the compile workers' counters."""

    model_config = ConfigDict(extra="allow")
    optional: ClassVar[frozenset[str]] = frozenset({"model", "queue_depth", "compile_workers", "ready", "warmed",
                                                    "draining", "warmup_s", "warmup_error", "in_flight",
                                                    "running_rows", "worker_errors", "verdicts"})
    status: str
    model: Optional[str] = None
    queue_depth: Optional[int] = None
    ready: Optional[bool] = None
    warmed: Optional[bool] = None
    draining: Optional[bool] = None
    warmup_s: Optional[float] = None
    warmup_error: Optional[str] = None
    in_flight: Optional[int] = None
    running_rows: Optional[int] = None
    worker_errors: Optional[int] = None
    verdicts: Optional[dict[str, Any]] = None
    compile_workers: Optional[dict[str, Any]] = None


class ErrorDetail(Wire):
    message: str
    type: str
    param: Optional[str] = None
    code: str


class ErrorResponse(Wire):
    """Every error response: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


class StreamError(Wire):
    """The last event of a stream that failed after it started (``error.status``: the HTTP status
    the same failure would have had)."""

    error: dict[str, Any]


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: the error body at each of ``statuses``."""
    return {s: {"model": ErrorResponse, "description": "an OpenAI-style error"} for s in statuses}


def json_response(body: Wire | dict[str, Any], status: int = 200, headers: dict | None = None) -> Response:
    """A JSON response of ``body`` (ASCII escapes: user text with a lone surrogate cannot break it)."""
    return Response(safe_json_bytes(body.wire() if isinstance(body, Wire) else body), status_code=status,
                    media_type="application/json", headers=headers)
