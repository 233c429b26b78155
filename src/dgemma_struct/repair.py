"""Locating what to renoise: map a validation error's JSON path to the token where its value starts.

Example::

    >>> value_offsets('{"a":1,"b":[2,"x"]}')[("b", 1)]
    14
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
