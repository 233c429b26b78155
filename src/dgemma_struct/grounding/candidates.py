"""The finite candidate lists of grounded fields with further constraints: the source's spans that
pass a string field's own sub-schema (pattern, format, enum, const, lengths), and the number
literals that pass a number field's."""
from __future__ import annotations

import json
import re
from typing import Sequence

from dgemma_struct.constraints.json_schema import make_validator
from dgemma_struct.grounding.sources import bad_edge, Doc, chunk_offsets, edge_ok, source_numbers
from dgemma_struct.grounding.spec import schema_types

# A grounded field with extra constraints gets the explicit list of the source's spans that pass them,
# up to this many distinct candidates (beyond it: the substring lexeme, and validation + repair).
MAX_CANDIDATES = 4000
MAX_SPAN_CHUNKS = 64          # longest candidate span, in chunks (words mode) or characters (chars mode)
MAX_CANDIDATE_CHECKS = 200_000

STRING_KWS = ("pattern", "format", "enum", "const", "minLength", "maxLength")
# Spans offered for a field with a ``format`` must also match these shapes (a prefilter, stricter than
# the format checks make_validator asserts, the JSON surface's): a narrower grammar is still sound, and
# it keeps "write to tzhang@post.io." from yielding the span "to tzhang@post.io.".
_FORMAT_SHAPES = {
    "email": re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    "idn-email": re.compile(r"[^\s@]+@[^\s@]+\.[^\s@.]{2,}"),
    "hostname": re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?"),
    "ipv4": re.compile(r"\d{1,3}(?:\.\d{1,3}){3}"),
    "date": re.compile(r"\d{4}-\d{2}-\d{2}"),
    "uri": re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]*[^\s.,;:!?)]"),
    "uuid": re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
}


def string_candidates(docs: Sequence[str], check: dict, granularity: str) -> list[str] | None:
    """Distinct spans of the source that pass the field's sub-schema; None when there are too
    many to list (the lexeme is used then)."""
    validator = make_validator(check)
    max_len = check.get("maxLength")
    for kw in ("enum", "const"):
        if kw in check:  # a closed set: test its members instead of every span
            vals = check["enum"] if kw == "enum" else [check["const"]]
            out = []
            for v in vals:
                if isinstance(v, str) and v and not bad_edge(v[0]) and not bad_edge(v[-1]) and \
                        any(Doc(d).find_string(v, granularity) for d in docs) and validator.is_valid(v):
                    out.append(v)
            return list(dict.fromkeys(out))
    shape = _FORMAT_SHAPES.get(check.get("format")) if isinstance(check.get("format"), str) else None
    pre = None  # a cheap Python-regex prefilter; the validator still decides
    if isinstance(check.get("pattern"), str):
        try:
            pre = re.compile(check["pattern"])
        except re.error:
            pre = None
    seen: dict[str, None] = {}
    checks = 0
    for doc in docs:
        ch = chunk_offsets(doc, granularity)
        starts = [k for k, (s, e) in enumerate(ch) if edge_ok(doc[s] + ".")]
        good_set = {k for k, (s, e) in enumerate(ch) if edge_ok("a" + doc[e - 1])}
        for i in starts:
            s = ch[i][0]
            for j in range(i, min(len(ch), i + MAX_SPAN_CHUNKS)):
                e = ch[j][1]
                if max_len is not None and e - s > max_len:
                    break
                if j not in good_set:
                    continue
                cand = doc[s:e]
                if cand in seen:
                    continue
                checks += 1
                if checks > MAX_CANDIDATE_CHECKS:
                    return None
                if shape is not None and not shape.fullmatch(cand):
                    continue
                if pre is not None and not pre.search(cand):
                    continue
                if validator.is_valid(cand):
                    seen[cand] = None
                    if len(seen) > MAX_CANDIDATES:
                        return None
    return list(seen)


def number_candidates(docs: Sequence[str], check: dict) -> list[str]:
    """Distinct number literals of the source (as JSON) that pass the field's sub-schema."""
    validator = make_validator(check)
    integer = "integer" in schema_types(check) and "number" not in schema_types(check)
    out: dict[str, None] = {}
    for doc in docs:
        for lit, _, _ in source_numbers(doc):
            if integer and not lit.is_int:
                continue
            if validator.is_valid(lit.value):
                out[lit.literal] = None
    return list(out)


def constraint_summary(node: dict) -> str:
    keys = {k: node[k] for k in ("type", "pattern", "format", "enum", "const", "minLength", "maxLength",
                                 "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
            if k in node}
    s = json.dumps(keys, ensure_ascii=False)
    return s if len(s) < 160 else s[:157] + "..."
