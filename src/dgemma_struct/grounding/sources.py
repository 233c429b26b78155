"""The source documents: chunks (what a span is made of), edges a free span may have, the number
literals written in a text, where a found value occurs (:class:`GroundedSpan`), and the prompt's
document part (the text after its instruction line) as the default source."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Sequence

from dgemma_struct.constraints.json_locate import pointer as json_pointer
from dgemma_struct.errors import GroundingError, InvalidRequestError


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


#: what joins two word runs into one chunk in ``"tokens"`` mode: a date's or a code's hyphen, a
#: decimal or domain dot, an email's @, an apostrophe (between any word characters); a time's colon,
#: a date's slash (between digits)
_JOIN_WORDS, _JOIN_DIGITS = "-.@'\u2019", ":/"


def chunk_offsets(text: str, granularity: str = "words") -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of the chunks a span is made of: code points
    (``"chars"``); runs of letters/digits/underscore, runs of whitespace and single other
    characters (``"words"``); or as ``"words"`` with word runs joined across a connector between
    them (``"tokens"``: ``2000-08-19``, ``8.19.18``, ``a@b.io``, ``10:30`` are one chunk each, so a
    span never starts or ends inside one).

        >>> t = "on 2000-08-19, at 10:30"
        >>> [t[s:e] for s, e in chunk_offsets(t, "tokens")]
        ['on', ' ', '2000-08-19', ',', ' ', 'at', ' ', '10:30']
    """
    if granularity == "chars":
        return [(i, i + 1) for i in range(len(text))]
    out: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        j = i + 1
        if _is_word(ch):
            while True:
                while j < n and _is_word(text[j]):
                    j += 1
                if not (granularity == "tokens" and j + 1 < n and _is_word(text[j + 1]) and (
                        text[j] in _JOIN_WORDS or text[j] in _JOIN_DIGITS and text[j - 1].isdigit()
                        and text[j + 1].isdigit())):
                    break
                j += 1
        elif ch.isspace():
            while j < n and text[j].isspace():
                j += 1
        out.append((i, j))
        i = j
    return out


def bad_edge(ch: str) -> bool:
    return ch.isspace() or ord(ch) < 0x20 or ch in "\u2028\u2029"


_LEFT_PUNCT, _RIGHT_PUNCT = ",;:.!?)]}", ",;:([{"


def edge_ok(span: str) -> bool:
    """May a free grounded string be ``span``? Non-empty, no whitespace or control character at
    either end, not starting with closing punctuation or ending with a separator (``"Klein,"``),
    at least one letter or digit (not a bare ``-``)."""
    return bool(span) and not bad_edge(span[0]) and not bad_edge(span[-1]) and \
        span[0] not in _LEFT_PUNCT and span[-1] not in _RIGHT_PUNCT and any(c.isalnum() for c in span)


# a number is not part of a word, a decimal, or a hyphenated code (ORD-12345, 555-867-5309, 2024-05-01)
_NUM = re.compile(r"(?<![\w.])(?<!\w-)-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w])(?!-\w)")
_JSON_NUM = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")


_WORD_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


@functools.lru_cache(maxsize=64)  # one schema's names serve its labels and its value pieces
def _label_pattern(names: tuple[str, ...]) -> re.Pattern | None:
    """Any of ``names`` as a source may write it: the name, or its words in any case joined by spaces,
    ``_`` or ``-``; word-aligned."""
    alts = []
    for name in dict.fromkeys(names):
        parts = _WORD_PART.findall(name)
        if parts:
            alts.append(r"[ \t_-]*".join(map(re.escape, parts)))
    if not alts:
        return None
    alts.sort(key=len, reverse=True)  # the longest name first: "driver opts" before "driver"
    return re.compile(r"(?<![^\W_])(?:" + "|".join(alts) + r")(?![^\W_])", re.I)


def field_labels(docs: Sequence[str], names: Sequence[str]) -> list[str]:
    """The texts in ``docs`` that name one of the fields ``names`` (the name, or its words in any case
    joined by spaces, ``_`` or ``-``: ``initiatorName`` -> ``Initiator Name``), word-aligned.

    >>> field_labels(["| initiator name | taxons |", "se_value: 3"], ["initiatorName", "taxons", "se_value"])
    ['initiator name', 'taxons', 'se_value']
    """
    pat = _label_pattern(tuple(names))
    return list(dict.fromkeys(m.group(0) for doc in docs for m in pat.finditer(doc))) if pat else []


