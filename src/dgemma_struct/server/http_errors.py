"""The server's errors: OpenAI-style error bodies, and ONE table mapping dgemma-struct's typed errors
(and the server's own: a full queue, shutting down, a bad tool request) to HTTP statuses.

Every error the server sends has the shape OpenAI's API uses::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "response_format", "code": "invalid_schema"}}

>>> import dgemma_struct.errors as E
>>> e = api_error_for(E.RegexError("bad regex"), param="guided_regex")
>>> (e.status, e.code, e.param)
(400, 'invalid_regex', 'guided_regex')
>>> api_error_for(QueueFull("full")).status
429
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

import dgemma_struct.errors as E
from dgemma_struct.tools import ToolCallError

from dgemma_struct.constraints.compile_pool import CompileCrashed, PoolBusy, PoolUnavailable

__all__ = ["APIError", "QueueFull", "ShuttingDown", "ToolRequestError", "api_error_for", "error_body",
           "bounded", "default_code", "safe_json_bytes", "MAX_MESSAGE_CHARS", "ERROR_TABLE_MD"]

MAX_MESSAGE_CHARS = 1000

_DEFAULT_CODES = {400: "invalid_request", 401: "invalid_api_key", 403: "forbidden", 404: "not_found",
                  405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large",
                  415: "unsupported_media_type", 422: "generation_failed", 429: "rate_limited",
                  500: "internal_error", 503: "unavailable", 504: "timeout"}


class QueueFull(Exception):
    """The request queue is full (the server answers 429)."""


class ShuttingDown(Exception):
    """The batcher is stopped (the server answers 503)."""


class ToolRequestError(ToolCallError):
    """A bad tool-calling request: an HTTP 400 with OpenAI's ``param`` and a precise ``code``."""

    def __init__(self, message: str, *, param: str, code: str):
        super().__init__(message)
        self.param = param
        self.code = code


def default_code(status: int) -> str:
    """The ``code`` of an error that has no more precise one (a ``code`` is never null)."""
    return _DEFAULT_CODES.get(status, "server_error" if status >= 500 else "invalid_request")


def bounded(message: str, limit: int | None = None) -> str:
    """``message`` cut to ``limit`` characters (a 100 KB grammar is never echoed back)."""
    limit = MAX_MESSAGE_CHARS if limit is None else limit
    message = str(message)
    if len(message) <= limit:
        return message
    return message[:limit] + f"... ({len(message) - limit} more characters)"


def safe_json_bytes(body: Any) -> bytes:
    """JSON bytes of ``body``; lone surrogates in strings (from user input) are escaped, never an
    encoding error."""
    return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")


