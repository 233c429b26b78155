"""Where an output goes wrong: the character offset of the value at a JSON path, the token that
holds a character, and the strings that hold structural junk. The repair policy
(:mod:`dgemma_struct.repair.session`) renoises from there.

Example::

    >>> value_offsets('{"a":1,"b":[2,"x"]}')[("b", 1)]
    14
    >>> char_to_token_index(['{"', 'a', '":', '1}'], 3)
    2
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

_WS = " \t\n\r"
_NUM = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")


def value_offsets(text: str) -> dict[tuple, int]:
    """Character offset where the value at each JSON path starts (the root is ``()``).
    Scans as far as the text is well-formed; a truncated text yields the paths seen so far."""
    out: dict[tuple, int] = {}

    def skip(i: int) -> int:
        while i < len(text) and text[i] in _WS:
            i += 1
        return i

    def string_end(i: int) -> int:  # i at the opening quote; returns index after the closing quote
        i += 1
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                return i + 1
            i += 1
        raise ValueError("unterminated string")

    def value(i: int, path: tuple) -> int:
        i = skip(i)
        out[path] = i
        if i >= len(text):
            raise ValueError("truncated")
        c = text[i]
        if c == "{":
            i = skip(i + 1)
            if i < len(text) and text[i] == "}":
                return i + 1
            while True:
                i = skip(i)
                end = string_end(i)
                key = json.loads(text[i:end])
                i = skip(end)
                if text[i] != ":":
                    raise ValueError("expected ':'")
                i = value(i + 1, path + (key,))
                i = skip(i)
                if text[i] == ",":
                    i += 1
                    continue
                if text[i] == "}":
                    return i + 1
                raise ValueError("expected ',' or '}'")
        if c == "[":
            i = skip(i + 1)
            if i < len(text) and text[i] == "]":
                return i + 1
            k = 0
            while True:
                i = skip(value(i, path + (k,)))
                k += 1
                if text[i] == ",":
                    i += 1
                    continue
                if text[i] == "]":
                    return i + 1
                raise ValueError("expected ',' or ']'")
        if c == '"':
            return string_end(i)
        for lit in ("true", "false", "null"):
            if text.startswith(lit, i):
                return i + len(lit)
        m = _NUM.match(text, i)
        if m:
            return m.end()
        raise ValueError(f"unexpected {c!r}")

    try:
        value(0, ())
    except (ValueError, IndexError):
        pass
    return out


def error_char_offset(text: str, paths: Sequence[Sequence[Any]]) -> int:
    """The earliest character offset among the values at ``paths`` (the deepest known ancestor
    when a path is missing from the text, e.g. a required property that was never written)."""
    offsets = value_offsets(text)
    best = len(text)
    for path in paths:
        p = tuple(path)
        while p and p not in offsets:
            p = p[:-1]
        best = min(best, offsets.get(p, 0))
    return best


def char_to_token_index(token_texts: Sequence[str], offset: int) -> int:
    """Index of the token that contains character ``offset`` of the concatenated text."""
    pos = 0
    for i, t in enumerate(token_texts):
        if pos + len(t) > offset:
            return i
        pos += len(t)
    return len(token_texts)


# braces/brackets, a quote glued to ':' or ',', control characters, or a value that starts with
# ':' / ',' (a separator the grammar did not let the model write where it wanted to)
_JUNK = re.compile(r'[{}\[\]]|":|",|[\x00-\x1f]|^\s*[:,]')


def _value_keys(value: Any) -> set[str]:
    """Object keys at any depth of a JSON value (string keys only)."""
    if isinstance(value, dict):
        return {k for k in value if isinstance(k, str)}.union(*(_value_keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_value_keys(v) for v in value))
    return set()


def _schema_property_names(schema: Any) -> set[str]:
    """Names under ``properties`` anywhere in a JSON Schema (not the schema's own keywords)."""
    out: set[str] = set()
    if isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            out |= {k for k in props if isinstance(k, str)}
        for v in schema.values():
            out |= _schema_property_names(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= _schema_property_names(v)
    return out


def junk_paths(value: Any, path: tuple = (), _leak: re.Pattern | None = None, *,
               schema: Any = None) -> list[tuple]:
    """Paths of string values that hold JSON punctuation or control characters, or two key names
    of 4+ characters back to back (``"addresscity"``; keys of the value and, given ``schema``, its
    property names; case-sensitive): the signature of a model whose structural tokens were masked
    out and absorbed into a string.

    >>> junk_paths({"a": "ok", "b": ["x}", "y"], "city": "addresscity", "address": "Main St"})
    [('b', 0), ('city',)]
    """
    if _leak is None:
        names = _value_keys(value) | _schema_property_names(schema)
        keys = sorted((k for k in names if len(k) >= 4), key=len, reverse=True)
        alt = "|".join(map(re.escape, keys))
        _leak = re.compile(f"(?:{alt})(?:{alt})") if keys else re.compile(r"(?!)")
    if isinstance(value, str):
        return [path] if _JUNK.search(value) or _leak.search(value) else []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in junk_paths(v, path + (k,), _leak)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in junk_paths(v, path + (i,), _leak)]
    return []
