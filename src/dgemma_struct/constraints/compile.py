"""``compile_constraint``: turn a spec (pydantic model, JSON Schema, Regex, Grammar, Choice, Literal,
Enum, plain python type, Outlines type) into a :class:`~.constraint.Constraint` bound to a tokenizer.

Specs are normalised to a kind and a payload (:func:`_normalise`), compiled by the kind's compiler
(:mod:`.grammars` for regex / grammar / choice, :func:`_compile_json` here) and kept in a compile
cache bounded by count and estimated bytes.
"""
from __future__ import annotations

import datetime
import enum
import hashlib
import json
import os
import typing
from collections import namedtuple
from pathlib import Path
from typing import Any, Sequence

from dgemma_struct.errors import ConstraintError, SchemaError

from .constraint import Constraint, ConstraintKind, JsonValidator
from .grammars import compile_choice, compile_grammar, compile_regex
from .lru import BoundedLRU
from .json_schema import JsonPlan, json_options, make_validator, prepare_json_schema
from .safety import check_schema_input, clip, parser_limits
from .schema_checks import with_spec_formats
from .specs import Choice, Grammar, JsonSchema, Regex
from .strict_objects import close_objects
from .tokenizer import TokenizerInfo, get_tokenizer_info
from .type_rules import typed_json_schema

__all__ = ["compile_constraint", "cache_info", "cache_clear"]


# ----------------------------------------------------------------------------------------------
# spec normalisation
# ----------------------------------------------------------------------------------------------
def _is_pydantic_model(spec: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(spec, type) and issubclass(spec, BaseModel)


def _outlines_to_spec(spec: Any) -> Any:
    """Map Outlines output types (when outlines is importable) to our specs; None if not one."""
    try:
        import outlines  # noqa: F401
    except ImportError:
        return None
    try:  # outlines >= 1.0
        from outlines.types import CFG, JsonSchema as OJsonSchema, Regex as ORegex  # type: ignore
        from outlines.types.dsl import Term, to_regex  # type: ignore
    except Exception:  # pragma: no cover
        return None
    if isinstance(spec, ORegex):
        return Regex(spec.pattern)
    if isinstance(spec, OJsonSchema):
        return JsonSchema(spec.schema)
    if isinstance(spec, CFG):
        return Grammar(spec.definition)
    if isinstance(spec, Term):
        return Regex(to_regex(spec))
    return None


_TypeSpec = namedtuple("_TypeSpec", "schema adapter")


def _type_spec(spec: Any) -> Any:
    """Literal / Enum / python types -> Choice or (schema, TypeAdapter)."""
    origin = typing.get_origin(spec)
    if origin is typing.Literal:
        args = typing.get_args(spec)
        if args and all(isinstance(a, str) for a in args):
            return Choice(list(args))
    if isinstance(spec, type) and issubclass(spec, enum.Enum):
        vals = [m.value for m in spec]
        if vals and all(isinstance(v, str) for v in vals):
            return Choice(vals)
    from pydantic import TypeAdapter
    try:
        ad = TypeAdapter(spec)
        schema = typed_json_schema(ad)
    except Exception as e:
        raise SchemaError(f"cannot derive a JSON Schema from {spec!r}: {e}") from None
    return _TypeSpec(schema, ad)


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=repr)


# ----------------------------------------------------------------------------------------------
# compile
# ----------------------------------------------------------------------------------------------
def _compile_json(schema: Any, info: TokenizerInfo, *, strict: bool, whitespace: str,
                  separators: tuple[str, str] | None, adapter: Any = None, desc: str = "json schema",
                  checked: bool = False, bounded_numbers: bool = False, field_budget: int | None = None) -> Constraint:
    plan: JsonPlan = prepare_json_schema(schema, info.lltok, strict=strict, whitespace=whitespace,
                                         separators=separators, limits=parser_limits(), checked=checked,
                                         bounded_numbers=bounded_numbers, field_budget=field_budget)
    return Constraint(ConstraintKind.JSON, plan.grammar, info, schema=plan.schema,
                      semantic_keywords=plan.semantic_keywords,
                      validator=JsonValidator(with_spec_formats(make_validator(plan.schema, plan.text)), adapter),
                      description=desc,
                      template=plan.matcher)


