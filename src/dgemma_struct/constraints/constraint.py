"""The compiled :class:`Constraint` and its per-kind validators.

A constraint is a grammar (llguidance) bound to one tokenizer plus a :class:`Validator` that checks a
finished output beyond the grammar: :class:`JsonValidator` (JSON Schema keywords the grammar leaves
out, a pydantic model), :class:`ChoiceValidator` (exact membership) and :class:`GrammarValidator`
(regex / Lark: the grammar is the whole check). ``kind`` (:class:`ConstraintKind`) says which.

>>> ChoiceValidator(["yes", "no"]).validate("no").ok
True
>>> JsonValidator.partial('{"a":[1,2')
{'a': [1, 2]}
>>> ConstraintKind("json") == "json"
True
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Sequence

import llguidance as llg

from dgemma_struct.errors import ChoiceError, ConstraintCompileTimeout, GrammarError, RegexError, SchemaError

from .json_locate import Rejection, RepairPlan, error_char_offset, junk_paths, repair_plan
from .json_schema import iter_issues, make_validator
from .safety import clip, engine_guard, is_limit_error, parser_limits
from .tokenizer import TokenizerInfo
from .walker import CanvasWalker

__all__ = ["Constraint", "ConstraintKind", "ValidationIssue", "ValidationOutcome", "Validator", "JsonValidator",
           "ChoiceValidator", "GrammarValidator"]


class ConstraintKind(str, enum.Enum):
    """What a constraint's output is; compares equal to its string (``kind == "json"``)."""

    JSON = "json"
    REGEX = "regex"
    GRAMMAR = "grammar"
    CHOICE = "choice"

    __str__ = str.__str__
    __format__ = str.__format__


@dataclass(frozen=True)
class ValidationIssue:
    """One validation failure: where (``path`` into the value) and why. ``superfluous``: the value
    should not be there at all (an array item written once too often), so a repair restarts before
    it and the array may close."""

    path: tuple
    message: str
    superfluous: bool = False

    def __str__(self) -> str:
        loc = "/".join(str(p) for p in self.path)
        return f"{loc or '<root>'}: {self.message}"


@dataclass
class ValidationOutcome:
    """The verdict on a finished output: ``ok``, the parsed ``value`` and the ``errors``."""

    ok: bool
    value: Any = None
    errors: list[ValidationIssue] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok


class Validator(Protocol):
    """Checks a finished output. ``semantic``: it checks more than the grammar does."""

    semantic: ClassVar[bool]

    def validate(self, text: str, constraint: "Constraint | None" = None) -> ValidationOutcome: ...


class GrammarValidator:
    """Regex / Lark kinds: the output is valid iff the constraint's grammar accepts it."""

    semantic: ClassVar[bool] = False

    def __init__(self, what: str = "grammar"):
        self.what = what

    def validate(self, text: str, constraint: "Constraint | None" = None) -> ValidationOutcome:
        if constraint is None:
            raise ValueError("a grammar validator needs the constraint whose grammar it checks")
        ok = constraint.grammar_accepts(text)
        return ValidationOutcome(ok, text, [] if ok else [ValidationIssue((), f"text does not match the {self.what}")])


class ChoiceValidator:
    """The output must be one of ``choices`` exactly."""

    semantic: ClassVar[bool] = True

    def __init__(self, choices: Sequence[str]):
        self.choices = list(choices)
        self._set = frozenset(self.choices)

    def validate(self, text: str, constraint: "Constraint | None" = None) -> ValidationOutcome:
        ok = text in self._set
        return ValidationOutcome(ok, text, [] if ok else [ValidationIssue((), f"{text!r} is not one of the choices")])


