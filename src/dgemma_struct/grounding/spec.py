"""What is grounded: the ``x-grounded`` marker (:class:`Grounded` in pydantic), the request-level
``ground`` levels and granularities, and reading a schema (dict, JSON text or pydantic model)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from dgemma_struct.constraints import JsonSchema
from dgemma_struct.errors import GroundingError, SchemaError
from dgemma_struct.grounding.sources import grounded_sources

GROUND_KEY = "x-grounded"
GRANULARITIES = ("words", "tokens", "chars")
GROUND_LEVELS = (None, "strings", "numbers", "all")


@dataclass(frozen=True)
class Grounded:
    """Pydantic field marker: ``Annotated[str, Grounded()]``, ``Annotated[int, Grounded()]``.
    ``mode``: ``"words"`` (default: spans start and end on word boundaries), ``"tokens"`` (never
    inside a hyphenated, dotted or @-joined token: ``2000-08-19``, ``8.19.18``, ``a@b.io``) or ``"chars"``.
    ``repeat``: the items of an array may repeat a string more often than the source writes it (by
    default each item copies its own place in the source: ``["red", "red"]`` needs "red" twice).

        >>> Grounded(repeat=True).marker()
        {'mode': 'words', 'repeat': True}
    """

    mode: str = "words"
    repeat: bool = False

    def __post_init__(self) -> None:
        if self.mode not in GRANULARITIES:
            raise GroundingError(f"Grounded(mode=...) must be one of {GRANULARITIES}, not {self.mode!r}")
        if not isinstance(self.repeat, bool):
            raise GroundingError(f"Grounded(repeat=...) must be true or false, not {self.repeat!r}")

    def marker(self) -> dict:
        return {"mode": self.mode, "repeat": True} if self.repeat else {"mode": self.mode}

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict:
        js = handler(core_schema)
        js = handler.resolve_ref_schema(js)
        js[GROUND_KEY] = self.marker()
        return js


def marker_mode(marker: Any, default: str, path: tuple) -> str | None:
    """``x-grounded`` value -> granularity, or None when the field is explicitly not grounded."""
    if marker is False or marker is None:
        return None
    if marker is True:
        return default
    if isinstance(marker, dict):
        mode = marker.get("mode", default)
        if mode not in GRANULARITIES:
            raise GroundingError(f"{fmt(path)}: x-grounded mode must be one of {GRANULARITIES}, not {mode!r}",
                                 path=path)
        return mode
    if isinstance(marker, str) and marker in GRANULARITIES:
        return marker
    raise GroundingError(f"{fmt(path)}: x-grounded must be true, false or {{\"mode\": \"words\"|\"chars\"}}, "
                         f"not {marker!r}", path=path)


def marker_repeat(marker: Any, path: tuple) -> bool:
    """``x-grounded``'s ``repeat`` (default false: an array item copies its own place in the source)."""
    rep = marker.get("repeat", False) if isinstance(marker, dict) else False
    if not isinstance(rep, bool):
        raise GroundingError(f"{fmt(path)}: x-grounded repeat must be true or false, not {rep!r}", path=path)
    return rep


def has_grounding(schema: Any) -> bool:
    """True when a JSON Schema (dict) or pydantic model marks any field with ``x-grounded``."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()

    def walk(x: Any) -> bool:
        if isinstance(x, dict):
            if x.get(GROUND_KEY) not in (None, False):
                return True
            return any(walk(v) for v in x.values())
        if isinstance(x, list):
            return any(walk(v) for v in x)
        return False
    return walk(schema)


def fmt(path: Sequence) -> str:
    return "/" + "/".join(str(p) for p in path) if path else "<root>"


def strip_markers(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: strip_markers(v) for k, v in x.items() if k != GROUND_KEY}
    if isinstance(x, list):
        return [strip_markers(v) for v in x]
    return x


def schema_types(node: dict) -> list[str]:
    t = node.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    if "enum" in node or "const" in node:
        vals = node.get("enum", [node.get("const")] if "const" in node else [])
        kinds = []
        for v in vals:
            k = ("string" if isinstance(v, str) else "boolean" if isinstance(v, bool) else
                 "integer" if isinstance(v, int) else "number" if isinstance(v, float) else
                 "null" if v is None else "array" if isinstance(v, list) else "object")
            if k not in kinds:
                kinds.append(k)
        return kinds
    if "properties" in node:
        return ["object"]
    if "items" in node or "prefixItems" in node:
        return ["array"]
    return []


def schema_of(schema: Any) -> tuple[Any, Any]:
    """-> (JSON Schema dict, pydantic TypeAdapter or None)."""
    if isinstance(schema, JsonSchema):
        schema = schema.as_dict()
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise SchemaError(f"schema is not valid JSON: {e}") from None
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        from pydantic import TypeAdapter
        try:
            return schema.model_json_schema(), TypeAdapter(schema)
        except Exception as e:  # noqa: BLE001 - pydantic raises several types
            raise SchemaError(f"cannot derive a JSON Schema from {schema.__name__}: {e}") from None
    if isinstance(schema, dict):
        try:
            return json.loads(json.dumps(schema)), None
        except (TypeError, ValueError) as e:
            raise SchemaError(f"schema is not JSON-serialisable: {e}") from None
    if isinstance(schema, bool):
        raise GroundingError("a boolean schema has no fields to ground")
    raise SchemaError(f"grounded extraction needs a JSON Schema dict or a pydantic model, not {schema!r}")


def grounding_options(obj: Any) -> dict:
    """Validate a server request's grounding extension (``"grounding": {"ground": "strings",
    "source": "..." | [...], "granularity": "words"}``; ``true`` means ``{"ground": "strings"}``)
    into keyword arguments of :func:`generate_grounded`. Raises :class:`GroundingError` (a 400)."""
    if obj is True:
        return {"ground": "strings"}
    if not isinstance(obj, dict):
        raise GroundingError("grounding must be true or an object with ground / source / granularity")
    unknown = sorted(set(obj) - {"ground", "source", "granularity"})
    if unknown:
        raise GroundingError(f"unknown grounding option(s): {', '.join(map(str, unknown))}")
    out: dict = {}
    if obj.get("ground") is not None:
        if obj["ground"] not in GROUND_LEVELS:
            raise GroundingError(f"grounding.ground must be one of {GROUND_LEVELS[1:]}, not {obj['ground']!r}")
        out["ground"] = obj["ground"]
    if obj.get("granularity") is not None:
        if obj["granularity"] not in GRANULARITIES:
            raise GroundingError(f"grounding.granularity must be one of {GRANULARITIES}")
        out["granularity"] = obj["granularity"]
    if obj.get("source") is not None:
        out["source"] = grounded_sources(None, obj["source"])
    return out