_CELL_BORDER = re.compile(r"(?<=\s)\||\|(?=\s)")
_BULLET = re.compile(r"(?m)^[ \t]*[-*\u2022](?=[ \t])")
_NAME_SEP = re.compile(r"[ \t]*[:=]|[ \t]+-(?=[ \t])")  # between a field's name and its value


def value_pieces(doc: str, names: Sequence[str]) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of the parts of ``doc`` a value may span: ``doc`` cut at what never belongs
    to a value -- a table's cell borders (a ``|`` beside whitespace), a list item's bullet, and a field
    name of ``names`` with the separator after it (``burst:``, ``size =``, ``tr_shipping_base -``).

    >>> d = "* burst: isolation\\n| a|b | x |"
    >>> [d[s:e] for s, e in value_pieces(d, ["burst"])]
    [' ', ' isolation\\n', ' a|b ', ' x ']
    """
    cuts = [m.span() for m in _CELL_BORDER.finditer(doc)] + [m.span() for m in _BULLET.finditer(doc)]
    pat = _label_pattern(tuple(names))
    if pat is not None:
        for m in pat.finditer(doc):
            after = _NAME_SEP.match(doc, m.end())
            if after:
                cuts.append((m.start(), after.end()))
    out, at = [], 0
    for s, e in sorted(cuts):
        if s > at:
            out.append((at, s))
        at = max(at, e)
    if at < len(doc):
        out.append((at, len(doc)))
    return out


@dataclass(frozen=True)
class _NumberLit:
    literal: str      # as a JSON number
    value: Any        # int or float
    is_int: bool


def source_numbers(text: str) -> list[tuple[_NumberLit, int, int]]:
    """Number literals written in ``text`` with their character offsets (``1,250`` is 1250; the
    digits of hyphenated codes, phone numbers and ISO dates are not numbers)."""
    out = []
    for m in _NUM.finditer(text):
        raw = m.group(0).replace(",", "")
        is_int = re.fullmatch(r"-?\d+", raw) is not None
        if is_int:
            value: Any = int(raw)
            lit = str(value)
        else:
            value = float(raw)
            if value != value or value in (float("inf"), float("-inf")):
                continue
            lit = raw if _JSON_NUM.fullmatch(raw) else repr(value)
        out.append((_NumberLit(lit, value, is_int), m.start(), m.end()))
    return out


def _user_texts(prompt: Any) -> list[str]:
    """The prompt's text: itself, or the text of a chat prompt's user messages."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, (list, tuple)):
        docs = []
        for msg in prompt:
            if isinstance(msg, dict) and msg.get("role", "user") == "user":
                c = msg.get("content")
                if isinstance(c, str):
                    docs.append(c)
                elif isinstance(c, list):  # OpenAI content parts
                    docs.extend(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
        return docs
    raise InvalidRequestError(f"a prompt must be text or a list of chat messages, not {type(prompt).__name__}")


#: how an instruction opens (an imperative or a question word, after an optional lead-in: "please",
#: "can you", "from the text,", ...), besides naming JSON anywhere
_INSTRUCTION = re.compile(
    r"\s*(?:please\s+|(?:can|could|would|will)\s+you\s+(?:please\s+)?|i\s+(?:need|want)\s+you\s+to\s+|"
    r"(?:from|using|with|based\s+on)\s+(?:only\s+)?the\s+\w+,\s*)?"
    r"(?:extract|return|convert|give|classify|list|fill|parse|output|produce|answer|write|find|identify|"
    r"summari[sz]e|tell|provide|get|pull|read|turn|format|create|generate|make|put|build|respond|reply|capture|"
    r"record\s+th(?:is|ese|e)|look\s+at|label\s+th(?:is|e)|structured\s+(?:output|data)|"
    r"what|which|who|when|where|how)\b", re.I)


def is_instruction(line: str) -> bool:
    """Whether a line reads as the instruction of a prompt rather than its document.

    >>> is_instruction("Return a JSON object with name and city."), is_instruction("Ada lives in Oslo.")
    (True, False)
    >>> is_instruction("From the text, pull out name and age."), is_instruction("Can you extract the order?")
    (True, True)
    """
    return bool(_INSTRUCTION.match(line)) or "json" in line.lower()


_LABELS = r"(?:source|text|input|document|message|context|data|note|given)"
_DOC_LABEL = re.compile(rf"\b{_LABELS}\s*:\s*(?=\S)", re.I)
_LEADING_LABEL = re.compile(rf"\s*{_LABELS}\s*:[ \t]*", re.I)
# the head of "<instruction>: <tail>" that announces a list of keys, not the document
_KEYS_HEAD = re.compile(r"(?:fields?|keys?|properties|attributes|columns|values|following|please)\W*$", re.I)


def _labelled_tail(line: str) -> str:
    """What follows the first document label (``Source:``, ``Text:``, ``Input:`` ...) of an instruction
    line, or "" (``"Return JSON. Fields: a. Source: note: 7"`` holds the document's first line, ``note: 7``)."""
    found = _DOC_LABEL.search(line)
    return line[found.end():] if found else ""


def _colon_tail(line: str) -> str:
    """What follows the first ``": "`` of an instruction line (``"Convert to JSON with fields a, b: <document>"``),
    or "" when there is none or its head announces keys (``"... Fields: a, b."``)."""
    head, sep, tail = line.partition(": ")
    return tail if sep and tail.strip() and not _KEYS_HEAD.search(head) else ""


def _lead_in_removed(lines: list[str]) -> list[str]:
    """``lines`` of a document without what introduces it: a short first line ending in a colon (``Here
    is a person record:``, ``Input:``) and a document label opening the first line (``Text: ...``)."""
    lines = list(lines)
    while lines and not lines[0].strip():
        lines.pop(0)
    if len(lines) > 1 and lines[0].rstrip().endswith(":") and len(lines[0].split()) <= 8:
        lines.pop(0)
    if lines:
        m = _LEADING_LABEL.match(lines[0])
        if m and lines[0][m.end():].strip():
            lines[0] = lines[0][m.end():]
    return lines


def document_part(text: str) -> str:
    """The document of an instruction-and-document text: after an instruction line that opens the text,
    the text that follows a document label on it (``Source:``, ``Text:``, ``Input:``, ``Document:``,
    ``Message:``, ``Context:``, ``Data:``, ``Note:``, ``Given:``), else what follows its first ``": "`` (unless
    that announces keys: ``"Fields: a, b."``), and the lines after it; else the lines before the instruction
    lines that close the text. A document loses what introduces it (a short first line ending in a colon, a
    label opening its first line). Otherwise the whole text is its own document.

    >>> document_part("Extract the name as JSON.\\nAlice Gomez is 51.")
    'Alice Gomez is 51.'
    >>> document_part("Alice Gomez is 51.\\nReturn a JSON object with name and age.")
    'Alice Gomez is 51.'
    >>> document_part("Convert to JSON with fields name and age: Alice Gomez is 51.")
    'Alice Gomez is 51.'
    >>> document_part("Alice Gomez is 51.")
    'Alice Gomez is 51.'
    >>> document_part("Return JSON. Fields: name, age. Source: Name: Alice Gomez\\nAge: 51")
    'Name: Alice Gomez\\nAge: 51'
    >>> document_part("Convert to JSON with fields name and age: name: Alice Gomez\\nage: 51")
    'name: Alice Gomez\\nage: 51'
    >>> document_part("Text: Alice Gomez is 51.\\nExtract: name and age\\nFormat: JSON")
    'Alice Gomez is 51.'
    """
    lines = text.split("\n")
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if not filled:
        return text
    first, last = filled[0], filled[-1]
    if is_instruction(lines[first]):
        tail = _labelled_tail(lines[first])
        if tail:  # the label starts the document: a label word of its own first line stays
            doc = [tail] + lines[first + 1:]
        else:
            tail = _colon_tail(lines[first])
            doc = _lead_in_removed(([tail] if tail else []) + lines[first + 1:])
    elif len(filled) >= 2 and is_instruction(lines[last]):
        k = last
        while k > first and (not lines[k].strip() or is_instruction(lines[k])):
            k -= 1
        doc = _lead_in_removed(lines[:k + 1])
    else:
        return text
    out = "\n".join(doc)
    return out if out.strip() else text


def default_sources(prompt: Any) -> list[str]:
    """The documents a prompt grounds in when no ``source`` is given: a text prompt's document part
    (:func:`document_part`: the instruction line is not a source); for a chat prompt,
    the user messages, each cut the same way unless a system or developer message carries the
    instruction (then each user message is a document whole)."""
    texts = _user_texts(prompt)
    instructed = isinstance(prompt, (list, tuple)) and any(
        isinstance(m, dict) and m.get("role") in ("system", "developer") for m in prompt)
    return texts if instructed else [document_part(t) for t in texts]


def grounded_sources(prompt: Any = None, source: str | Sequence[str] | None = None) -> tuple[str, ...]:
    """The documents grounded values come from: ``source`` (one text or a list of texts), else the
    prompt's document part (:func:`default_sources`: the text after an instruction line). Raises
    :class:`GroundingError` when there is no non-blank text to ground on.

    >>> grounded_sources("Extract the customer as JSON.\\nOrder 7 for Ada Byron.")
    ('Order 7 for Ada Byron.',)
    """
    if source is None:
        docs = default_sources(prompt) if prompt is not None else []
    elif isinstance(source, str):
        docs = [source]
    elif isinstance(source, (list, tuple)):
        docs = list(source)
        for d in docs:
            if not isinstance(d, str):
                raise GroundingError(f"source documents must be strings, not {type(d).__name__}")
    else:
        raise GroundingError(f"source must be a string or a list of strings, not {type(source).__name__}")
    if not docs or not any(d.strip() for d in docs):
        raise GroundingError("the grounding source is empty: nothing to extract values from")
    return tuple(docs)


class Doc:
    """One source document with its chunk boundaries (for aligning found values)."""

    def __init__(self, text: str):
        self.text = text
        self._bounds: dict[str, tuple[set, set]] = {}
        self.numbers = source_numbers(text)

    def bounds(self, granularity: str) -> tuple[set, set]:
        b = self._bounds.get(granularity)
        if b is None:
            ch = chunk_offsets(self.text, granularity)
            b = self._bounds[granularity] = ({s for s, _ in ch}, {e for _, e in ch})
        return b

    def find_string(self, value: str, granularity: str) -> list[tuple[int, int]]:
        if not value:
            return []
        starts, ends = self.bounds(granularity)
        out, i = [], self.text.find(value)
        while i >= 0:
            if i in starts and i + len(value) in ends:
                out.append((i, i + len(value)))
            i = self.text.find(value, i + 1)
        return out

    def find_number(self, value: Any) -> list[tuple[int, int]]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return []
        return [(s, e) for lit, s, e in self.numbers if lit.value == value]


def prompt_with_sources(prompt: Any, docs: Sequence[str]) -> Any:
    """The prompt, with every source document it does not already contain appended (the model
    must see what it copies from)."""
    present = "\n".join(_user_texts(prompt))
    extra = [d for d in docs if d not in present]
    if not extra:
        return prompt
    add = "\n\n".join(extra)
    if isinstance(prompt, str):
        return prompt + "\n" + add
    msgs = [dict(m) for m in prompt]
    for m in reversed(msgs):
        if m.get("role", "user") == "user" and isinstance(m.get("content"), str):
            m["content"] = m["content"] + "\n" + add
            return msgs
    return msgs + [{"role": "user", "content": add}]


@dataclass(frozen=True)
class GroundedSpan:
    """Where one grounded value came from. ``path``: its JSON path (keys and indices);
    ``doc``/``start``/``end``: the first occurrence (character offsets, end exclusive) in
    ``sources[doc]`` -- for the n-th item of an array holding the same string, the n-th occurrence;
    ``occurrences``: every ``(doc, start, end)`` it matches."""

    path: tuple
    value: Any
    doc: int
    start: int
    end: int
    text: str
    occurrences: tuple = ()

    @property
    def pointer(self) -> str:
        """The JSON Pointer (RFC 6901) of the value."""
        return json_pointer(self.path)

    @property
    def label(self) -> str:
        return ".".join(str(p) for p in self.path) or "value"

    def to_dict(self) -> dict:
        return {"path": list(self.path), "pointer": self.pointer, "value": self.value, "doc": self.doc,
                "start": self.start, "end": self.end, "text": self.text,
                "occurrences": [list(o) for o in self.occurrences]}