class JsonValidator:
    """JSON output: parsed strictly (no NaN / Infinity, no number beyond the double range), checked
    against the schema (``schema_validator``, a ``jsonschema`` validator), then by the pydantic
    ``adapter`` when there is one (the value becomes the model instance)."""

    semantic: ClassVar[bool] = True

    def __init__(self, schema_validator: Any, adapter: Any = None):
        self.schema_validator = schema_validator
        self.adapter = adapter

    def schema_issues(self, value: Any) -> list[ValidationIssue]:
        """The JSON Schema issues of a parsed value (no pydantic: user validators may have effects)."""
        return [ValidationIssue(p, msg) for p, msg in iter_issues(self.schema_validator, value)]

    def validate(self, text: str, constraint: "Constraint | None" = None) -> ValidationOutcome:
        try:
            value = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant,
                               object_pairs_hook=_unique_keys)
        except (ValueError, RecursionError) as e:
            return ValidationOutcome(False, None, [ValidationIssue((), f"invalid JSON: {clip(e, 300)}")])
        issues = self.schema_issues(value)
        if issues:
            return ValidationOutcome(False, value, issues)
        if self.adapter is not None:
            try:
                value = self.adapter.validate_json(text)
            except Exception as e:  # pydantic.ValidationError
                errs = getattr(e, "errors", None)
                if callable(errs):
                    return ValidationOutcome(False, value, [
                        ValidationIssue(tuple(d.get("loc", ())), d.get("msg", "")) for d in errs()])
                return ValidationOutcome(False, value, [ValidationIssue((), str(e))])
        return ValidationOutcome(True, value, [])

    @staticmethod
    def partial(text: str) -> Any:
        """The value of an unfinished JSON text (pydantic-core, ``allow_partial="trailing-strings"``):
        open strings, arrays and objects are closed, an incomplete trailing key or literal is dropped.
        None when nothing parses."""
        from pydantic_core import from_json

        if not isinstance(text, str) or not text.strip():
            return None
        try:
            return from_json(text, allow_partial="trailing-strings")
        except ValueError:
            return None


def _finite_float(s: str) -> float:
    """JSON number -> float, refusing numbers beyond the IEEE double range (``3e616`` would become inf)."""
    f = float(s)
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError(f"number {clip(s, 60)} is outside the IEEE double range")
    return f


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object whose keys are unique: a duplicate key (``""`` included) is invalid output."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {clip(repr(dup), 60)}")
    return d


def _no_constant(s: str) -> Any:
    raise ValueError(f"{s} is not JSON")


_COMPILE_ERRORS = {ConstraintKind.JSON: SchemaError, ConstraintKind.REGEX: RegexError,
                   ConstraintKind.GRAMMAR: GrammarError, ConstraintKind.CHOICE: ChoiceError}
_VALIDATOR_TYPES = (JsonValidator, ChoiceValidator, GrammarValidator)


def _validator_for(kind: ConstraintKind, validator: Any, adapter: Any, schema: Any) -> Validator:
    """``validator`` as a :class:`Validator`: one as is, else built for ``kind`` from what is given (a
    ``jsonschema`` validator for JSON, the choice strings for a choice)."""
    if isinstance(validator, _VALIDATOR_TYPES):
        return validator
    if kind is ConstraintKind.JSON:
        if validator is None and schema is not None:
            validator = make_validator(schema)
        return JsonValidator(validator, adapter)
    if kind is ConstraintKind.CHOICE:
        return ChoiceValidator(list(validator or ()))
    return GrammarValidator(kind.value)