class APIError(Exception):
    """An error response: HTTP ``status`` plus the OpenAI error fields. ``code`` defaults to a
    generic code for the status; the message is bounded."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        message = bounded(message)
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code or default_code(status)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_body(status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return APIError(status, message, type=type, param=param, code=code).body()


# (class, status, type, code); the first matching class wins, so subclasses come first.
# A ToolRequestError carries its own param and code.
_TABLE: list[tuple[type, int, str, str]] = [
    (ToolRequestError, 400, "invalid_request_error", "(its own code)"),
    (E.ConstraintCompileTimeout, 400, "invalid_request_error", "constraint_too_complex"),
    (E.UnsupportedKeywordError, 400, "invalid_request_error", "unsupported_schema_keyword"),
    (E.SchemaError, 400, "invalid_request_error", "invalid_schema"),
    (E.RegexError, 400, "invalid_request_error", "invalid_regex"),
    (E.GrammarError, 400, "invalid_request_error", "invalid_grammar"),
    (E.ChoiceError, 400, "invalid_request_error", "invalid_choice"),
    (E.GroundingError, 400, "invalid_request_error", "invalid_grounding"),
    (E.ConstraintError, 400, "invalid_request_error", "invalid_constraint"),
    (CompileCrashed, 400, "invalid_request_error", "constraint_engine_crash"),
    (E.ConstraintEngineError, 400, "invalid_request_error", "constraint_engine_error"),
    (E.PromptTooLongError, 400, "invalid_request_error", "context_length_exceeded"),
    (E.InvalidRequestError, 400, "invalid_request_error", "invalid_request"),
    (E.LengthError, 422, "generation_error", "length_exceeded"),
    (E.GenerationFailed, 422, "generation_error", "generation_failed"),
    (QueueFull, 429, "rate_limit_error", "queue_full"),
    (E.GenerationTimeout, 504, "timeout_error", "timeout"),
    (E.ModelLoadError, 503, "server_error", "model_unavailable"),
    (ShuttingDown, 503, "server_error", "unavailable"),
    (PoolBusy, 503, "server_error", "overloaded"),
    (PoolUnavailable, 503, "server_error", "unavailable"),
]

_EMPTY_MESSAGES = {E.GenerationTimeout: "the request timed out"}


def _param_for(err: BaseException, param: str | None) -> str | None:
    """Which request field an error names: the constraint's for constraint errors, ``max_tokens``
    for budget errors, none otherwise."""
    if isinstance(err, (E.ConstraintError, E.ConstraintEngineError)):
        return param
    if isinstance(err, (E.LengthError, E.PromptTooLongError)):
        return "max_tokens"
    return None


def api_error_for(err: BaseException, *, param: str | None = None) -> APIError:
    """The HTTP error for an exception, by the table above (``DgemmaStructError`` subclasses map
    to 4xx, timeouts to 504; anything unexpected is a 500 ``server_error``). ``param``: the body
    field of the request's constraint."""
    if isinstance(err, APIError):
        return err
    if isinstance(err, ToolRequestError):
        return APIError(400, str(err), param=err.param, code=err.code)
    for cls, status, typ, code in _TABLE:
        if isinstance(err, cls):
            message = str(err) or _EMPTY_MESSAGES.get(cls, cls.__name__)
            if isinstance(err, (E.LengthError, E.PromptTooLongError)):   # the server's name for the budget
                message = message.replace("max_new_tokens", "max_tokens")
            headers = {"Retry-After": str(int(err.retry_after_s))} if isinstance(err, PoolBusy) else None
            return APIError(status, message, type=typ, param=_param_for(err, param), code=code, headers=headers)
    if isinstance(err, E.DgemmaStructError):
        return APIError(400, str(err), code="invalid_request")
    return APIError(500, f"internal error: {type(err).__name__}: {err}", type="server_error", code="internal_error")


async def compiled(work: Awaitable[Any], limit: float, *, grace: float = 0.0, what: str = "the constraint",
                   param: str | None = None,
                   code: str = "invalid_constraint",
                   param_of: Callable[[BaseException], str | None] | None = None) -> Any:
    """``await work`` (a compile on an executor) within ``limit`` (+ ``grace``) seconds, its failures answered
    the one way every surface (plain, grounded, tools) answers them: too slow or nested too deeply
    is a 400 ``constraint_too_complex``, a typed error goes through :func:`api_error_for`
    (``param_of(err)`` picks its field, default ``param``), anything else is a 400 ``code``."""
    try:
        return await asyncio.wait_for(work, limit + grace)
    except asyncio.TimeoutError:
        raise APIError(400, f"compiling {what} took longer than {limit:g} s", param=param,
                       code="constraint_too_complex") from None
    except E.DgemmaStructError as err:
        raise api_error_for(err, param=param_of(err) if param_of is not None else param) from None
    except RecursionError:
        raise APIError(400, f"{what} is nested too deeply", param=param, code="constraint_too_complex") from None
    except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
        raise   # a cancelled compile (its caller left, the server stops) is not a bad spec
    except BaseException as err:  # noqa: BLE001 - a malformed spec the compiler did not anticipate
        raise APIError(400, f"cannot compile {what}: {type(err).__name__}: {err}", param=param, code=code) from None


ERROR_TABLE_MD = "\n".join(f"| `{c.__name__}` | {s} | `{t}` | `{k}` |" for c, s, t, k in _TABLE)
