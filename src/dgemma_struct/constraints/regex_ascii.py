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
"""
from __future__ import annotations

import re

__all__ = ["ascii_classes", "ASCII_CLASSES"]

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
