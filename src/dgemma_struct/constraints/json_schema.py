"""JSON-Schema normalisation and the grammar / validation split.

``prepare_json_schema`` returns a :class:`JsonPlan`: the llguidance grammar built from a
*grammar copy* of the schema, the keywords that copy does not enforce (``semantic_keywords``,
left to validation), and a validator for the original schema.

How keywords are split is decided by llguidance itself: the schema is compiled in lenient mode
and llguidance's warnings (``Unimplemented keys: [...]``, ``Unknown format: ...``) and errors
(look-around regexes, non-disjoint ``oneOf``) name what it cannot express. Those keywords are
removed from / relaxed in the grammar copy only, which makes the grammar a *superset* of the
valid instances; ``jsonschema`` validation of the finished text enforces the rest.
"""
from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from dataclasses import dataclass, field
from typing import Any, Iterator

import jsonschema
import llguidance as llg
from referencing.exceptions import Unresolvable

from dgemma_struct.errors import ConstraintCompileTimeout, InvalidRequestError, SchemaError, UnsupportedKeywordError

from .field_bounds import bound_fields
from .literals import (decimal_step_copy, drop_extreme_bounds, drop_wide_literals, exact_literal_grammar,
                       has_wide_number, is_ecma_regex)
from .presence_rules import dependency_keywords
from .regex_ascii import as_written, re_pattern, re_schema
from .type_rules import EMAIL_GRAMMAR_PATTERN, GRAMMAR_KEY, grammar_form  # noqa: F401 (tests)
from .safety import check_schema_input, clip, engine_guard, is_limit_error, written_here
from .schema_checks import check_schema, format_checks, is_number, iter_subschemas, spec_format_valid


__all__ = ["JsonPlan", "prepare_json_schema", "make_validator", "iter_issues", "missing_format_extras"]

@dataclass
class JsonPlan:
    schema: Any  # original schema (normalised only by json round trip)
    grammar_schema: Any  # the copy handed to llguidance
    grammar: str  # llguidance grammar string
    semantic_keywords: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    matcher: Any = None  # the compiled llguidance.LLMatcher at its start state (compiled once)
    text: str | None = None  # ``schema`` as JSON text


# Python modules behind ``jsonschema[format-nongpl]``; without them jsonschema silently skips
# the formats they back (fqdn: hostname; idna: idn-hostname; isoduration: duration; jsonpointer:
# json-pointer, relative-json-pointer; rfc3339_validator: date-time; rfc3986_validator: uri,
# uri-reference; rfc3987_syntax: iri, iri-reference; uri_template: uri-template; webcolors: color),
# and validation becomes more lenient than the schema.
FORMAT_EXTRAS = ("fqdn", "idna", "isoduration", "jsonpointer", "rfc3339_validator", "rfc3986_validator",
                 "rfc3987_syntax", "uri_template", "webcolors")


def missing_format_extras() -> list[str]:
    """Modules of ``jsonschema[format-nongpl]`` that are not importable (format checks they back are skipped)."""
    import importlib.util
    return [m for m in FORMAT_EXTRAS if importlib.util.find_spec(m) is None]


_FORMAT_CHECKERS: dict = {}


def _format_checker(cls: Any) -> Any:
    """The draft's own format checker, plus the 2020-12 checker for format names the draft does
    not define (e.g. ``iri``/``uuid``/``duration`` under draft-04/07).

    Such names are "unknown formats" (annotations) for the older draft, but schema authors use
    them meaning the later definition and the JSONSchemaBench labels (upstream checker) assert them;
    asserting them only makes validation stricter, which keeps ``matches`` sound."""
    fc = _FORMAT_CHECKERS.get(cls)
    if fc is None:
        base = getattr(cls, "FORMAT_CHECKER", None) or jsonschema.FormatChecker()
        fc = jsonschema.FormatChecker(formats=())
        # jsonschema's email check is only "contains @", its regex check is Python's re: without
        # jsonschema-rs, an RFC 5321/5322 check and ECMA-262 (as JSON Schema defines it); with it, the
        # one spec-following checker for every format it knows (grounding's, tool arguments' ...)
        fc.checkers = {**jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers, **base.checkers,
                       "email": (_is_email, ()), "idn-email": (_is_email, ()), "regex": (is_ecma_regex, ()),
                       **format_checks()}
        _FORMAT_CHECKERS[cls] = fc
    return fc


