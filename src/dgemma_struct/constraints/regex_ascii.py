r"""ASCII meaning for the regex shorthand classes ``\d \D \w \W \s \S``.

llguidance parses regexes with Rust's ``regex-syntax`` in Unicode mode, where ``\d`` is any Unicode
decimal digit (``٣``, ``𞓵``), ``\w`` any Unicode letter/digit/mark and ``\s`` any Unicode space.
vLLM (xgrammar), Outlines, ECMA-262 (JSON Schema ``pattern``) and every client that checks with an
ASCII regex read ``\d`` as ``[0-9]``. :func:`ascii_classes` rewrites a pattern so that the shorthand
classes mean exactly what Python's ``re`` means with ``re.ASCII``:

========  ==========================  ========  ===============================
``\d``    ``[0-9]``                   ``\D``    ``[^0-9]``
``\w``    ``[0-9A-Za-z_]``            ``\W``    ``[^0-9A-Za-z_]``
``\s``    ``[\x09-\x0D\x20]``          ``\S``    ``[^\x09-\x0D\x20]``
========  ==========================  ========  ===============================

(``\x09-\x0D`` is tab, newline, vertical tab, form feed, carriage return.) The replacement is a
bracket class, written the same way outside and inside a class: Rust nests classes, so
``[\d.]`` becomes ``[[0-9].]`` and ``[^\D]`` becomes ``[^[^0-9]]``. Hex escapes, not a literal
space, keep ``(?x)`` (verbose) patterns intact. Escaped backslashes (``\\d`` is a backslash and a
``d``), ``\p{..}`` / ``\P{..}``, POSIX classes (``[[:digit:]]``, already ASCII in Rust) and every other
escape are copied unchanged. Under a case-insensitive flag, ``\w``/``\W`` outside a class are wrapped
in ``(?-i:..)``: Unicode case folding would otherwise add U+212A KELVIN SIGN and U+017F LONG S (inside a
class no group can be written, and Rust folds the class: ``(?i)[\w.]`` still takes those two). A class
escape written as a range endpoint (``[\d-z]``, ``[a-\d]``) is left alone: Rust rejects it either way.
``\b`` / ``\B`` are left alone (llguidance refuses look-arounds with or without this rewrite);
``\Q..\E`` is not Rust syntax (an error before and after).

>>> ascii_classes(r"\d{3}-\w+")
'[0-9]{3}-[0-9A-Za-z_]+'
>>> ascii_classes(r"[\d.]\\d[^\S]")
'[[0-9].]\\\\d[^[^\\x09-\\x0D\\x20]]'
>>> ascii_classes(r"\p{Nd}[[:alpha:]]")
'\\p{Nd}[[:alpha:]]'

The other way round, :func:`re_pattern` spells Unicode property escapes (``\p{Letter}``, ``\P{Lu}``,
``\p{Script=Greek}``: JSON Schema patterns are ECMA-262 in Unicode mode, and llguidance reads them too)
as explicit code-point classes for Python's ``re``, which has no ``\p`` and runs ``jsonschema``'s
``pattern`` / ``patternProperties`` checks. The sets come from the ``regex`` module's Unicode tables:

>>> re_pattern(r"[\p{Lu}_]\d").startswith(r"[\u0041-\u005A\u00C0-\u00D6")
True
>>> re_pattern(r"\p{NoSuchProperty}") is None
True
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, Callable, Iterable

__all__ = ["ascii_classes", "ASCII_CLASSES", "re_pattern", "re_schema", "as_written"]

#: the ASCII set of each shorthand (the lower-case letter); the upper-case letter is its negation
ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": r"\x09-\x0D\x20"}

# a flag group that turns case-insensitivity on: ``(?i)``, ``(?xi:``, ``(?i-u)`` (not ``(?-i)``)
_CASE_FOLD = re.compile(r"\(\?[A-Za-z]*i")


def ascii_classes(pattern: str) -> str:
    """``pattern`` (Rust ``regex`` syntax) with ``\\d \\D \\w \\W \\s \\S`` replaced by their ASCII classes.

    Everything else is copied character for character; an invalid pattern stays invalid."""
    if "\\" not in pattern:
        return pattern
    fold = _CASE_FOLD.search(pattern) is not None
    out: list[str] = []
    n = len(pattern)
    i = 0
    depth = 0            # bracket-class nesting depth
    content_start = -1   # index where the innermost class's items begin
    prev_range_dash = False  # the previous class item is a '-' that makes a range
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            if e in "dDwWsS":
                body = ASCII_CLASSES[e.lower()]
                cls = f"[^{body}]" if e.isupper() else f"[{body}]"
                if depth == 0:
                    out.append(f"(?-i:{cls})" if fold and e in "wW" else cls)
                elif prev_range_dash or (i + 3 < n and pattern[i + 2] == "-" and pattern[i + 3] not in "]-"):
                    out.append(pattern[i:i + 2])  # a range endpoint: Rust's error stays
                else:
                    out.append(cls)
            else:
                out.append(pattern[i:i + 2])
            prev_range_dash = False
            i += 2
            continue
        if c == "[":
            depth += 1
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":  # a leading ']' is a literal
                j += 1
            out.append(pattern[i:j])
            content_start = j
            prev_range_dash = False
            i = j
            continue
        if depth > 0:
            if c == "]":
                depth -= 1
                content_start = -1  # only the innermost class's start matters for '-'
                prev_range_dash = False
            elif c == "-":
                # '-' at a class's start or as the second of '--' (difference) makes no range
                after_dash = i > 0 and pattern[i - 1] == "-" and i - 1 >= content_start
                prev_range_dash = i != content_start and not after_dash and not (i + 1 < n and pattern[i + 1] == "-")
            else:
                prev_range_dash = False
        out.append(c)
        i += 1
    return "".join(out)


# ----------------------------------------------------------------------------------------------
# \p{..} / \P{..} for Python's re
# ----------------------------------------------------------------------------------------------
_PROPERTY = re.compile(r"\\([pP])\{([A-Za-z0-9_ =.&-]{1,80})\}")
_MAX_CODE_POINT = 0x10FFFF


@functools.lru_cache(maxsize=128)
def _property_class(name: str, negated: bool) -> str | None:
    """The code points of ``\\p{name}`` (``\\P{name}``: ``negated``) as the items of a bracket class
    (``\\u0041-\\u005A...``), from the ``regex`` module's tables; None for an unknown or empty set."""
    try:
        import regex as _regex
        rx = _regex.compile(r"\%s{%s}+" % ("P" if negated else "p", name))
    except Exception:  # noqa: BLE001 - ImportError (regex comes with transformers), unknown property
        return None
    every = "".join(map(chr, range(_MAX_CODE_POINT + 1)))  # ~60 ms, dropped again: the classes are cached
    spans = [m.span() for m in rx.finditer(every)]
    if not spans:
        return None

    def esc(cp: int) -> str:
        return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"

    return "".join(esc(a) if b - a == 1 else f"{esc(a)}-{esc(b - 1)}" for a, b in spans)


