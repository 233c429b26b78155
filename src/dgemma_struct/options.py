"""``GenerateOptions``: every knob of a constrained call, its default and its check, in one place.

The verbs (:func:`~dgemma_struct.api.generate`, ``generate_batch``, ``stream``) and
:class:`~dgemma_struct.api.Generator` take an ``options`` object and/or the same knobs as keywords;
keywords override the object's fields. A bad value raises
:class:`~dgemma_struct.errors.InvalidRequestError` when the options are built, before any work.

Example::

    >>> from dgemma_struct.options import GenerateOptions
    >>> opts = GenerateOptions(max_new_tokens=64, seed=7)
    >>> opts.with_overrides(seed=8).seed, opts.seed
    (8, 7)
    >>> GenerateOptions(mode="beam")
    Traceback (most recent call last):
    ...
    dgemma_struct.errors.InvalidRequestError: unknown mode 'beam'; expected one of ('diffusion', 'ar')
"""
from __future__ import annotations

import dataclasses
import math
import time
import numbers
from dataclasses import dataclass
from typing import Any, Iterable

from dgemma_struct.errors import GenerationTimeout, InvalidRequestError
from dgemma_struct.prompts import MAX_SEED, MODES, check_max_new_tokens, check_sampling, check_seed

MAX_N = 64          # samples per request (``n``)
MAX_REPAIRS = 100
MAX_LOGPROBS = 20   # top alternatives per token (``logprobs``), as OpenAI's ``top_logprobs``
WHITESPACE = ("compact", "model", "flexible")
THINKING = (False, None, True, "optional")
_FLAGS = ("return_details", "strict", "fallback", "progress", "repair_junk", "close_on_budget", "force_tokens",
          "renoise_invalid", "canonical_tokens", "isolate_compile", "bounded_numbers", "field_budget", "confidence")

#: the knobs a running batch's guide is built with (:meth:`GenerateOptions.guide_knobs`)
GUIDE_KNOBS = ("progress", "force_tokens", "renoise_invalid", "canonical_tokens", "close_on_budget")


class DefaultBudget(int):
    """``max_new_tokens`` left at its default, told apart from a caller's own ``128``: a request whose
    output runs out of it is retried with twice the budget, up to :data:`AUTO_BUDGET_CAP` (a schema
    whose typical output is longer than 128 tokens, such as an order with UUIDs, datetimes and line
    items, then finishes instead of raising ``LengthError``). A budget the caller sets is never grown.

    >>> GenerateOptions().auto_budget, GenerateOptions(max_new_tokens=128).auto_budget
    (True, False)
    """


#: the default ``max_new_tokens``
DEFAULT_MAX_NEW_TOKENS = DefaultBudget(128)
#: the most a default budget grows to (:class:`DefaultBudget`)
AUTO_BUDGET_CAP = 512


