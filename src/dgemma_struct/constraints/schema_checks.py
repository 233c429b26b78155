"""Checks a JSON Schema must pass before it is compiled: its metaschema (jsonschema-rs first, then
jsonschema for the wording), every ``$ref`` resolvable offline, no ``$ref`` cycle that consumes no
input, no plainly unsatisfiable bounds. Each failure is a :class:`SchemaError` (or
:class:`UnsupportedKeywordError` for a remote ``$ref``) that names the place in the schema.

>>> [p for p, _ in iter_subschemas({"properties": {"a": {"items": {}}}})]
[(), ('properties', 'a'), ('properties', 'a', 'items')]
>>> fmt_path(("properties", "a"))
'#/properties/a'
"""
from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import unquote, urljoin

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema

from dgemma_struct.errors import SchemaError, UnsupportedKeywordError

from .regex_ascii import re_pattern
from .safety import check_ref_cycles, clip, engine_guard

__all__ = ["check_schema", "iter_subschemas", "fmt_path", "is_number", "jsonschema_rs", "SPEC_FORMATS",
           "format_checks", "format_validator", "spec_format_valid", "with_spec_formats", "follow_pointer"]

_SUBSCHEMA_DICT_KWS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LIST_KWS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_KWS = ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then",
                  "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems")
_ALL_SUBSCHEMA_KWS = frozenset(_SUBSCHEMA_DICT_KWS + _SUBSCHEMA_LIST_KWS + _SUBSCHEMA_KWS)


