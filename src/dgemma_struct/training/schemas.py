"""Random record schemas for the generalisation corpus, and the stable hash rule of its held-out splits.

A *family* is a record type (``flight``, ``invoice``, …) with a fixed pool of field names drawn
from :data:`~dgemma_struct.training.field_names.NAMES` (JSONSchemaBench's property names). Each
example draws 2-6 of its fields; a field's JSON type and its values follow its name (``*_count``
is an integer, ``price`` a number, ``is_*`` a boolean, ``status`` an enum, a plural an array,
``address`` a nested object, …) and about one field in five is optional.

Held out, by :func:`bucket` (SHA-1 of the name, so the rule never moves when lists grow):

* families whose bucket is 0 (about 1 in 8), which draw at least half of their fields from the
  **held-out field names** (bucket 0 of the names, never used by a training family);
* phrasing templates (see :mod:`dgemma_struct.training.render`) whose bucket is 0.

    >>> import random
    >>> schema, value = draw_record(random.Random(0), "flight")
    >>> sorted(schema) == ["additionalProperties", "properties", "required", "type"]
    True
    >>> held_out_family("flight") == (bucket("family", "flight") == 0)
    True
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dgemma_struct.training import words
from dgemma_struct.training.field_names import NAMES

PARTS = 8
FAMILIES = (
    "flight book patient vacancy product review meeting pet invoice car hotel restaurant recipe movie song album "
    "course student employee customer supplier shipment parcel order payment subscription ticket event concert "
    "match team player game device sensor server deployment repository issue commit release package library "
    "article podcast episode newsletter campaign survey question answer appointment prescription vaccine "
    "property apartment lease tenant vehicle bike trip route station train bus airport booking reservation "
    "account transaction loan budget expense grant project task milestone sprint bug incident alert job "
    "candidate interview contract company branch warehouse store coupon discount auction bid photo video "
    "camera plant garden animal farm harvest donation volunteer member club league tournament exhibition "
    "museum artwork painting author publisher conference speaker workshop lesson exam grade school hospital "
    "doctor clinic insurance claim policy tax invoice_line quote estimate lab sample experiment dataset model "
    "metric dashboard report backup cluster node container volume domain certificate user group role permission"
).split()


def bucket(kind: str, name: str, parts: int = PARTS) -> int:
    """A stable bucket in ``range(parts)`` for ``name`` (SHA-1 of ``kind:name``)."""
    return int(hashlib.sha1(f"{kind}:{name}".encode()).hexdigest(), 16) % parts


def held_out_family(family: str) -> bool:
    return bucket("family", family) == 0


def held_out_name(name: str) -> bool:
    return bucket("field", name) == 0


def split_words(name: str) -> list[str]:
    """``"deletionTimestamp"`` -> ``["deletion", "timestamp"]``; ``"user_id"`` -> ``["user", "id"]``."""
    return [w.lower() for w in re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").split()]


BOOL_WORDS = {"is", "has", "can", "should", "allow", "allowed", "enable", "enabled", "disabled", "active", "required",
              "visible", "public", "private", "deprecated", "verified", "paid", "available", "approved", "locked",
              "hidden", "readonly", "optional", "default", "valid", "archived", "completed", "done", "internal"}
INT_WORDS = {"count", "number", "num", "age", "size", "width", "height", "length", "port", "year", "quantity", "qty",
             "total", "index", "limit", "max", "min", "depth", "rank", "priority", "pages", "duration", "timeout",
             "retries", "capacity", "seats", "floor", "days", "hours", "minutes", "seconds", "replicas", "level",
             "revision", "step", "offset", "position", "weight_kg", "rooms", "guests"}
NUM_WORDS = {"price", "amount", "cost", "rate", "ratio", "score", "weight", "lat", "latitude", "lon", "lng",
             "longitude", "temperature", "percent", "percentage", "balance", "salary", "fee", "tax", "discount",
             "volume", "speed", "distance", "radius", "rating", "value", "factor", "threshold", "budget"}
ENUM_WORDS = {"status", "type", "kind", "mode", "category", "state", "role", "gender", "format", "method", "color",
              "colour", "unit", "currency", "language", "visibility", "severity", "stage", "tier", "plan", "policy",
              "strategy", "protocol", "priority_level", "channel", "platform", "region"}
NEST_NAMES = ("address", "owner", "location", "author", "details", "contact", "metadata", "origin", "settings")
ENUM_OPTIONS = {"status": ["active", "inactive", "pending", "shipped", "open", "closed", "archived", "draft"],
                "currency": ["USD", "EUR", "GBP", "JPY", "CHF"], "language": ["en", "fr", "de", "es", "ja", "pt"],
                "color": ["red", "blue", "green", "black", "white", "orange"], "unit": ["kg", "cm", "ms", "km", "px"],
                "severity": ["low", "medium", "high", "critical"], "method": ["GET", "POST", "PUT", "DELETE"]}


@lru_cache(maxsize=1)
def _vocab() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(training field names, held-out field names, plain words for string values)."""
    train = tuple(n for n in NAMES if not held_out_name(n))
    held = tuple(n for n in NAMES if held_out_name(n))
    ws = sorted({w for n in NAMES for w in split_words(n) if w.isalpha() and 3 <= len(w) <= 12})
    return train, held, tuple(ws)


