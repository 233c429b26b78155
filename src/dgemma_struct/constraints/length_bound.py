"""Cheap lower bounds on an output's length, read from the spec, so that a request no budget can
hold (``minLength: 10**9``, ``minItems: 10**6``) is refused in milliseconds instead of after a
whole generation and its repairs.

:func:`min_json_chars` reads a JSON Schema's bounds (what every valid instance must spell out, in
compact JSON); :func:`min_tokens_for` divides by the longest token of the vocabulary.

>>> min_json_chars({"type": "string", "minLength": 10})
12
>>> min_json_chars({"type": "array", "minItems": 3, "items": {"type": "string", "minLength": 2}})
16
>>> min_json_chars({"anyOf": [{"type": "string", "minLength": 10 ** 9}, {"type": "null"}]})
1
"""
from __future__ import annotations

import json
import math
import threading
from typing import Any

__all__ = ["min_json_chars", "max_token_bytes", "min_tokens_for"]

_MAX_DEPTH = 64
_cache: dict[str, int] = {}
_lock = threading.Lock()


def _num(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v <= 0:
        return 0
    return int(min(v, 10 ** 15))


def _literal(v: Any) -> int:
    try:
        return len(json.dumps(v, separators=(",", ":"), ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return 1


def min_json_chars(schema: Any, depth: int = 0) -> int:
    """A lower bound on the characters of every valid instance of ``schema`` written as compact JSON
    (never more than the truth: unknown keywords, ``$ref``, untyped bounds count as 1)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return 1
    s = schema
    if "const" in s:
        return _literal(s["const"])
    if isinstance(s.get("enum"), list) and s["enum"]:
        return min(_literal(v) for v in s["enum"])
    best = 1
    for sub in s.get("allOf") or []:
        best = max(best, min_json_chars(sub, depth + 1))
    for kw in ("anyOf", "oneOf"):
        subs = s.get(kw)
        if isinstance(subs, list) and subs:
            best = max(best, min(min_json_chars(x, depth + 1) for x in subs))
    typ = s.get("type")
    types = [typ] if isinstance(typ, str) else typ if isinstance(typ, list) and typ else None
    if not types or not all(isinstance(t, str) for t in types):
        return best
    return max(best, min(_typed(s, t, depth) for t in types))


def _typed(s: dict, t: str, depth: int) -> int:
    if t == "string":
        return 2 + _num(s.get("minLength"))
    if t == "array":
        k = _num(s.get("minItems"))
        if not k:
            return 2
        prefix = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else []
        item = s.get("items") if isinstance(s.get("items"), dict) else {}
        per = [min_json_chars(prefix[i], depth + 1) if i < len(prefix) else 0 for i in range(min(k, len(prefix)))]
        rest = k - len(per)
        return 2 + sum(per) + rest * min_json_chars(item, depth + 1) + (k - 1)
    if t == "object":
        req = [r for r in (s.get("required") or []) if isinstance(r, str)] if isinstance(s.get("required"), list) else []
        req = list(dict.fromkeys(req))
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        chars = sum(_literal(r) + 1 + min_json_chars(props.get(r), depth + 1) for r in req)
        n = max(len(req), _num(s.get("minProperties")))
        # an extra property is at least '"x":0' (the names are distinct, so most are longer)
        chars += (n - len(req)) * 5
        return 2 + chars + max(n - 1, 0)
    return 1


def max_token_bytes(info: Any) -> int:
    """The longest token of ``info``'s vocabulary, in bytes (cached per tokenizer)."""
    key = getattr(info, "key", None)
    with _lock:
        hit = _cache.get(key) if key is not None else None
    if hit is not None:
        return hit
    lltok = info.lltok
    longest = 1
    for i in range(int(lltok.vocab_size)):
        try:
            longest = max(longest, len(lltok.decode_bytes([i])))
        except Exception:  # noqa: BLE001 - an id without bytes
            continue
    if key is not None:
        with _lock:
            _cache[key] = longest
    return longest


def min_tokens_for(constraint: Any) -> int:
    """A lower bound on the tokens (EOS included) any accepted output of a JSON ``constraint`` needs;
    0 when nothing is known (other kinds)."""
    schema = getattr(constraint, "schema", None)
    if getattr(getattr(constraint, "kind", None), "value", None) != "json" or not isinstance(schema, dict):
        return 0
    chars = min_json_chars(schema)
    if chars <= 64:  # no budget question worth a vocabulary scan
        return 0
    return math.ceil(chars / max_token_bytes(constraint.tokenizer_info)) + 1