def iter_subschemas(schema: Any, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """Yield (path, subschema-dict) for every subschema, a schema before its children.

    Iterative (a nested generator per level costs O(depth) per subschema) and lazy: a subschema's
    children are read after the caller has seen it, so a caller may rewrite the subschema it is given."""
    if not isinstance(schema, dict):
        return
    stack: list[tuple[tuple, dict]] = [(path, schema)]
    pop, push = stack.pop, stack.extend
    while stack:
        path, s = pop()
        yield path, s
        if _ALL_SUBSCHEMA_KWS.isdisjoint(s):  # a leaf (most subschemas): no keyword to look up
            continue
        kids: list[tuple[tuple, dict]] = []
        get = s.get
        for kw in _SUBSCHEMA_DICT_KWS:
            v = get(kw)
            if isinstance(v, dict):
                kids.extend((path + (kw, k), sub) for k, sub in v.items() if isinstance(sub, dict))
        for kw in _SUBSCHEMA_LIST_KWS:
            v = get(kw)
            if isinstance(v, list):
                kids.extend((path + (kw, i), sub) for i, sub in enumerate(v) if isinstance(sub, dict))
        for kw in _SUBSCHEMA_KWS:
            v = get(kw)
            if isinstance(v, dict):
                kids.append((path + (kw,), v))
            elif isinstance(v, list) and kw in ("items", "additionalItems"):
                kids.extend((path + (kw, i), sub) for i, sub in enumerate(v) if isinstance(sub, dict))
        if kids:
            kids.reverse()
            push(kids)


def fmt_path(path: tuple) -> str:
    return "#/" + "/".join(str(p) for p in path) if path else "#"


try:  # the fast metaschema check and the RFC-following email checks (jsonschema-rs, Rust)
    import jsonschema_rs
except ImportError:  # pragma: no cover - optional: fall back to jsonschema's own
    jsonschema_rs = None


#: the formats jsonschema-rs asserts; its checks pass every official JSON-Schema-Test-Suite
#: ``optional/format`` test (draft2020-12, jsonschema-rs 0.60), where python-jsonschema's format-nongpl
#: checkers accept 55 invalid strings (A-label hostnames, uri-template, ...) and refuse 23 valid ones
#: (leap seconds, IRIs, ...)
SPEC_FORMATS = ("date", "date-time", "duration", "email", "hostname", "idn-email", "idn-hostname", "ipv4", "ipv6",
                "iri", "iri-reference", "json-pointer", "regex", "relative-json-pointer", "time", "uri",
                "uri-reference", "uri-template", "uuid")
_SPEC_CHECKERS: dict[int, tuple[Any, Any]] = {}


@functools.cache
def format_validator(name: str) -> Any:
    """jsonschema-rs' validator asserting ``{"format": name}``, built once per name (the one cache of
    them); None without jsonschema-rs."""
    return None if jsonschema_rs is None else jsonschema_rs.validator_for({"format": name}, validate_formats=True)


def spec_format_valid(name: str, instance: Any, on_error: bool = False) -> bool | None:
    """jsonschema-rs' verdict on ``instance`` for format ``name`` (``on_error`` where its check cannot
    answer); None without jsonschema-rs."""
    v = format_validator(name)
    if v is None:
        return None
    try:
        return bool(v.is_valid(instance))
    except Exception:  # noqa: BLE001 - e.g. a value jsonschema-rs cannot read
        return on_error


@functools.cache
def format_checks() -> dict[str, tuple[Any, tuple]]:
    """``FormatChecker.checkers`` entries (``name -> (check, raises)``) for :data:`SPEC_FORMATS`, each
    jsonschema-rs' check (one that cannot answer does not pass); empty without jsonschema-rs
    (python-jsonschema's own checkers stay)."""
    return {name: (functools.partial(spec_format_valid, name), ()) for name in SPEC_FORMATS} if jsonschema_rs else {}


def with_spec_formats(validator: Any) -> Any:
    """``validator`` (a python-jsonschema validator) with :func:`format_checks` in place of its own
    checks for those formats; its other format checks (and the assertion itself) are kept.

    >>> fc = jsonschema.FormatChecker()
    >>> v = with_spec_formats(jsonschema.Draft202012Validator({"format": "time"}, format_checker=fc))
    >>> v.is_valid("23:59:60Z"), v.is_valid("24:00:00Z")
    (True, False)
    """
    fc = getattr(validator, "format_checker", None)
    checks = format_checks()
    if fc is None or not checks or all(fc.checkers.get(k) is c for k, c in checks.items()):
        return validator  # e.g. one from json_schema.make_validator: these checks are its own already
    hit = _SPEC_CHECKERS.get(id(fc))
    if hit is None or hit[0] is not fc:
        spec = jsonschema.FormatChecker(formats=())
        spec.checkers = {**fc.checkers, **checks}
        hit = _SPEC_CHECKERS[id(fc)] = (fc, spec)  # fc kept alive: its id is not reused
    return validator.evolve(format_checker=hit[1])


def _rs_meta_valid(schema: Any) -> bool:
    """jsonschema-rs' metaschema verdict (about 100x faster than jsonschema's); False when unsure."""
    if jsonschema_rs is None:
        return False
    try:
        with engine_guard("checking the schema against its metaschema"):
            return bool(jsonschema_rs.meta.is_valid(schema))
    except Exception:  # noqa: BLE001 - unknown $schema, unsupported value ...: let jsonschema decide
        return False


def _patterns_compile(schema: Any, subs: list | None = None) -> bool:
    """Every ``pattern`` / ``patternProperties`` key compiles with Python's ``re``, ``\\p{..}`` spelled out
    (what validation runs; jsonschema's metaschema check asserts ``re`` alone, jsonschema-rs does not)."""
    for _, s in (subs if subs is not None else iter_subschemas(schema)):
        pats = [s["pattern"]] if isinstance(s.get("pattern"), str) else []
        if isinstance(s.get("patternProperties"), dict):
            pats += list(s["patternProperties"])
        for p in pats:
            try:
                re.compile(re_pattern(p) or p)
            except (re.error, RecursionError, OverflowError):
                return False
    return True


def _check_metaschema(schema: Any, subs: list | None = None) -> None:
    if _rs_meta_valid(schema) and _patterns_compile(schema, subs):
        return
    # invalid per jsonschema-rs, or unsure: jsonschema decides and words the message
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        raise SchemaError(f"invalid JSON Schema at {clip(fmt_path(tuple(e.absolute_path)), 200)}: "
                          f"{clip(e.message)}") from None
    except (OverflowError, RecursionError, re.error, ValueError, TypeError) as e:
        # a format check that fails instead of answering (Python's re: "the repetition number is too
        # large" for a{0,4294967296}); validation would fail the same way on every value
        raise SchemaError(f"invalid JSON Schema: {type(e).__name__}: {clip(e, 300)}") from None


def _resolve_pointer(root: Any, ref: str, subs: list | None = None) -> bool:
    frag = ref[1:]
    if not frag:
        return True
    if not frag.startswith("/"):
        # plain-name fragment: an $anchor somewhere
        return any(s.get("$anchor") == frag or s.get("$dynamicAnchor") == frag
                   for _, s in (subs if subs is not None else iter_subschemas(root)))
    try:
        follow_pointer(root, [unquote(part) for part in frag[1:].split("/")])
    except LookupError:
        return False
    return True


def follow_pointer(root: Any, parts: Iterable[str]) -> Any:
    """The value of ``root`` the JSON-pointer tokens ``parts`` lead to (``~1``, ``~0``: ``/``, ``~``); else LookupError.

    >>> follow_pointer({"$defs": {"a/b": [1, {"c": 2}]}}, ["$defs", "a~1b", "1", "c"])
    2
    """
    cur = root
    for part in parts:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise LookupError(part)
    return cur


def _refs_with_bases(schema: Any, spec: Any, base: str) -> list[tuple[tuple, str, str]]:
    """Every ``$ref`` / ``$dynamicRef`` string with its path and the base URI it is resolved against (the
    nearest enclosing ``$id``, each resolved against its parent's base), in document order (``enum`` /
    ``const`` / ``default`` / ``examples`` values are data, not schemas)."""
    out: list[tuple[tuple, str, str]] = []
    stack: list[tuple[Any, tuple, str]] = [(schema, (), base)]
    while stack:
        node, path, b = stack.pop()
        if isinstance(node, dict):
            try:
                nid = spec.id_of(node)
            except Exception:  # noqa: BLE001 - an "$id" that is not a string: no new base
                nid = None
            if isinstance(nid, str):
                try:
                    b = urljoin(b, nid.rstrip("#"))  # "x.json#" is "x.json", as referencing reads it
                except ValueError as e:  # e.g. "http://[bad": not a URI reference
                    raise SchemaError(f"invalid $id {clip(repr(nid), 100)} at {fmt_path(path)}: {clip(e, 100)}",
                                      keywords=["$id"]) from None
            for k, v in node.items():
                if k in ("$ref", "$dynamicRef") and isinstance(v, str):
                    out.append((path + (k,), v, b))
                elif isinstance(v, (dict, list)) and k not in ("enum", "const", "default", "examples"):
                    stack.append((v, path + (k,), b))
        else:
            stack.extend((v, path + (i,), b) for i, v in enumerate(node) if isinstance(v, (dict, list)))
    out.reverse()
    return out


def _check_refs(schema: Any, subs: list | None = None) -> None:
    """Every reference resolves inside the document, the way the 2020-12 spec (and the validator, through
    ``referencing``) resolves it: against the base URI of the nearest ``$id``; a reference to another
    document is a remote ``$ref`` (:class:`UnsupportedKeywordError`), a missing target is dangling."""
    subs = subs if subs is not None else list(iter_subschemas(schema))
    spec = referencing.jsonschema.specification_with(schema.get("$schema", ""),
                                                     default=referencing.jsonschema.DRAFT202012)
    refs = _refs_with_bases(schema, spec, "")  # the root's own $id included; SchemaError for a bad $id
    if not any(isinstance(s.get("$id"), str) or isinstance(s.get("id"), str) for p, s in subs if p) \
            and all(r.startswith("#") for _, r, _ in refs):  # one resource: JSON pointers / anchors
        for path, ref, _ in refs:
            if not _resolve_pointer(schema, ref, subs):
                raise SchemaError(f"dangling $ref {ref!r} at {fmt_path(path)}", keywords=["$ref"])
        return
    root = spec.create_resource(schema)
    root_id = root.id() if isinstance(root.id(), str) else ""
    registry = referencing.Registry().with_resource(root_id, root).crawl()
    for path, ref, base in refs:
        try:
            registry.resolver(base_uri=base).lookup(ref)
            continue
        except referencing.exceptions.Unresolvable:
            pass
        except Exception:  # noqa: BLE001 - a malformed URI: let the pointer check below decide
            pass
        try:
            uri, _, frag = urljoin(base, ref).partition("#")
        except ValueError as e:
            raise SchemaError(f"invalid $ref {clip(repr(ref), 100)} at {fmt_path(path)}: {clip(e, 100)}",
                              keywords=["$ref"]) from None
        try:
            registry.contents(uri)
        except Exception:  # noqa: BLE001 - NoSuchResource: another document
            raise UnsupportedKeywordError(
                f"remote $ref {ref!r} at {fmt_path(path)} cannot be resolved offline", keywords=["$ref"]) from None
        if path[-1] == "$dynamicRef" and frag[:1] not in ("", "/") and _resolve_pointer(schema, "#" + frag, subs):
            continue  # a dynamic anchor of the dynamic scope (another resource of this document)
        raise SchemaError(f"dangling $ref {ref!r} at {fmt_path(path)}", keywords=["$ref"])


def is_number(x: Any) -> bool:
    """A JSON number (bool excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_BOUND_KEYS = frozenset(("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                         "minContains", "maxContains", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
                         "enum"))


def _must_hold(kw: str | None, key: Any, parent: dict | None, parent_must: bool) -> bool:
    """Whether a subschema (reached from ``parent`` through keyword ``kw`` and, for a dict / list
    keyword, ``key``; the root has ``parent=None``) must hold for every valid instance, so that a
    contradiction in it makes the whole schema unsatisfiable: the root, ``allOf`` members, required
    properties, ``items`` / tuple items an array must have (``minItems``). Under ``not`` / ``anyOf`` /
    ``oneOf`` / ``if``-``then``-``else``, optional properties, ``$defs`` ... it only prunes a branch."""
    if parent is None:
        return kw is None
    if not parent_must:
        return False
    typ = parent.get("type")
    if kw == "allOf":
        return True
    if kw == "properties":
        req = parent.get("required")
        return isinstance(req, list) and key in req and typ in (None, "object")
    mi = parent.get("minItems")
    mi = mi if is_number(mi) else 0
    if kw == "items" and key is None:
        return mi > 0 and typ in (None, "array")
    if kw in ("prefixItems", "items") and isinstance(key, int):
        return key < mi and typ in (None, "array")
    return False


def _edge(path: tuple, s: dict, seen: dict) -> tuple:
    """(parent schema, parent must-hold, keyword, key) of the subschema ``s`` at ``path``."""
    if len(path) >= 2 and path[:-2] in seen:
        ps, pm = seen[path[:-2]]
        c = ps.get(path[-2])
        k = path[-1]
        if (isinstance(c, dict) and isinstance(k, str) and c.get(k) is s) or \
                (isinstance(c, list) and isinstance(k, int) and k < len(c) and c[k] is s):
            return ps, pm, path[-2], k
    if path and path[:-1] in seen:
        ps, pm = seen[path[:-1]]
        return ps, pm, path[-1], None
    return None, False, None if not path else "?", None


_WIDE = float(2 ** 62)  # literals.EXTREME_BOUND: bounds this large are left out of the grammar


def _too_wide(v: Any) -> bool:
    try:
        return is_number(v) and abs(float(v)) >= _WIDE
    except OverflowError:
        return True


def _check_bounds(schema: Any, subs: list | None = None) -> None:
    """Plainly unsatisfiable bounds, where the subschema must hold (:func:`_must_hold`); and number
    bounds the constrained decoder cannot enforce (a ``minimum`` at or past ``2**62``, a ``maximum``
    at or below ``-2**62``: no value in range would ever be written)."""
    pairs = [("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"),
             ("minContains", "maxContains")]
    seen: dict[tuple, tuple[dict, bool]] = {}
    for path, s in (subs if subs is not None else iter_subschemas(schema)):
        if path:
            ps, pm, kw, key = _edge(path, s, seen)
            m = _must_hold(kw, key, ps, pm)
        else:
            m = True
        seen[path] = (s, m)
        if not m or _BOUND_KEYS.isdisjoint(s):
            if m and s.get("type") == []:
                raise SchemaError(f"unsatisfiable schema at {fmt_path(path)}: empty type list", keywords=["type"])
            continue
        for lo, hi in pairs:
            if is_number(s.get(lo)) and is_number(s.get(hi)) and s[lo] > s[hi]:
                raise SchemaError(f"unsatisfiable schema at {fmt_path(path)}: {lo} ({s[lo]}) > {hi} ({s[hi]})",
                                  keywords=[lo, hi])
        for kw, sign in (("minimum", 1), ("exclusiveMinimum", 1), ("maximum", -1), ("exclusiveMaximum", -1)):
            v = s.get(kw)
            if _too_wide(v) and v * sign > 0:
                raise SchemaError(f"{kw} {v!r} at {fmt_path(path)} is beyond what the constrained decoder can enforce "
                                  f"(|bound| >= 2**62): no number in range would ever be written", keywords=[kw])
        lo = [v for v in (s.get("minimum"), s.get("exclusiveMinimum")) if is_number(v)]
        hi = [v for v in (s.get("maximum"), s.get("exclusiveMaximum")) if is_number(v)]
        if lo and hi:
            mn, mx = max(lo), min(hi)
            strict_ = (is_number(s.get("exclusiveMinimum")) and s["exclusiveMinimum"] == mn) or \
                      (is_number(s.get("exclusiveMaximum")) and s["exclusiveMaximum"] == mx)
            if mn > mx or (mn == mx and strict_):
                raise SchemaError(f"unsatisfiable schema at {fmt_path(path)}: minimum {mn} > maximum {mx}",
                                  keywords=["minimum", "maximum"])
        if "enum" in s and isinstance(s["enum"], list) and not s["enum"]:
            raise SchemaError(f"unsatisfiable schema at {fmt_path(path)}: empty enum", keywords=["enum"])
        if s.get("type") == []:
            raise SchemaError(f"unsatisfiable schema at {fmt_path(path)}: empty type list", keywords=["type"])


def check_schema(schema: Any, subs: list | None = None, text: str | None = None) -> None:
    """All the checks, in order (``subs``: ``list(iter_subschemas(schema))`` when already at hand;
    ``text``: the schema as ``json.dumps`` text, when at hand: without ``"$ref"`` / ``"$dynamicRef"``
    in it the reference walk is skipped)."""
    subs = subs if subs is not None else (list(iter_subschemas(schema)) if isinstance(schema, dict) else [])
    _check_metaschema(schema, subs)
    if isinstance(schema, dict):
        if text is None or '"$ref"' in text or '"$dynamicRef"' in text:
            _check_refs(schema, subs)
        if any("$ref" in s for _, s in subs):
            check_ref_cycles(schema, subs)
        _check_bounds(schema, subs)
