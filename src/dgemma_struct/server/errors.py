"""OpenAI-style error bodies, and the mapping of dgemma-struct's typed errors to HTTP statuses.

Every error the server sends has the shape OpenAI's API uses::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "response_format", "code": "invalid_schema"}}
"""
from __future__ import annotations

from typing import Any

from dgemma_struct import errors as E


class APIError(Exception):
    """An error response: HTTP ``status`` plus the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def error_body(status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return APIError(status, message, type=type, param=param, code=code).body()


# (class, status, type, code); the first matching class wins, so subclasses come first.
_TABLE: list[tuple[type, int, str, str]] = [
    (E.ConstraintCompileTimeout, 400, "invalid_request_error", "constraint_too_complex"),
    (E.UnsupportedKeywordError, 400, "invalid_request_error", "unsupported_schema_keyword"),
    (E.SchemaError, 400, "invalid_request_error", "invalid_schema"),
    (E.RegexError, 400, "invalid_request_error", "invalid_regex"),
    (E.GrammarError, 400, "invalid_request_error", "invalid_grammar"),
    (E.ChoiceError, 400, "invalid_request_error", "invalid_choice"),
    (E.ConstraintError, 400, "invalid_request_error", "invalid_constraint"),
    (E.PromptTooLongError, 400, "invalid_request_error", "context_length_exceeded"),
    (E.InvalidRequestError, 400, "invalid_request_error", "invalid_request"),
    (E.LengthError, 422, "generation_error", "length_exceeded"),
    (E.GenerationFailed, 422, "generation_error", "generation_failed"),
    (E.GenerationTimeout, 504, "timeout_error", "timeout"),
    (E.ModelLoadError, 503, "server_error", "model_unavailable"),
]


def api_error_for(err: BaseException, *, param: str | None = None) -> APIError:
    """The HTTP error for an SDK exception (``DgemmaStructError`` subclasses map to 4xx, timeouts
    to 504; anything unexpected is a 500 ``server_error``)."""
    if isinstance(err, APIError):
        return err
    for cls, status, typ, code in _TABLE:
        if isinstance(err, cls):
            p = param if isinstance(err, E.ConstraintError) else (
                "max_tokens" if isinstance(err, (E.LengthError, E.PromptTooLongError)) else None)
            return APIError(status, str(err) or cls.__name__, type=typ, param=p, code=code)
    if isinstance(err, E.DgemmaStructError):
        return APIError(400, str(err), code="invalid_request")
    return APIError(500, f"internal error: {type(err).__name__}: {err}", type="server_error", code="internal_error")


ERROR_TABLE_MD = "\n".join(f"| `{c.__name__}` | {s} | `{t}` | `{k}` |" for c, s, t, k in _TABLE)
