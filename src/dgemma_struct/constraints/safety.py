"""Input checks that keep what is known to crash or hang the native engine (llguidance) away from it,
and a guard that turns a native panic into a typed error.

llguidance is native code: a crash there (SIGSEGV) kills the whole process, so every spec is checked
*before* any llguidance call. Known hazards (measured in subprocesses, llguidance 1.x):

* integers whose double value is ``-2**63`` (``-9223372036854775808 .. -9223372036854775296``) in
  ``const`` / ``enum`` segfault the grammar compiler;
* integers outside the 64-bit range (``>= 2**64`` or ``< -2**63``) anywhere in a schema make
  llguidance's schema reader raise ``ValueError``;
* deep nesting overflows recursive walkers (Python's and the engine's);
* non-integer ``multipleOf`` combined with bounds compiles to a wrong grammar (``multipleOf: 0.1`` in
  ``[0.25, 0.35]`` accepts nothing).

What the checks do (documented limits, all module constants):

* ``inf`` / ``nan`` anywhere in a schema: :class:`SchemaError` (not JSON);
* nesting deeper than :data:`MAX_SCHEMA_DEPTH` containers, more than :data:`MAX_SCHEMA_NODES` values,
  or a cycle (a dict that contains itself): :class:`SchemaError`;
* "wide" integers (``abs(float(v)) >= 2**63``): never handed to the engine as numbers (the keyword holding
  them is dropped from the JSON grammar copy and enforced by validation, exact for Python ints; a wide
  ``const`` / ``enum`` is written back exactly as quoted Lark text: :func:`.literals.exact_literal_grammar`);
* ``$ref`` cycles that do not consume any input (``{"not": {"$ref": "#"}}``): :class:`SchemaError`,
  since validating them recurses forever;
* grammar / regex / choice text larger than :data:`MAX_SPEC_BYTES`: the matching typed error.

:func:`engine_guard` wraps llguidance calls: a ``pyo3_runtime.PanicException`` (a ``BaseException``
subclass that escapes ``except Exception``) becomes the given typed error;
``KeyboardInterrupt`` / ``SystemExit`` are never caught.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Callable, Iterator, Type, TypeVar
from urllib.parse import unquote

from dgemma_struct.errors import ConstraintEngineError, DgemmaStructError, SchemaError

__all__ = ["MAX_SCHEMA_DEPTH", "MAX_SCHEMA_NODES", "MAX_SPEC_BYTES", "MAX_ERROR_CHARS", "check_schema_input",
           "is_wide_int", "has_wide_int", "is_wide_number", "has_wide_number", "WIDE", "engine_guard", "guarded",
           "is_native_panic", "clip", "check_ref_cycles",
           "PARSER_LIMITS", "parser_limits", "LIMIT_WORDS", "is_limit_error", "drop_wide_literals", "JSON_TYPE_OF",
           "ANNOTATIONS", "STRUCTURAL", "written_here"]

#: most nested containers (dicts / lists) in a schema; JSONSchemaBench's deepest has 63, the engine
#: refuses about 125 (its JSON reader's recursion limit)
MAX_SCHEMA_DEPTH = 100
#: most values (containers and scalars) in a schema; JSONSchemaBench's largest has ~28,500
MAX_SCHEMA_NODES = 500_000
#: longest regex / grammar text, and the total size of a choice list (bytes of UTF-8)
MAX_SPEC_BYTES = 1_000_000
#: error messages quote at most this many characters of engine / parser text
MAX_ERROR_CHARS = 600

#: llguidance parser limits every constraint is compiled with (``llguidance.LLParserLimits`` keywords)
PARSER_LIMITS = dict(max_grammar_size=500_000, initial_lexer_fuel=2_000_000, max_lexer_states=250_000)
#: words of an engine message that refuses a spec for its size (a limit), not for its content
LIMIT_WORDS = ("limit", "fuel", "too many", "too complex", "too large")

#: numbers at or past this size (as doubles) are kept away from the engine
WIDE = float(2 ** 63)
F = TypeVar("F", bound=Callable[..., Any])


def clip(text: Any, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` shortened to about ``limit`` characters (the middle elided), so that an error never
    embeds a whole grammar."""
    s = str(text)
    if len(s) <= limit:
        return s
    half = limit // 2
    return f"{s[:half]} … [{len(s) - limit} characters elided] … {s[-half:]}"