def _decimal_multiple_of(validator: Any, dB: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """``multipleOf`` in exact decimal arithmetic: 0.3 is a multiple of 0.1 (``jsonschema`` divides
    doubles and says it is not)."""
    if not validator.is_type(instance, "number") or not validator.is_type(dB, "number"):
        return
    if isinstance(dB, int) and isinstance(instance, int):
        bad = instance % dB != 0
    else:
        try:
            (a, b), (c, d) = Decimal(repr(instance)).as_integer_ratio(), Decimal(repr(dB)).as_integer_ratio()
            bad = (a * d) % (b * c) != 0   # exact (a 28-digit quotient makes 1e308 a multiple of 0.123456789)
        except (InvalidOperation, ValueError, OverflowError, ZeroDivisionError):  # dB == 0: the metaschema refuses
            bad = True
    if bad:
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {dB!r}")


_VALIDATOR_CLASSES: dict = {}


_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
_EMAIL_RE = re.compile(rf"(?:{_ATOM}(?:\.{_ATOM})*|\"(?:[^\"\\\r\n]|\\.)*\")@(?:{_LABEL}(?:\.{_LABEL})*|\[[^\]]+\])")


def _is_email(instance: Any) -> bool:
    """RFC 5321/5322 address check (local part <= 64 octets, domain <= 255, labels <= 63): jsonschema-rs'
    checker when available, else a dot-atom / quoted-string regex with the same length limits."""
    if not isinstance(instance, str):
        return True
    ok = spec_format_valid("email", instance)
    if ok is not None:
        return ok
    local, _, domain = instance.rpartition("@")
    return (bool(local) and len(local.encode()) <= 64 and 0 < len(domain.encode()) <= 255
            and _EMAIL_RE.fullmatch(instance) is not None)


def _pattern(validator: Any, patrn: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """``pattern`` with ``\\p{..}`` / ``\\P{..}`` read as ECMA-262 does (Python's ``re`` has no ``\\p``:
    :func:`~.regex_ascii.re_pattern` spells them out); the message names the pattern as written."""
    if validator.is_type(instance, "string") and not re.search(re_pattern(patrn) or patrn, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")


def make_validator(schema: Any, text: str | None = None) -> Any:
    """A ``jsonschema`` validator for ``schema`` (the class its ``$schema`` names, 2020-12 by default):
    exact decimal ``multipleOf``, ``pattern`` / ``patternProperties`` with Unicode property escapes
    (:func:`~.regex_ascii.re_schema`) and format assertion by the one format checker (jsonschema-rs'
    checks for :data:`~.schema_checks.SPEC_FORMATS`), wherever a schema is validated."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    ext = _VALIDATOR_CLASSES.get(cls)
    if ext is None:
        ext = _VALIDATOR_CLASSES[cls] = jsonschema.validators.extend(
            cls, {"multipleOf": _decimal_multiple_of, "pattern": _pattern})
    if text is not None and "\\\\p" not in text and "\\\\P" not in text:  # ``schema`` as JSON: no \\p escape to spell
        return ext(schema, format_checker=_format_checker(cls))
    return ext(re_schema(schema, iter_subschemas), format_checker=_format_checker(cls))


def iter_issues(validator: Any, instance: Any) -> list[tuple[tuple, str]]:
    try:
        errs = list(validator.iter_errors(instance))
    except Unresolvable as e:  # jsonschema wraps referencing's errors in a subclass
        raise UnsupportedKeywordError(f"cannot resolve $ref: {clip(e)}", keywords=["$ref"]) from None
    except RecursionError:
        # bounded: $ref cycles that consume no input are refused at compile time; this is a
        # schema / instance nested beyond Python's recursion limit
        return [((), "validation recursed too deeply (schema or value nested beyond the recursion limit)")]
    return [(tuple(e.absolute_path), as_written(e.message)) for e in errs]


#: the keywords :func:`_grammar_copy` may rewrite
_REWRITTEN = frozenset(("minProperties", "exclusiveMinimum", "exclusiveMaximum", "items", "dependencies", "multipleOf",
                        "format", "dependentRequired", "oneOf", GRAMMAR_KEY))

_EXPONENT = re.compile(r"e[-+][0-9]")  # a float that may be an extreme bound (literals.drop_extreme_bounds)


def _grammar_copy(schema: Any, dropped: list[str] | None = None, wide: bool = True, text: str | None = None,
                  marks: list | None = None, extreme: bool = True) -> Any:
    """Draft-4/6/7 spellings llguidance does not read, rewritten for the grammar copy only; keywords
    llguidance compiles wrongly are removed (named in ``dropped``, enforced by validation). ``text``:
    ``schema`` as JSON text, when at hand; ``marks``: the wide ``const`` / ``enum`` removed; ``extreme``:
    ``schema`` may hold an extreme bound (a 19-digit integer or a float with an exponent)."""
    # a JSON value (checked): ~4x faster than copy.deepcopy
    g = json.loads(text if text is not None else json.dumps(schema))
    tuples = False
    for path, s in iter_subschemas(g):
        if extreme:
            pin = drop_extreme_bounds(s, dropped)
            if pin is not None and marks is not None:  # the pinned value as a literal: "1e-300", not 300 digits
                marks.append((s, "enum", [pin], written_here(path)))
        if _REWRITTEN.isdisjoint(s):  # most subschemas: nothing here to rewrite
            if wide:
                drop_wide_literals(s, dropped, wide != "ints", path, marks)
            continue
        grammar_form(s)  # a type's rule (x-grammar), a format llguidance reads too wide (email, date)
        mp = s.get("minProperties")
        if (is_number(mp) and mp > 0 and isinstance(s.get("properties"), dict) and s["properties"]
                and s.get("additionalProperties", True) is not False
                and mp > len(set(s.get("required") or []))):
            # llguidance 1.x counts only the *additional* properties towards minProperties when
            # optional `properties` exist, so {"a": 1} is rejected by {properties: {a}, minProperties: 1}
            s.pop("minProperties")
            if dropped is not None:
                dropped.append("minProperties")
        for kw, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
            if isinstance(s.get(kw), bool):  # draft-4 boolean form
                flag = s.pop(kw)
                if flag and is_number(s.get(bound)):
                    s[kw] = s.pop(bound)
        if isinstance(s.get("items"), list):  # draft-7 tuple form
            tuples = True
            s["prefixItems"] = s.pop("items")
            if "additionalItems" in s:
                s["items"] = s.pop("additionalItems")
        dependency_keywords(s)
        mo = s.get("multipleOf")
        if isinstance(mo, float) and not mo.is_integer():
            decimal_step_copy(s, dropped)  # llguidance compiles a decimal step next to bounds wrongly
        if wide:
            drop_wide_literals(s, dropped, wide != "ints", path, marks)
    if isinstance(g, dict) and isinstance(g.get("$schema"), str) and "2020-12" not in g["$schema"] \
            and tuples:
        # the copy now spells tuples the 2020-12 way: under a draft-07 "$schema" llguidance read the
        # rewritten ``items: false`` as "no item at all" and refused valid tuples
        g["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return g


_REGEX_ERR = re.compile(r"regex parse error:\n {4}(.*?)\n {4}\^")
_UNIMPL = re.compile(r"Unimplemented keys: \[(.*?)\]")
_UNKNOWN_FMT = re.compile(r"Unknown format: (\S+)")


def _regex_ok(p: str) -> bool:
    with engine_guard("checking a schema pattern"):
        g = llg.LLMatcher.grammar_from_regex(p)
        return not llg.LLMatcher.validate_grammar(g)


def _relax_pattern(g: Any, bad: str | None) -> list[str]:
    """Remove unsupported ``pattern`` / ``patternProperties`` regexes from the grammar copy."""
    removed: list[str] = []
    for _, s in iter_subschemas(g):
        p = s.get("pattern")
        if isinstance(p, str) and ((bad is not None and p == bad) or (bad is None and not _regex_ok(p))):
            s.pop("pattern")
            removed.append("pattern")
        pp = s.get("patternProperties")
        if isinstance(pp, dict):
            for k in list(pp):
                if (bad is not None and k == bad) or (bad is None and not _regex_ok(k)):
                    pp.pop(k)
                    # names that matched k now fall to additionalProperties: open it up
                    s["additionalProperties"] = True
                    removed.append("patternProperties")
        pn = s.get("propertyNames")
        if isinstance(pn, dict) and isinstance(pn.get("pattern"), str) and pn["pattern"] == bad:
            s.pop("propertyNames")
            removed.append("propertyNames")
    return removed


def _uses(schema: Any, kw: str, subs: list | None = None) -> bool:
    return any(kw in s for _, s in (subs if subs is not None else iter_subschemas(schema)))


def json_options(whitespace: str, separators: tuple[str, str] | None) -> dict:
    """llguidance's JSON options; a bad ``whitespace`` / ``separators`` is an :class:`InvalidRequestError`."""
    if not isinstance(whitespace, str) or whitespace not in ("compact", "model", "flexible"):
        raise InvalidRequestError(f"whitespace must be 'compact', 'model' or 'flexible', not {clip(repr(whitespace), 80)}")
    opts: dict = {"whitespace_flexible": whitespace != "compact"}
    if separators and (not isinstance(separators, (tuple, list)) or len(separators) != 2 or
                       not all(isinstance(x, str) and x.strip() in (",", ":") and x.strip() for x in separators)
                       or separators[0].strip() != "," or separators[1].strip() != ":"):
        raise InvalidRequestError(f"separators must be a pair like (', ', ': '): an item separator around ',' and a "
                                  f"key separator around ':', not {clip(repr(separators), 80)}")
    item, key = separators if separators else (",", ":")
    opts["item_separator"] = item
    opts["key_separator"] = key
    return opts


def _exact_literals(g: Any, marks: list, opts: dict, lltok: Any, limits: Any, grammar: str,
                    matcher: Any) -> tuple[str, Any]:
    """The grammar with the wide literals of ``marks`` emitted exactly (:func:`~.literals.exact_literal_grammar`),
    or the superset one unchanged when that cannot be built or compiled. The keywords stay in the
    semantic ones: validation (exact for Python ints) checks them too."""
    exact = exact_literal_grammar(g, marks, opts)
    if exact is None:
        return grammar, matcher
    with engine_guard("compiling exact wide literals"):
        try:
            m = llg.LLMatcher(lltok, exact, log_level=0, limits=limits)
        except (ValueError, TypeError, OverflowError):  # the superset grammar still serves
            return grammar, matcher
        return (grammar, matcher) if m.is_error() else (exact, m)


def prepare_json_schema(schema: Any, lltok: Any, *, strict: bool = False, whitespace: str = "compact",
                        separators: tuple[str, str] | None = None, limits: Any = None,
                        checked: bool = False, bounded_numbers: bool = False,
                        field_budget: int | None = None) -> JsonPlan:
    """``checked``: the caller already ran :func:`~.safety.check_schema_input` on ``schema``;
    ``bounded_numbers`` / ``field_budget``: the runaway guards of :func:`~.field_bounds.bound_fields`."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise SchemaError(f"schema is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a JSON Schema must be an object or a boolean, not {type(schema).__name__}")
    if not checked:
        check_schema_input(schema)
    long_ints: list[str] = []

    def parse_int(digits: str) -> int:  # a wide integer has at least 19 digits: noted while parsing
        if len(digits) >= 19:
            long_ints.append(digits)
        return int(digits)

    try:
        text = json.dumps(schema, allow_nan=False)
        schema = json.loads(text, parse_int=parse_int)
    except (TypeError, ValueError, RecursionError) as e:
        raise SchemaError(f"schema is not JSON-serialisable: {clip(e)}") from None
    # the one rule of .literals: ints *and* floats of size >= 2**63 (a float that large prints as "e+")
    wide: bool | str = (bool(long_ints) or "e+" in text) and has_wide_number(schema)
    # one scan of a text that may be 100s of KB (a regex with \d{19} took 18 ms on a 150 KB schema)
    extreme = bool(long_ints) or _EXPONENT.search(text) is not None
    if wide and '"integer"' not in text:
        wide = "ints"  # no integer context: wide float consts / enums are safe to hand over
    if schema is False:
        raise SchemaError("unsatisfiable schema: false")
    subs = list(iter_subschemas(schema)) if isinstance(schema, dict) else []
    check_schema(schema, subs, text)
    semantic: list[str] = []
    marks: list = []
    guards = bounded_numbers or field_budget or "x-max-" in text
    if isinstance(schema, dict) and not (wide or guards or extreme) \
            and all(_REWRITTEN.isdisjoint(s) for _, s in subs):
        g = schema  # nothing to rewrite (most schemas): no copy; one is made before any relaxation
    else:
        g = _grammar_copy(schema, semantic, wide, text, marks, extreme) if isinstance(schema, dict) else {}
    if guards:
        bound_fields(g, numbers=bounded_numbers, budget=field_budget)
    if wide and has_wide_number(g, floats=wide != "ints"):  # somewhere the grammar copy could not drop it: never hand it to the engine
        raise SchemaError("the schema holds an integer beyond the 64-bit range (|v| >= 2**63) where it cannot be "
                          "left to validation")
    if isinstance(schema, dict) and _uses(schema, "dependencies", subs):
        semantic.append("dependencies")
    opts = dict(json_options(whitespace, separators), lenient=True)
    warnings: list[str] = []
    for _attempt in range(32):
        with engine_guard("compiling a JSON schema"):
            try:
                grammar = llg.LLMatcher.grammar_from_json_schema(g, defaults=opts)
            except (ValueError, TypeError, OverflowError) as e:  # the engine's schema reader
                raise SchemaError(f"the schema cannot be read by the constrained decoder: {clip(e)}") from None
            # compiled once: the matcher that checks the grammar is the constraint's template
            matcher = llg.LLMatcher(lltok, grammar, log_level=0, limits=limits)
            is_err = matcher.is_error()
            msgs = [matcher.get_error()] if is_err else list(matcher.get_grammar_warnings())
        if not is_err:
            warnings = list(msgs)
            break
        msg = clip(msgs[0] if msgs else "unknown error", 2000)
        if "oneOf constraints are not supported" in msg and not opts.get("coerce_one_of"):
            opts["coerce_one_of"] = True
            semantic.append("oneOf")
            continue
        m = _REGEX_ERR.search(msg)
        if (m or "regex parse error" in msg) and g is schema:
            g = json.loads(text)  # relaxed below: never the schema validation reads
        if m or "regex parse error" in msg:
            removed = _relax_pattern(g, m.group(1) if m else None)
            if not removed and m:
                removed = _relax_pattern(g, None)
            if removed:
                semantic.extend(removed)
                continue
        if "Failed to generate regex for" in msg and "range" in msg:  # bounds at the edge of the i64 / f64 range
            raise SchemaError(f"number bounds the constrained decoder cannot enforce (too close to the 64-bit "
                              f"limits): {clip(msg, 300)}", keywords=["minimum", "maximum"])
        if "Unsatisfiable schema" in msg or "unsatisfiable" in msg.lower():
            raise SchemaError(f"unsatisfiable schema: {clip(msg)}")
        if "does not exist" in msg and "Pointer" in msg:
            raise SchemaError(f"dangling $ref: {clip(msg)}", keywords=["$ref"])
        if is_limit_error(msg, extra=("max_",)):
            raise ConstraintCompileTimeout(f"JSON schema exceeds the compile limits: {clip(msg)}")
        raise SchemaError(f"the schema cannot be compiled to a grammar: {clip(msg)}")
    else:  # pragma: no cover
        raise ConstraintCompileTimeout("schema relaxation did not converge")
    if marks:  # wide const / enum: written back exactly as Lark literals where the structure allows
        grammar, matcher = _exact_literals(g, marks, opts, lltok, limits, grammar, matcher)
    for w in warnings:
        m = _UNIMPL.search(w)
        if m:
            semantic.extend(json.loads("[" + m.group(1) + "]"))
        if "oneOf" in w and "anyOf" in w:
            semantic.append("oneOf")
        m = _UNKNOWN_FMT.search(w)
        if m:
            semantic.append("format")
    semantic = sorted(set(semantic), key=semantic.index)
    if strict and semantic:
        raise SchemaError(
            f"strict=True: keywords not enforceable by the grammar: {', '.join(semantic)}", keywords=semantic)
    return JsonPlan(schema=schema, grammar_schema=g, grammar=grammar, semantic_keywords=semantic,
                    warnings=warnings, matcher=matcher, text=text)
