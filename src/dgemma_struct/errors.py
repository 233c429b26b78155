"""Typed errors. Every failure the SDK reports derives from :class:`DgemmaStructError`.

Example::

    from dgemma_struct.errors import DgemmaStructError, SchemaError
    try:
        generate_json("...", schema={"type": "nonsense"})
    except SchemaError as err:
        print(err)
"""
from __future__ import annotations

from typing import Any


class DgemmaStructError(Exception):
    """Base class of every error raised by dgemma-struct."""


class ModelLoadError(DgemmaStructError):
    """The checkpoint could not be loaded, or is not a DiffusionGemma checkpoint."""


class InvalidRequestError(DgemmaStructError, ValueError):
    """A generation argument is out of range (``max_new_tokens <= 0``, unknown mode, ...)."""


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus the requested new tokens) does not fit the model's context."""


class ConstraintError(DgemmaStructError, ValueError):
    """Base class of errors about a constraint spec (schema, regex, grammar, choices)."""


class SchemaError(ConstraintError):
    """Invalid JSON Schema, dangling ``$ref``, unsatisfiable bounds, or (with ``strict=True``)
    keywords that the grammar cannot enforce."""

    def __init__(self, message: str, *, keywords: list[str] | None = None):
        super().__init__(message)
        self.keywords = list(keywords or [])


class UnsupportedKeywordError(SchemaError):
    """A JSON-Schema keyword that dgemma-struct can neither compile nor validate."""


class RegexError(ConstraintError):
    """The regular expression does not compile."""


class GrammarError(ConstraintError):
    """The Lark grammar does not parse; the message carries line and column when known."""


class ChoiceError(ConstraintError):
    """The choice list is empty or holds something other than non-empty strings."""


class ConstraintCompileTimeout(ConstraintError):
    """Compiling the constraint exceeded its limits (time, size, states)."""


class LengthError(DgemmaStructError):
    """The output cannot be completed within the token budget (``max_new_tokens``)."""

    def __init__(self, message: str, *, partial_text: str = "", stats: Any = None):
        super().__init__(message)
        self.partial_text = partial_text
        self.stats = stats


class GenerationFailed(DgemmaStructError):
    """Repairs and the AR fallback could not produce a valid value. Carries the validation
    errors (each distinct one once), the partial text, the stats and ``rejected``: every distinct
    value validation rejected, once, as ``{"path": JSON Pointer, "value": text as written,
    "errors": [...], "times": attempts that wrote it}`` (a repair never writes a rejected value
    again, so ``times`` is 1). An invalid value is never returned as success."""

    def __init__(self, message: str, *, errors: list[str] | None = None, partial_text: str = "",
                 stats: Any = None, rejected: list[dict] | None = None):
        super().__init__(message)
        self.errors = list(errors or [])
        self.partial_text = partial_text
        self.stats = stats
        self.rejected = list(rejected or [])


class GenerationTimeout(DgemmaStructError, TimeoutError):
    """Generation exceeded its deadline."""


class ConstraintEngineError(DgemmaStructError):
    """The native constraint engine (llguidance) failed on an input it accepted: a panic, a crashed
    compile worker, or a matcher that refused tokens it had allowed. Not a fault of the spec's
    syntax; the message says what happened."""


class GroundingError(ConstraintError):
    """A grounded-extraction request that cannot be served: an empty source, grounding on a field
    that is neither a string nor a number, or a grounded field whose other constraints (pattern,
    enum, format, length, bounds) no span of the source satisfies. ``path`` is the field's JSON
    path when the error is about one field."""

    def __init__(self, message: str, *, path: tuple = ()):
        super().__init__(message)
        self.path = tuple(path)



class ConstraintLimitError(ConstraintEngineError, ConstraintCompileTimeout):
    """The native engine hit one of its limits on this constraint while masking (items per parser
    row, lexer fuel): the spec is too complex for it (e.g. 1,000 optional properties). Both an
    engine error and a :class:`ConstraintCompileTimeout` (a :class:`ConstraintError`)."""


__all__ = [name for name in dir() if name.endswith(("Error", "Failed", "Timeout"))]