def family_fields(family: str) -> tuple[str, ...]:
    """The family's fixed pool of 10 field names (deterministic in ``family``)."""
    train, held, _ = _vocab()
    r = random.Random(int(hashlib.sha1(f"fields:{family}".encode()).hexdigest(), 16))
    if held_out_family(family):
        return tuple(r.sample(held, 6) + r.sample(train, 4))
    return tuple(r.sample(train, 10))


@dataclass(frozen=True)
class Field:
    name: str
    kind: str   # boolean integer number enum array object string
    sub: str    # value maker for strings / array items: person city email url date phone code version word


def _string_kind(ws: list[str]) -> str:
    s = set(ws)
    for sub, keys in (("email", {"email", "mail"}), ("url", {"url", "uri", "link", "href", "homepage", "website",
                      "endpoint"}), ("date", {"date", "time", "timestamp", "created", "updated", "at", "birthday",
                      "deadline", "expires", "modified", "since"}), ("phone", {"phone", "mobile", "tel", "fax"}),
                      ("person", {"name", "author", "owner", "user", "contact", "customer", "manager", "assignee",
                                  "reviewer", "creator", "maintainer"}),
                      ("city", {"city", "location", "country", "origin", "destination", "place", "town", "venue"}),
                      ("code", {"id", "uid", "key", "code", "ref", "sku", "token", "hash", "serial", "number"}),
                      ("version", {"version"})):
        if s & keys:
            return sub
    return "word"


def field_of(name: str) -> Field:
    """The JSON kind and value maker that ``name`` suggests."""
    ws = split_words(name)
    last = ws[-1] if ws else name
    if ws and (ws[0] in BOOL_WORDS or last in {"enabled", "disabled", "active", "visible", "required"}):
        return Field(name, "boolean", "")
    if name in NEST_NAMES:
        return Field(name, "object", "")
    if last in NUM_WORDS:
        return Field(name, "number", "")
    if last in INT_WORDS and last != "number":
        return Field(name, "integer", "")
    if last in ENUM_WORDS:
        return Field(name, "enum", last)
    if last.endswith("s") and not last.endswith(("ss", "us", "is")) and len(last) > 3:
        return Field(name, "array", _string_kind([last[:-1]]))
    return Field(name, "string", _string_kind(ws))


def string_value(r: random.Random, sub: str) -> str:
    """A string value made by ``sub`` (person, city, email, url, date, phone, code, version, word)."""
    _, _, ws = _vocab()
    if sub == "person":
        return " ".join(words.random_name(r))
    if sub == "city":
        return r.choice(words.CITIES)
    if sub == "email":
        return words.random_email(r, *words.random_name(r))
    if sub == "url":
        return f"https://{r.choice(words.DOMAINS)}/{r.choice(ws)}"
    if sub == "date":
        return words.random_date(r)[0]
    if sub == "phone":
        return words.random_phone(r)
    if sub == "code":
        letters = "".join(r.choice("ABCDEFGHJKLMNPRSTUVWXZ") for _ in range(r.randrange(1, 4)))
        return f"{letters}-{r.randrange(100, 99999)}" if r.random() < 0.7 else f"{letters}{r.randrange(10, 9999)}"
    if sub == "version":
        return f"{r.randrange(0, 10)}.{r.randrange(0, 20)}.{r.randrange(0, 30)}"
    return " ".join(r.choice(ws) for _ in range(r.choice((1, 1, 2, 3))))