@dataclass(frozen=True)
class GenerateOptions:
    """The knobs of a constrained call (see :func:`dgemma_struct.generate` for what each does)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS   # left default: grows on a budget overrun (DefaultBudget)
    seed: int | None = 0                 # None: a fresh seed per call (recorded in ``stats.seed``)
    mode: str = "diffusion"              # "diffusion" or "ar"
    max_repairs: int = 2                 # renoise passes after a failed attempt, in [0, 100]
    strict: bool = False                 # JSON Schema: a keyword the grammar cannot enforce is a SchemaError
    strict_objects: bool | None = None   # undeclared keys forbidden; None: for pydantic models / types only
    fallback: bool = True                # an AR pass on the same weights when repairs are spent
    timeout_s: float | None = None
    whitespace: str = "compact"          # JSON layout: "compact", "model" or "flexible"
    separators: tuple[str, str] | None = None
    progress: bool = True                # the guide's progress rule
    repair_junk: bool = True             # redo valid values whose strings hold structural junk
    close_on_budget: bool = True         # prefer closing tokens near the end of the budget
    temperature: float | None = None
    top_p: float = 1.0
    n: int = 1                           # independent samples (``generate`` only)
    thinking: bool | str | None = False  # True, "optional" or False
    max_thinking_tokens: int = 1024
    return_details: bool = False         # a GenerationResult instead of the value
    force_tokens: bool = True            # the guide writes grammar-forced tokens without a forward
    renoise_invalid: bool = False        # the guide renoises accepted positions past a violation
    canonical_tokens: bool = True        # AR: a token that merges with the bytes forced next gives way to that piece
    logprobs: int | None = None          # None: off; k: each token's logprob and its k top alternatives
    isolate_compile: bool = False        # compile user specs in a worker process first (a native crash is typed)
    bounded_numbers: bool = True         # number literals no longer than their type holds (float64 / int64 / bounds)
    field_budget: bool = True            # strings without maxLength get a length bound from the token budget
    confidence: bool = False             # per-field confidence (``result.confidence``) with return_details

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise InvalidRequestError(f"unknown mode {self.mode!r}; expected one of {MODES}")
        check_max_new_tokens(self.max_new_tokens)
        r = self.max_repairs
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= r <= MAX_REPAIRS:
            raise InvalidRequestError(f"max_repairs must be an integer in [0, {MAX_REPAIRS}], got {r!r}")
        check_seed(self.seed)
        t = self.timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or math.isnan(t) or t <= 0):
            raise InvalidRequestError(f"timeout_s must be None or a positive number of seconds, got {t!r}")
        check_sampling(self.temperature, self.top_p)
        if isinstance(self.n, bool) or not isinstance(self.n, numbers.Integral) or not 1 <= self.n <= MAX_N:
            raise InvalidRequestError(f"n must be an integer in [1, {MAX_N}], got {self.n!r}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.strict_objects is not None and not isinstance(self.strict_objects, bool):
            raise InvalidRequestError(f"strict_objects must be a bool or None, got {self.strict_objects!r}")
        check_format(self.whitespace, self.separators)
        k = self.logprobs
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= MAX_LOGPROBS):
            raise InvalidRequestError(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {k!r}")
        if self.thinking not in THINKING or not isinstance(self.thinking, (bool, str, type(None))):
            raise InvalidRequestError(f"thinking must be True, False or 'optional', got {self.thinking!r}")
        if self.n != 1 and self.thinking not in (False, None):
            raise InvalidRequestError("thinking is not supported with n > 1 yet")

    @property
    def auto_budget(self) -> bool:
        """Whether ``max_new_tokens`` is the default, which may grow (:class:`DefaultBudget`)."""
        return isinstance(self.max_new_tokens, DefaultBudget)

    @property
    def thinks(self) -> bool:
        """Whether a thought block is switched on (``True`` or ``"optional"``)."""
        return self.thinking not in (False, None)

    def guide_knobs(self) -> dict[str, bool]:
        """The knobs a batch's guide is built with, so rows that share a batch must share them
        (the scheduler keys its batches by them).

        >>> GenerateOptions(progress=False).guide_knobs()
        {'progress': False, 'force_tokens': True, 'renoise_invalid': False, 'canonical_tokens': True, 'close_on_budget': True}
        """
        return {k: getattr(self, k) for k in GUIDE_KNOBS}

    def with_overrides(self, **overrides: Any) -> GenerateOptions:
        """A copy with ``overrides`` applied (checked again)."""
        return dataclasses.replace(self, **overrides) if overrides else self

    @classmethod
    def build(cls, options: GenerateOptions | None, overrides: dict[str, Any], *, verb: str,
              allowed: Iterable[str] | None = None) -> GenerateOptions:
        """``options`` (default: the defaults) with the keyword ``overrides`` of ``verb`` applied.
        A keyword that is not a knob (or not one ``verb`` takes) is a ``TypeError``, as for any
        function; a bad value is an :class:`InvalidRequestError`."""
        if options is not None and not isinstance(options, GenerateOptions):
            raise InvalidRequestError(f"options must be a GenerateOptions or None, got {type(options).__name__}")
        names = set(allowed) if allowed is not None else set(FIELDS)
        for key in overrides:
            if key not in names:
                hint = did_you_mean(key, names)
                raise TypeError(f"{verb}() got an unexpected keyword argument {key!r}" + (f"; did you mean {hint!r}?" if hint else ""))
        if options is None:
            return cls(**overrides)
        return options.with_overrides(**overrides)


FIELDS = tuple(f.name for f in dataclasses.fields(GenerateOptions))

#: the spellings other APIs use for a knob (OpenAI's, vLLM's, transformers') -> the knob here
ALIASES = {"max_tokens": "max_new_tokens", "max_output_tokens": "max_new_tokens",
           "max_completion_tokens": "max_new_tokens", "top_logprobs": "logprobs", "random_seed": "seed",
           "response_format": "spec", "schema": "spec"}


def did_you_mean(key: str, names: Iterable[str]) -> str | None:
    """The knob a mistyped or foreign keyword most likely meant, or ``None``.

    >>> did_you_mean("max_tokens", FIELDS)
    'max_new_tokens'
    >>> did_you_mean("temprature", FIELDS)
    'temperature'
    >>> did_you_mean("colour", FIELDS) is None
    True
    """
    import difflib

    names = set(names)
    alias = ALIASES.get(key)
    if alias in names:
        return alias
    close = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.75)
    return close[0] if close else None


def check_format(whitespace: Any, separators: Any) -> None:
    """The JSON layout knobs: ``whitespace`` one of :data:`WHITESPACE`; ``separators`` ``None`` or an
    ``(item, key)`` pair of ``","`` / ``":"`` with optional JSON whitespace."""
    if not isinstance(whitespace, str) or whitespace not in WHITESPACE:
        raise InvalidRequestError(f"whitespace must be one of {WHITESPACE}, got {whitespace!r}")
    if separators is not None and not (isinstance(separators, (tuple, list)) and len(separators) == 2
                                       and all(isinstance(x, str) and x.strip() in (",", ":") for x in separators)
                                       and separators[0].strip() == "," and separators[1].strip() == ":"):
        raise InvalidRequestError("separators must be None or an (item, key) pair of strings like "
                                  f"(', ', ': '): ',' and ':' with optional whitespace; got {separators!r}")
    if separators is not None and any(set(x) - set(" \t\n\r,:") for x in separators):
        raise InvalidRequestError(f"separators may only add JSON whitespace, got {separators!r}")


def offset_seed(seed: int, k: int) -> int:
    """The ``k``-th derived seed (``seed + k``, wrapped into the valid range)."""
    return (seed + k) % (MAX_SEED + 1)


def deadline_after(timeout_s: float | None) -> float | None:
    """The ``time.monotonic()`` value ``timeout_s`` from now (``None``: no deadline)."""
    return time.monotonic() + timeout_s if timeout_s else None


def check_deadline(deadline: float | None) -> None:
    """Raises :class:`GenerationTimeout` once ``deadline`` (``time.monotonic()``) has passed."""
    if deadline is not None and time.monotonic() > deadline:
        raise GenerationTimeout("generation exceeded its timeout")