def _normalise(spec: Any, keyed: bool = True) -> tuple[ConstraintKind, Any, Any, str]:
    """-> (kind, payload, adapter, cache-key); ``keyed=False``: no cache key (``""``), e.g. for
    ``use_cache=False`` (a large schema's canonical text costs a full serialisation)."""
    if isinstance(spec, Regex):
        return ConstraintKind.REGEX, spec.pattern, None, "regex:" + repr(spec.pattern)
    if isinstance(spec, Grammar):
        src = spec.source
        key = str(src) if isinstance(src, str) else f"path:{src}"
        if isinstance(src, Path) or (isinstance(src, str) and src.endswith(".lark") and Path(src).exists()):
            try:
                key = "path:" + hashlib.sha1(Path(src).read_bytes()).hexdigest()
            except OSError:
                pass
        return ConstraintKind.GRAMMAR, spec, None, f"grammar:{spec.start}:{key}"
    if isinstance(spec, Choice):
        ch = spec.choices
        return ConstraintKind.CHOICE, spec, None, "choice:" + _canon(list(ch) if isinstance(ch, (list, tuple))
                                                                     else repr(ch))
    if isinstance(spec, JsonSchema):
        d = spec.as_dict() if not isinstance(spec.schema, (str, bytes)) else spec.schema
        if isinstance(d, (str, bytes)):
            try:
                d = json.loads(d)
            except (ValueError, RecursionError) as e:
                raise SchemaError(f"schema is not valid JSON: {clip(e, 300)}") from None
        check_schema_input(d)
        return ConstraintKind.JSON, d, None, ("json:" + _canon(d)) if keyed else ""
    if isinstance(spec, (dict, bool)) and not isinstance(spec, type):
        check_schema_input(spec)
        return ConstraintKind.JSON, spec, None, ("json:" + _canon(spec)) if keyed else ""
    if isinstance(spec, (str, bytes)):
        raise ConstraintError("a bare string is ambiguous: wrap it as Regex(...), Grammar(...) or JsonSchema(...)")
    if isinstance(spec, (list, tuple)):
        return _normalise(Choice(list(spec)), keyed)
    if _is_pydantic_model(spec):
        from pydantic import TypeAdapter
        try:
            schema = typed_json_schema(spec)
        except Exception as e:
            raise SchemaError(f"cannot derive a JSON Schema from {spec.__name__}: {e}") from None
        # the day: PastDate / FutureDate rules read today (type_rules)
        key = f"pydantic:{spec.__module__}.{spec.__qualname__}:{id(spec)}:{datetime.date.today().toordinal()}"
        return ConstraintKind.JSON, schema, TypeAdapter(spec), key
    o = _outlines_to_spec(spec)
    if o is not None:
        return _normalise(o, keyed)
    t = _type_spec(spec)
    if isinstance(t, Choice):
        return _normalise(t, keyed)
    return ConstraintKind.JSON, t.schema, t.adapter, f"type:{spec!r}:{id(spec)}:{datetime.date.today().toordinal()}"


_CACHE_MAX = 128
#: the compile cache's memory bound (estimated bytes of the cached matchers); env DGEMMA_COMPILE_CACHE_BYTES
_CACHE_MAX_BYTES = int(os.environ.get("DGEMMA_COMPILE_CACHE_BYTES", str(512 * 2 ** 20)))
CacheInfo = namedtuple("CacheInfo", "hits misses maxsize currsize currbytes maxbytes")


def _estimate_bytes(c: Constraint) -> int:
    """Estimated memory of a compiled constraint: its llguidance grammar (lexer automata, parser
    tables) grows with the grammar text -- measured 12-140x its length for 300-500 KB schemas -- plus
    a fixed part."""
    return 256 * 1024 + 64 * len(c.grammar)


_cache = BoundedLRU(_CACHE_MAX, _CACHE_MAX_BYTES, sizeof=_estimate_bytes)


def cache_info() -> CacheInfo:
    return CacheInfo(_cache.hits, _cache.misses, _cache.max_items, len(_cache), _cache.bytes, _cache.max_bytes)