def parser_limits() -> Any:
    """A fresh ``llguidance.LLParserLimits`` from :data:`PARSER_LIMITS`."""
    import llguidance as llg
    return llg.LLParserLimits(**PARSER_LIMITS)


def is_limit_error(msg: str, extra: tuple[str, ...] = ()) -> bool:
    """Whether an engine error message reports one of its limits (:data:`LIMIT_WORDS`, plus ``extra``).

    >>> is_limit_error("lexer fuel exhausted"), is_limit_error("unexpected token")
    (True, False)
    """
    low = msg.lower()
    return any(w in low for w in LIMIT_WORDS + tuple(extra))


def is_wide_number(v: Any) -> bool:
    """An ``int`` or ``float`` whose double value reaches ``+-2**63`` (or does not fit a double): a
    number llguidance must never see (one rule for ints and integral floats, everywhere)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return abs(float(v)) >= WIDE
    except OverflowError:
        return True


def has_wide_number(obj: Any, floats: bool = True) -> bool:
    """Whether the JSON value ``obj`` holds a wide number anywhere (``floats=False``: wide ints only).
    Iterative."""
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
        elif is_wide_number(x) and (floats or isinstance(x, int)):
            return True
    return False


def is_wide_int(v: Any) -> bool:
    """An integer llguidance must never see: :func:`is_wide_number` for ints."""
    return isinstance(v, int) and is_wide_number(v)


def has_wide_int(obj: Any) -> bool:
    """Whether ``obj`` (a JSON value, depth already bounded) holds a wide integer anywhere."""
    return has_wide_number(obj, floats=False)


def _fmt(path: list) -> str:
    return "#/" + "/".join(str(p) for p in path) if path else "#"


_EXIT_MARK = object()


def check_schema_input(schema: Any) -> None:
    """Raise :class:`SchemaError` for a schema that is not a finite, acyclic JSON value within the
    documented size and depth limits. Iterative: never recurses, whatever the input."""
    # stack items: (value, depth, parent item, key); the path is rebuilt from the parents only for an
    # error. Containers on the current path are tracked by an explicit exit marker.
    on_path: set[int] = set()
    stack: list[tuple] = [(schema, 1, None, None)]
    nodes = 0
    _EXIT = _EXIT_MARK
    scalar = (str, int, bool)
    while stack:
        item = stack.pop()
        x = item[0]
        if x is _EXIT:
            on_path.discard(item[1])
            continue
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise SchemaError(f"schema too large: more than {MAX_SCHEMA_NODES} values")
        if isinstance(x, (dict, list)):
            is_dict = isinstance(x, dict)
            depth = item[1]
            _enter(x, depth, item, on_path)
            stack.append((_EXIT, id(x)))
            d1 = depth + 1
            for k, v in (x.items() if is_dict else enumerate(x)):
                if is_dict and not isinstance(k, str):
                    raise SchemaError(f"schema key {clip(repr(k), 80)} at {clip(_fmt(_path_of(item)), 200)} is not a "
                                      f"string")
                if v is None or isinstance(v, scalar):
                    nodes += 1  # a scalar needs no stack round trip
                    continue
                stack.append((v, d1, item, k))
            if nodes > MAX_SCHEMA_NODES:
                raise SchemaError(f"schema too large: more than {MAX_SCHEMA_NODES} values")
        elif isinstance(x, float) and not math.isfinite(x):
            raise SchemaError(f"schema value {x!r} at {clip(_fmt(_path_of(item)), 200)} is not a JSON number "
                              f"(inf / nan, or a literal beyond the double range such as 1e400)")
        elif isinstance(x, (str, int, float, bool)) or x is None:
            continue
        else:
            raise SchemaError(f"schema value at {clip(_fmt(_path_of(item)), 200)} is not JSON: {type(x).__name__}")


def _path_of(item: tuple) -> list:
    """The path of a :func:`check_schema_input` stack item (keys from the root)."""
    path: list = []
    while item is not None and item[2] is not None:
        path.append(item[3])
        item = item[2]
    return path[::-1]


def _enter(x: Any, depth: int, item: tuple, on_path: set[int]) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaError(f"schema nested too deeply at {clip(_fmt(_path_of(item)), 200)}: more than "
                          f"{MAX_SCHEMA_DEPTH} levels of objects/arrays")
    if id(x) in on_path:
        raise SchemaError(f"schema contains a cycle at {clip(_fmt(_path_of(item)), 200)} (an object that contains "
                          f"itself is not JSON)")
    on_path.add(id(x))


# ----------------------------------------------------------------------------------------------
# $ref cycles that consume no input
# ----------------------------------------------------------------------------------------------
_INPLACE_LIST = ("allOf", "anyOf", "oneOf")
_INPLACE_ONE = ("not", "if", "then", "else")
_CHILD_DICT = ("properties", "patternProperties", "$defs", "definitions")
_CHILD_ONE = ("items", "additionalProperties", "additionalItems", "contains", "propertyNames",
              "unevaluatedProperties", "unevaluatedItems")


def _subschemas(schema: Any) -> Iterator[tuple[tuple, dict]]:
    """(path, subschema) for every subschema; iterative."""
    stack: list[tuple[tuple, Any]] = [((), schema)]
    while stack:
        path, s = stack.pop()
        if not isinstance(s, dict):
            continue
        yield path, s
        for kw in _CHILD_DICT + ("dependentSchemas",):
            v = s.get(kw)
            if isinstance(v, dict):
                stack.extend((path + (kw, k), sub) for k, sub in v.items())
        for kw in _INPLACE_LIST + ("prefixItems",):
            v = s.get(kw)
            if isinstance(v, list):
                stack.extend((path + (kw, i), sub) for i, sub in enumerate(v))
        for kw in _INPLACE_ONE + _CHILD_ONE:
            v = s.get(kw)
            if isinstance(v, dict):
                stack.append((path + (kw,), v))
            elif isinstance(v, list) and kw in ("items", "additionalItems"):
                stack.extend((path + (kw, i), sub) for i, sub in enumerate(v))


def _pointer(ref: str) -> tuple | None:
    frag = ref[1:]
    if not frag:
        return ()
    if not frag.startswith("/"):
        return None
    out: list = []
    for part in frag[1:].split("/"):
        out.append(unquote(part).replace("~1", "/").replace("~0", "~"))
    return tuple(out)


def check_ref_cycles(schema: Any, subs: list | None = None) -> None:
    """Raise :class:`SchemaError` when a local ``$ref`` leads back to a schema it is applied from
    without descending into the instance (through ``allOf``/``anyOf``/``oneOf``/``not``/``if``/
    ``then``/``else``/``dependentSchemas``/``$ref`` only): such a schema has no finite validation.

    ``subs``: every ``(path, subschema)`` of ``schema`` when already at hand. Subschemas are nodes by
    identity, and only ``$ref`` targets start the search: in-place edges lead into a schema's own
    children, so every such cycle passes through a ``$ref``."""
    if not isinstance(schema, dict):
        return
    pairs = subs if subs is not None else list(_subschemas(schema))
    if any("$id" in s for p, s in pairs if p):  # embedded resources: refs are relative, skip
        return
    path_of = {id(s): p for p, s in pairs}

    def target(ref: Any) -> dict | None:
        """The subschema a local ``$ref`` names (None: not a subschema, or dangling: reported elsewhere)."""
        if not (isinstance(ref, str) and ref.startswith("#")):
            return None
        parts = _pointer(ref)
        if parts is None:
            return None
        cur: Any = schema
        for part in parts:
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif isinstance(cur, list) and part.isdigit() and str(int(part)) == part and int(part) < len(cur):
                cur = cur[int(part)]
            else:
                return None
        return cur if isinstance(cur, dict) and id(cur) in path_of else None

    def edges(s: dict) -> Iterator[dict]:
        for kw in _INPLACE_LIST:
            v = s.get(kw)
            if isinstance(v, list):
                yield from (x for x in v if isinstance(x, dict))
        for kw in _INPLACE_ONE:
            v = s.get(kw)
            if isinstance(v, dict):
                yield v
        ds = s.get("dependentSchemas")
        if isinstance(ds, dict):
            yield from (x for x in ds.values() if isinstance(x, dict))
        t = target(s.get("$ref"))
        if t is not None:
            yield t

    WHITE, GREY, BLACK = 0, 1, 2
    color: dict[int, int] = {}
    starts = [t for t in (target(s.get("$ref")) for _, s in pairs if "$ref" in s) if t is not None]
    for start in starts:
        if color.get(id(start), WHITE) != WHITE:
            continue
        color[id(start)] = GREY
        stack: list[tuple[dict, Iterator[dict]]] = [(start, edges(start))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[id(node)] = BLACK
                stack.pop()
                continue
            c = color.get(id(nxt), WHITE)
            if c == GREY:
                raise SchemaError(f"$ref cycle that consumes no input at {clip(_fmt(list(path_of[id(node)])), 200)} -> "
                                  f"{clip(_fmt(list(path_of[id(nxt)])), 200)}: validation would never end",
                                  keywords=["$ref"])
            if c == WHITE:
                color[id(nxt)] = GREY
                stack.append((nxt, edges(nxt)))


# ---------------------------------------------------------------------- wide literals out of the JSON grammar copy
JSON_TYPE_OF = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
                type(None): "null"}
STRUCTURAL = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "allOf", "anyOf",
              "oneOf", "prefixItems", "items", "additionalProperties", "additionalItems", "contains", "not", "if",
              "then", "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems"}
ANNOTATIONS = ("default", "examples", "$comment", "title", "description")


def written_here(path: tuple) -> bool:
    """Whether a subschema at ``path`` describes a value the output spells out (reached through a root
    ``$defs`` entry, ``properties``, ``items``, ``anyOf`` / ``oneOf`` / ``allOf`` only; not ``not``, ...)."""
    i = 2 if path[:1] in (("$defs",), ("definitions",)) else 0
    while i < len(path):
        if path[i] not in ("properties", "anyOf", "oneOf", "allOf", "items"):
            return False
        i += 1 if path[i] == "items" else 2
    return True


def drop_wide_literals(s: dict, dropped: list[str] | None, float_values: bool = True, path: tuple = (),
                       marks: list | None = None) -> None:
    """Keep numbers llguidance cannot take (:func:`is_wide_number`) out of the grammar copy: the keyword
    holding one is removed (``const``/``enum`` leave their values' types behind), so the JSON grammar is
    a superset and validation, exact for Python ints, enforces the keyword. A removed ``const`` /
    ``enum`` is noted in ``marks`` as ``(subschema, keyword, values, written)`` (``written``: an
    instance is spelled out there), for :func:`.literals.exact_literal_grammar`.
    ``float_values``: wide floats in ``const`` / ``enum`` count too (always for bounds): needed where
    the schema says ``integer`` anywhere (the engine reads them as 64-bit integers there)."""
    for kw in [k for k in s if k not in STRUCTURAL]:
        v = s[kw]
        literal = kw in ("const", "enum")
        vals = ([v] if kw == "const" else (v if isinstance(v, list) else [])) if literal else []
        if not has_wide_number(v, floats=float_values or not literal):
            if literal and marks is not None and has_wide_number(v):  # wide floats, handed over: spelled short too
                marks.append((s, kw, vals, written_here(path)))
            continue
        s.pop(kw)
        if literal:
            types = sorted({JSON_TYPE_OF.get(type(x), "string") for x in vals})
            if types and "type" not in s:
                s["type"] = types[0] if len(types) == 1 else types
            if marks is not None:
                marks.append((s, kw, vals, written_here(path)))
        if dropped is not None and kw not in ANNOTATIONS:
            dropped.append(kw)


# ----------------------------------------------------------------------------------------------
# native panics
# ----------------------------------------------------------------------------------------------
def is_native_panic(exc: BaseException) -> bool:
    """A panic raised by Rust code through pyo3 (``pyo3_runtime.PanicException``)."""
    t = type(exc)
    return t.__name__ == "PanicException" or t.__module__ == "pyo3_runtime"


def guarded(what: str, error: Type[DgemmaStructError] = ConstraintEngineError) -> Callable[[F], F]:
    """Decorator form of :func:`engine_guard`."""
    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with engine_guard(what, error):
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]
    return deco


@contextlib.contextmanager
def engine_guard(what: str, error: Type[DgemmaStructError] = ConstraintEngineError) -> Iterator[None]:
    """Run a native-engine call; a native panic becomes ``error`` (message bounded). Ordinary
    exceptions and ``KeyboardInterrupt``/``SystemExit`` pass through unchanged."""
    try:
        yield
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except Exception:
        raise
    except BaseException as e:  # noqa: B036 - only native panics are converted, re-raised otherwise
        if not is_native_panic(e):
            raise
        raise error(f"the constraint engine failed while {what}: {clip(e, 300)}") from None
