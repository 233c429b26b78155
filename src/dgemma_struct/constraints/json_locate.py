"""Where an output goes wrong: the character offset of the value at a JSON path, the token that
holds a character, the strings that hold structural junk, and the repair plan of a rejected output
(:func:`repair_plan`: where renoising restarts, which values are banned). The repair policy
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
from dataclasses import dataclass, field
from typing import Any, Sequence

_WS = " \t\n\r"
_NUM = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")


def pointer(path: Sequence[Any]) -> str:
    """The JSON Pointer (RFC 6901) of a path of keys and indices.

    >>> pointer(("lines", 0, "a/b~c")), pointer(())
    ('/lines/0/a~1b~0c', '')
    """
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def value_offsets(text: str) -> dict[tuple, int]:
    """Character offset where the value at each JSON path starts (the root is ``()``).
    Scans as far as the text is well-formed; a truncated text yields the paths seen so far."""
    return {p: s for p, (s, _) in value_spans(text)[0].items()}


def value_spans(text: str) -> tuple[dict[tuple, tuple[int, int]], dict[tuple, int]]:
    """``(spans, members)``: the character span ``[start, end)`` of the value at each JSON path
    (a value still open at the end of a truncated text has ``end == -1``), and for each property
    where its member starts (the ``,`` before its key, or the key of a first member).

    >>> value_spans('{"a":1,"b":"x"}')
    ({(): (0, 15), ('a',): (5, 6), ('b',): (11, 14)}, {('a',): 1, ('b',): 6})
    """
    out: dict[tuple, tuple[int, int]] = {}
    members: dict[tuple, int] = {}

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
        out[path] = (i, -1)
        end = body(i, path)
        out[path] = (i, end)
        return end

    def body(i: int, path: tuple) -> int:
        if i >= len(text):
            raise ValueError("truncated")
        c = text[i]
        if c == "{":
            i = skip(i + 1)
            if i < len(text) and text[i] == "}":
                return i + 1
            member = i
            while True:
                i = skip(i)
                end = string_end(i)
                key = json.loads(text[i:end])
                members[path + (key,)] = member
                i = skip(end)
                if text[i] != ":":
                    raise ValueError("expected ':'")
                i = value(i + 1, path + (key,))
                i = skip(i)
                if text[i] == ",":
                    member = i
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
    return out, members


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


@dataclass(frozen=True)
class Ban:
    """A value a repair must not write again: the value at ``path`` must not be ``text`` (UTF-8,
    as written), or with ``prefix`` must not *start* with ``text``.

    ``delimited``: ``text`` ends in a number or a literal, so it only counts once the next byte
    cannot continue it (``12`` is not ``123``); a string, object or array ends at its own closing
    byte. By default it is read off ``text``; a prefix cut inside a value says ``False``.

    >>> Ban(("n",), b"12").delimited, Ban(("s",), b'"12"').delimited, Ban(("e",), b'"si', True, False).delimited
    (True, False, False)
    """

    path: tuple
    text: bytes
    prefix: bool = False
    delimited: bool = None  # type: ignore[assignment]  # None: read off ``text``

    def __post_init__(self) -> None:
        if self.delimited is None:
            object.__setattr__(self, "delimited", not self.text.endswith((b'"', b"}", b"]")))


@dataclass(frozen=True)
class Rejection:
    """A value validation rejected: its path, its text as written and why."""

    path: tuple
    text: str
    message: str


@dataclass
class RepairPlan:
    """What one rejected output tells the repair: where renoising restarts (``offset``, a character
    of the answer), the values that must not come back (``bans``; ``spans[i]``: where ban ``i``'s
    text is in the answer, or None) and the ``rejected`` values. ``closing``: for each superfluous
    item or first duplicate, the ban (with its span) that ends its array before it -- its items up to
    there and a comma, as a prefix -- for a repair to add when the same array had one before."""

    offset: int
    bans: list[Ban] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    spans: list[tuple[int, int] | None] = field(default_factory=list)
    closing: list[tuple[Ban, tuple[int, int]]] = field(default_factory=list)


_NAMED = re.compile(r"'([^'\\]*)'|\"([^\"\\]*)\"")


def repair_plan(text: str, issues: Sequence[Any]) -> RepairPlan:
    """The :class:`RepairPlan` of a JSON ``text`` whose ``issues`` (``.path``, ``.message``) validation
    reported. Each issue's path (or its deepest ancestor in the text) names the rejected value:

    * an array with duplicates (``uniqueItems``): its first duplicate is rejected; renoising starts
      right after the item before it (so the array may close there) and none of the items before it
      may be written at that position;
    * a ``superfluous`` item (an issue saying the item should not be there at all): the same, with
      that item's text banned at its position and at every later one up to one past the array's
      written length (else the repair moves the same item one place on, once per attempt); for
      both, the ban that closes the array before the item is in ``closing``;
    * an object (``required``, ``dependentRequired``, ``if``/``then``, a model validator): renoising
      starts at the earliest member the message names ('quoted', or else as a word: a model validator's
      "check_out must be after check_in" restarts at ``check_in``) that is present, else at the last
      member's value; the whole object is banned, and when the message names no property at all (a
      model validator) its text up to the end of that last value is banned as a prefix too (else the
      model writes the same last value, the grammar forces ``}`` and the ban leaves no token);
    * an array otherwise (``contains``, ``minContains``): renoising starts at its last item, the array banned;
    * any other value: renoising starts at it, and it is banned.

    >>> plan = repair_plan('{"d":"0020-01-01","n":3}', [type("I", (), {"path": ("d",), "message": "past"})()])
    >>> plan.offset, plan.bans, plan.spans
    (5, [Ban(path=('d',), text=b'"0020-01-01"', prefix=False, delimited=False)], [(5, 17)])
    """
    spans, members = value_spans(text)
    plan = RepairPlan(len(text))
    for issue in issues:
        p = tuple(issue.path)
        while p and p not in spans:
            p = p[:-1]
        start, end = spans.get(p, (0, -1))
        if end < 0:   # nothing of it was written whole: renoise from its start, nothing to ban
            plan.offset = min(plan.offset, start)
            continue
        vt = text[start:end]
        try:
            v = json.loads(vt)
        except ValueError:
            v = None
        superfluous = getattr(issue, "superfluous", False) and p == tuple(issue.path)
        at, bans, rejected = _value_plan(text, spans, members, p, v, str(issue.message), superfluous)
        plan.offset = min(plan.offset, at)
        for ban, span in bans:
            if ban not in plan.bans:
                plan.bans.append(ban)
                plan.spans.append(span)
        plan.rejected.append(rejected)
        item = rejected.path   # a superfluous item or an array's first duplicate: the array may end before it
        if (superfluous or item != p) and item and isinstance(item[-1], int) and item[-1] > 0 and item[:-1] in spans:
            arr, gap = spans[item[:-1]][0], _item_gap(spans, item)
            if text[gap:gap + 1] == ",":
                plan.closing.append((Ban(item[:-1], text[arr:gap + 1].encode(), prefix=True, delimited=False),
                                     (arr, gap + 1)))
    return plan


def _children(spans: dict, path: tuple) -> list[tuple]:
    return sorted((q for q in spans if len(q) == len(path) + 1 and q[:-1] == path and spans[q][1] >= 0),
                  key=lambda q: spans[q][0])


def _value_plan(text: str, spans: dict, members: dict, p: tuple, v: Any, message: str,
                superfluous: bool = False) -> tuple[int, list[tuple[Ban, tuple[int, int] | None]], Rejection]:
    """``(renoise offset, [(ban, its span)], rejection)`` of the value ``v`` at ``p`` (see :func:`repair_plan`)."""
    start, end = spans[p]
    whole = (Ban(p, text[start:end].encode()), (start, end))
    if superfluous and p and isinstance(p[-1], int):
        later = range(p[-1] + 1, len(_children(spans, p[:-1])) + 1)
        return _item_gap(spans, p), [whole] + [(Ban(p[:-1] + (j,), whole[0].text), None) for j in later], \
            Rejection(p, text[start:end], message)
    kids = _children(spans, p)
    if isinstance(v, list) and "unique" in message.lower():
        k = next((k for k in range(1, len(v)) if any(json_equal(v[k], v[i]) for i in range(k))), None)
        if k is not None and p + (k,) in spans:
            ks, ke = spans[p + (k,)]
            before = {text[slice(*spans[p + (i,)])] for i in range(k) if p + (i,) in spans}
            return _item_gap(spans, p + (k,)), [(Ban(p + (k,), t.encode()), None) for t in sorted(before)], \
                Rejection(p + (k,), text[ks:ke], message)
    rejected = Rejection(p, text[start:end], message)
    if isinstance(v, dict):
        names = {a or b for a, b in _NAMED.findall(message)}
        if not names:  # a model validator's own words: the members it names as words ("check_out must be after check_in")
            names = {k for k in v if isinstance(k, str) and len(k) > 2  # not "a" the article
                     and re.search(rf"(?<!\w){re.escape(k)}(?!\w)", message)}
        present = [members[p + (n,)] for n in names if p + (n,) in members]
        if present:
            return min(present), [whole], rejected
        if not kids:
            return start, [whole], rejected
        last = spans[kids[-1]]
        bans = [whole] if names else [whole, (Ban(p, text[start:last[1]].encode(), prefix=True), (start, last[1]))]
        return last[0], bans, rejected
    if isinstance(v, list) and kids:
        return spans[kids[-1]][0], [whole], rejected
    return start, [whole], rejected


def _item_gap(spans: dict, item: tuple) -> int:
    """Where renoising starts to take array item ``item`` back: right after the item before it (or
    the array's ``[``), so that the model may close the array there instead of writing another item."""
    k = item[-1]
    before = spans.get(item[:-1] + (k - 1,)) if k > 0 else None
    if before is not None and before[1] >= 0:
        return before[1]
    return spans[item[:-1]][0] + 1 if item[:-1] in spans else spans[item][0]


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality (``1 == 1.0`` but ``1 != true``), as ``uniqueItems`` compares."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


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


def schema_property_names(schema: Any) -> set[str]:
    """Names under ``properties`` anywhere in a JSON Schema (not the schema's own keywords).

    >>> sorted(schema_property_names({"properties": {"a": {"properties": {"b": {}}}}, "$defs": {"C": {"properties": {"c": {}}}}}))
    ['a', 'b', 'c']
    """
    out: set[str] = set()
    if isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            out |= {k for k in props if isinstance(k, str)}
        for v in schema.values():
            out |= schema_property_names(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= schema_property_names(v)
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
        names = _value_keys(value) | schema_property_names(schema)
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