def cache_clear() -> None:
    _cache.clear()


def compile_constraint(spec: Any, tokenizer: Any = None, *, strict: bool = False, whitespace: str = "compact",
                       stop_token_ids: Sequence[int] | None = None, separators: tuple[str, str] | None = None,
                       vocab_size: int | None = None, use_cache: bool = True,
                       strict_objects: bool | None = None, bounded_numbers: bool = False,
                       field_budget: int | None = None) -> Constraint:
    """Compile ``spec`` for ``tokenizer`` (a HF fast tokenizer, an ``LLTokenizer`` or a
    :class:`TokenizerInfo`).

    ``whitespace``: ``"compact"`` (default: no whitespace between JSON tokens) or ``"model"`` /
    ``"flexible"`` (JSON whitespace allowed where JSON allows it). ``separators``: override the
    ``(item, key)`` separators, e.g. ``(", ", ": ")``. ``vocab_size``: mask width when the model's
    embedding is larger than the tokenizer (extra ids are never allowed). ``strict_objects``: objects
    that declare ``properties`` forbid undeclared keys (:func:`~.strict_objects.close_objects`);
    ``None`` (default): strict for pydantic models and python types, JSON Schema's meaning for raw
    schema dicts. ``bounded_numbers``: JSON numbers no longer than their type holds (an unbounded integer
    within ±(2**53 - 1), a number within 17 digits before the point); ``field_budget``: the request's
    ``max_new_tokens``, from which plain strings without ``maxLength`` get a length bound
    (:mod:`.field_bounds`; bucketed to a power of two, the cache is keyed by the bucket). Both narrow the
    grammar only and default off here (JSON Schema's meaning); ``GenerateOptions`` turns them on. Results are cached
    (LRU bounded by count and by estimated bytes, ``compile_constraint.cache_info()``)."""
    if tokenizer is None:
        raise ConstraintError("compile_constraint needs a tokenizer")
    json_options(whitespace, separators)  # a bad whitespace / separators: InvalidRequestError, before any work
    info = get_tokenizer_info(tokenizer, stop_token_ids, vocab_size)
    kind, payload, adapter, key = _normalise(spec, keyed=use_cache)
    if strict_objects is not None and not isinstance(strict_objects, bool):
        raise ConstraintError(f"strict_objects must be a bool or None, got {strict_objects!r}")
    if field_budget is not None and (isinstance(field_budget, bool) or not isinstance(field_budget, int)
                                     or field_budget < 1):
        raise ConstraintError(f"field_budget must be a positive int or None, got {field_budget!r}")
    for name, flag in (("strict", strict), ("use_cache", use_cache), ("bounded_numbers", bounded_numbers)):
        if not isinstance(flag, bool):
            raise ConstraintError(f"{name} must be a bool, got {flag!r}")
    closed = (adapter is not None) if strict_objects is None else strict_objects
    closed = closed and kind is ConstraintKind.JSON
    json_kind = kind is ConstraintKind.JSON
    budget = 1 << (field_budget.bit_length() - 1) if field_budget and json_kind else None  # a power of two
    ck = (key, info.key, strict, whitespace, tuple(separators) if separators else None, closed,
          bounded_numbers and json_kind, budget)
    if use_cache:
        hit = _cache.get(ck)
        if hit is not None:
            return hit
    if kind is ConstraintKind.REGEX:
        c = compile_regex(payload, info)
    elif kind is ConstraintKind.GRAMMAR:
        c = compile_grammar(payload, info)
    elif kind is ConstraintKind.CHOICE:
        c = compile_choice(payload, info)
    else:
        desc = getattr(spec, "__name__", "json schema")
        if closed:
            payload = close_objects(payload)
        c = _compile_json(payload, info, strict=strict, whitespace=whitespace, separators=separators,
                          adapter=adapter, desc=desc, checked=adapter is None,  # _normalise checked dicts
                          bounded_numbers=bounded_numbers, field_budget=budget)
    if use_cache:
        _cache.put(ck, c)
    return c


compile_constraint.cache_info = cache_info  # type: ignore[attr-defined]
compile_constraint.cache_clear = cache_clear  # type: ignore[attr-defined]
