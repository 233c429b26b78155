"""Strict objects: forbid undeclared keys in every object subschema that declares ``properties``.

Schemas derived from pydantic models and tool schemas are compiled strict by default (OpenAI strict
mode and xgrammar do the same); raw JSON-Schema dicts keep JSON Schema's meaning unless the caller
passes ``strict_objects=True``.

>>> close_objects({"type": "object", "properties": {"a": {"type": "integer"}}})
{'type': 'object', 'properties': {'a': {'type': 'integer'}}, 'additionalProperties': False}
>>> close_objects({"properties": {"a": {}}, "additionalProperties": True})["additionalProperties"]
True
"""
from __future__ import annotations

from typing import Any

__all__ = ["close_objects"]

#: keywords that already say what an undeclared key may be: left alone
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def close_objects(schema: Any) -> Any:
    """A copy of ``schema`` where every (sub)schema that declares ``properties`` and none of
    ``additionalProperties`` / ``patternProperties`` / ``unevaluatedProperties`` gets
    ``additionalProperties: false`` (``$defs`` and ``definitions`` included)."""
    if isinstance(schema, list):
        return [close_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas") \
                and isinstance(v, dict):
            out[k] = {name: close_objects(sub) for name, sub in v.items()}
        elif k in ("const", "enum", "default", "examples"):
            out[k] = v  # values, not schemas
        else:
            out[k] = close_objects(v)
    if isinstance(schema.get("properties"), dict) and not any(k in schema for k in _OPEN_KEYS):
        out["additionalProperties"] = False
    return out