@functools.lru_cache(maxsize=512)  # validation asks once per value
def re_pattern(pattern: str) -> str | None:
    """``pattern`` with every ``\\p{..}`` / ``\\P{..}`` written as the code-point class Python's ``re``
    reads (inside a bracket class: its items; ``\\P`` as the complement's). The pattern itself when it
    has none; None when a property is unknown, empty or a range endpoint (``[\\p{L}-z]``, an error
    in ECMA-262 too) or without braces (``\\pL``)."""
    if "\\p" not in pattern and "\\P" not in pattern:
        return pattern
    out: list[str] = []
    n = len(pattern)
    i = 0
    start = -1  # inside a bracket class (Python's: not nested): where its items begin; else -1
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            if pattern[i + 1] not in "pP":
                out.append(pattern[i:i + 2])
                i += 2
                continue
            m = _PROPERTY.match(pattern, i)
            items = m and _property_class(m.group(2), m.group(1) == "P")
            if not items:
                return None
            j = m.end()
            if start < 0:
                out.append(f"[{items}]")
            elif (i - 1 > start and pattern[i - 1] == "-") or (j + 1 < n and pattern[j] == "-" and pattern[j + 1] != "]"):
                return None
            else:
                out.append(items)
            i = j
            continue
        if start < 0 and c == "[":
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            start = j
            out.append(pattern[i:j])
            i = j
            continue
        if start >= 0 and c == "]" and i > start:  # a ']' first in the class is a literal
            start = -1
        out.append(c)
        i += 1
    return "".join(out)


def re_schema(schema: Any, subschemas: Callable[[Any], Iterable[tuple[Any, dict]]]) -> Any:
    """``schema`` for ``jsonschema``'s validators, whose ``patternProperties`` (and the
    ``additionalProperties`` / ``unevaluatedProperties`` that look at it) run Python's ``re``: a copy
    with those keys through :func:`re_pattern`, or ``schema`` itself when no key needs it (``pattern``
    values are left as written: the validator's own ``pattern`` check reads them). ``subschemas``:
    :func:`~.schema_checks.iter_subschemas` (``(path, subschema)`` pairs; passed in, as schema_checks
    imports this module)."""

    def spelled(pp: Any) -> bool:
        return isinstance(pp, dict) and any(("\\p" in k or "\\P" in k) and re_pattern(k) not in (k, None) for k in pp)

    if not isinstance(schema, dict) or not any(spelled(s.get("patternProperties")) for _, s in subschemas(schema)):
        return schema
    copy = json.loads(json.dumps(schema))
    for _, s in subschemas(copy):
        if spelled(s.get("patternProperties")):
            if len(_WRITTEN) > 256:
                _WRITTEN.clear()
            _WRITTEN.update({re_pattern(k) or k: k for k in s["patternProperties"]})
            s["patternProperties"] = {re_pattern(k) or k: v for k, v in s["patternProperties"].items()}
    return copy


#: the ``patternProperties`` keys :func:`re_schema` spelled out -> as written (for :func:`as_written`)
_WRITTEN: dict[str, str] = {}


def as_written(message: str) -> str:
    """A validation message with the patterns :func:`re_schema` spelled out named as written again
    (``additionalProperties``' "does not match any of the regexes: ..." quotes them)."""
    if _WRITTEN and "\\\\" in message:
        for spelled, written in list(_WRITTEN.items()):
            message = message.replace(repr(spelled), repr(written))
    return message