class Constraint:
    """A compiled output constraint bound to one tokenizer.

    Attributes: ``kind`` (:class:`ConstraintKind`), ``schema`` (json kinds), ``semantic_keywords``
    (enforced by validation only), ``grammar`` (llguidance grammar string), ``validator``
    (:class:`Validator`), ``choices`` (choice kinds, else None), ``vocab_size``, ``stop_token_ids``,
    ``tokenizer_info``.
    """

    choices: list[str] | None = None

    def __init__(self, kind: str, grammar: str, info: TokenizerInfo, *, schema: Any = None,
                 semantic_keywords: Sequence[str] = (), validator: Any = None, pydantic_adapter: Any = None,
                 may_allow_specials: bool = False, description: str = "", template: Any = None):
        self.kind = kind = ConstraintKind(kind)
        self.grammar = grammar
        self.tokenizer_info = info
        self.schema = schema
        self.semantic_keywords = list(semantic_keywords)
        self.validator: Validator = _validator_for(kind, validator, pydantic_adapter, schema)
        if isinstance(self.validator, ChoiceValidator):
            self.choices = self.validator.choices
        self.description = description
        with engine_guard(f"compiling the {kind} constraint"):
            # ``template``: the matcher the compile step already built for this grammar (compiled once)
            self._template = template if template is not None else \
                llg.LLMatcher(info.lltok, grammar, log_level=0, limits=parser_limits())
            failed = self._template.is_error()
            err = self._template.get_error() if failed else ""
        if failed:
            exc = ConstraintCompileTimeout if is_limit_error(err) else _COMPILE_ERRORS[kind]
            raise exc(f"cannot compile the {kind} constraint: {clip(err)}")
        # special tokens a grammar could reference (lark ``<[id]>``) but a mask must never allow
        self.may_allow_specials = may_allow_specials

    # -- basic facts -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer_info.vocab_size

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.tokenizer_info.stop_token_ids

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer_info.stop_token_ids[0]

    def new_matcher(self) -> Any:
        """A fresh ``llguidance.LLMatcher`` at the start state."""
        with engine_guard("copying a matcher"):
            return self._template.deep_copy()

    def canvas_walker(self) -> CanvasWalker:
        """A :class:`~.walker.CanvasWalker` at the start state of this constraint."""
        return CanvasWalker(self)

    def __repr__(self) -> str:
        return f"Constraint(kind={self.kind.value!r}, {self.description}, semantic_keywords={self.semantic_keywords})"

    # -- checking text -----------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token spellings in it (``"<eos>"``) are encoded as text."""
        return self.tokenizer_info.tokenize(text)

    def grammar_accepts(self, text: str) -> bool:
        """Would the grammar accept exactly ``text`` followed by EOS?"""
        m = self.new_matcher()
        toks = self.tokenize(text)
        with engine_guard("checking a text against the constraint"):
            if not m.consume_tokens(toks):
                return False
            return bool(m.consume_token(self.eos_token_id)) and not m.is_error()

    def validate_text(self, text: str) -> ValidationOutcome:
        """Semantic validation of a finished output (by :attr:`validator`)."""
        return self.validator.validate(text, self)

    def matches(self, text: str) -> bool:
        """True iff ``text`` is accepted by the grammar AND passes semantic validation."""
        if not self.validator.semantic:
            return self.grammar_accepts(text)
        return self.grammar_accepts(text) and self.validate_text(text).ok

    # -- what the repair policy and streams ask -------------------------------------------------
    # (the one place that switches on the kind: callers ask these instead of testing ``kind``)
    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        """``(thought, answer)`` of decoded text; without a thought channel ``(None, text)``."""
        return None, text

    def partial_value(self, text: str) -> Any:
        """What a stream shows for unfinished output: the partial value of JSON (open strings, arrays
        and objects closed; ``None`` when nothing parses), the text itself for the other kinds."""
        return JsonValidator.partial(text) if self.kind is ConstraintKind.JSON else text

    def error_offset(self, answer: str, issues: Sequence[ValidationIssue]) -> int:
        """The character of ``answer`` where the earliest offending value starts (renoising restarts
        there); 0 where the kind has no values to point at (regex, grammar, choice)."""
        if self.kind is not ConstraintKind.JSON:
            return 0
        return error_char_offset(answer, [i.path for i in issues])

    def repair_plan(self, answer: str, issues: Sequence[ValidationIssue]) -> RepairPlan:
        """Where renoising restarts in ``answer`` and which values must not be written again
        (:func:`~.json_locate.repair_plan`); the kinds without values restart at 0 and ban nothing
        (the answer is still recorded as rejected)."""
        if self.kind is not ConstraintKind.JSON:
            return RepairPlan(0, [], [Rejection((), answer, "; ".join(i.message for i in issues))])
        return repair_plan(answer, issues)

    def junk_paths(self, value: Any) -> list[tuple]:
        """Paths of strings in a valid ``value`` that hold structural junk (JSON only; else none)."""
        return junk_paths(value, schema=self.schema) if self.kind is ConstraintKind.JSON else []