def leaf_schema(r: random.Random, f: Field) -> tuple[dict, Any]:
    """(schema, value) of a non-object field."""
    if f.kind == "boolean":
        return {"type": "boolean"}, r.random() < 0.5
    if f.kind == "integer":
        return {"type": "integer"}, r.choice((r.randrange(0, 10), r.randrange(10, 1000), r.randrange(1000, 100000)))
    if f.kind == "number":
        v = round(r.uniform(0, 2000), r.choice((1, 2)))
        return {"type": "number"}, v if v != int(v) else v + 0.5
    if f.kind == "enum":
        _, _, ws = _vocab()
        opts = list(ENUM_OPTIONS.get(f.sub, ())) or r.sample(ws, 5)
        opts = r.sample(opts, min(len(opts), r.randrange(3, 6)))
        return {"enum": opts}, r.choice(opts)
    if f.kind == "array":
        items = []
        for _ in range(r.randrange(1, 4)):
            v = string_value(r, f.sub)
            if v not in items:
                items.append(v)
        return {"type": "array", "items": {"type": "string"}, "minItems": 1}, items
    return {"type": "string"}, string_value(r, f.sub)


def _object(r: random.Random, names: list[str], depth: int, nest_from: list[str]) -> tuple[dict, dict]:
    """(schema, value): optional fields are left out of the value about half of the time."""
    props, required, value = {}, [], {}
    for name in names:
        f = field_of(name)
        if f.kind == "object" and depth == 0:
            pool = family_fields(r.choice(nest_from))  # a family of the same split: no held-out name leaks
            subs = [n for n in r.sample(pool, 3) if field_of(n).kind not in ("object", "array")][:3] or ["name"]
            sch, val = _object(r, subs, 1, nest_from)
        elif f.kind == "object":
            sch, val = leaf_schema(r, Field(name, "string", "word"))
        else:
            if f.kind != "object" and r.random() < 0.3:  # the type is the schema's, not only the name's
                f = Field(name, r.choice(("integer", "number", "boolean", "enum", "string")), "word")
            sch, val = leaf_schema(r, f)
        props[name] = sch
        optional = depth == 0 and r.random() < 0.2
        if not optional:
            required.append(name)
        if not optional or r.random() < 0.5:
            value[name] = val
    schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
    return schema, value


def draw_record(r: random.Random, family: str, n_fields: int | None = None, absent: int = 0) -> tuple[dict, dict]:
    """(schema, value) of one record of ``family``: 2-6 of its fields, plus a nested object now and then;
    ``absent`` more optional leaf fields of the family are asked for at drawn places in the schema and
    left out of the value (the source will not hold them).

    >>> schema, value = draw_record(random.Random(4), "order", absent=2)
    >>> len(schema["properties"]) - len(value) >= 2
    True
    """
    pool = list(family_fields(family))
    k = n_fields or r.choice((2, 3, 3, 4, 4, 5, 6))
    names = r.sample(pool, min(k, len(pool)))
    if r.random() < 0.15:
        names.append(r.choice(NEST_NAMES))
    names = list(dict.fromkeys(names))
    schema, value = _object(r, names, 0, families("held_out" if held_out_family(family) else "train"))
    spare = [n for n in pool if n not in schema["properties"] and field_of(n).kind not in ("object", "array")]
    if absent and spare:
        props = list(schema["properties"].items())
        for name in r.sample(spare, min(absent, len(spare))):
            props.insert(r.randrange(len(props) + 1), (name, leaf_schema(r, field_of(name))[0]))
        schema = {**schema, "properties": dict(props)}
    return schema, value


def families(split: str) -> list[str]:
    """The families of ``split``: ``"train"`` or ``"held_out"``."""
    return [f for f in FAMILIES if held_out_family(f) == (split == "held_out")]
