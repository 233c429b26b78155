"""Reading a schema with grounded fields: following local ``$ref``s, telling which sub-schemas are
grounded leaves (:class:`Leaf`) and which hold one below them, and finding the grounded values
of a JSON value."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from dgemma_struct.constraints.json_schema import make_validator
from dgemma_struct.constraints.schema_checks import follow_pointer
from dgemma_struct.errors import GroundingError, SchemaError
from dgemma_struct.grounding.sources import Doc
from dgemma_struct.grounding.spec import GROUND_KEY, fmt, marker_mode, marker_repeat, strip_markers, schema_types


@dataclass
class Leaf:
    kind: str           # "string" | "number"
    granularity: str
    repeat: bool = False  # an array may hold this string more often than the source writes it


class SchemaView:
    """A schema (``root``) as seen by grounding over ``docs``: which of its fields are grounded
    under the request's ``ground`` level and default ``granularity``."""

    def __init__(self, root: Any, docs: tuple[str, ...], *, ground: str | None, granularity: str):
        self.root = root
        self.docs = docs
        self.ground = ground
        self.granularity = granularity
        self._defs = {k: root[k] for k in ("$defs", "definitions") if isinstance(root, dict) and k in root}
        self._enum_memo: dict[tuple, bool] = {}

    def resolve(self, node: Any, path: tuple) -> tuple[Any, str | None]:
        """Follows local ``$ref`` chains; returns (target, last ref) for siblings-free refs."""
        ref = None
        seen = set()
        while isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in seen:
                raise SchemaError(f"{fmt(path)}: $ref cycle through {ref}")
            seen.add(ref)
            if not ref.startswith("#"):
                raise GroundingError(f"{fmt(path)}: only local $refs are supported with grounding, not {ref!r}",
                                     path=path)
            try:
                target: Any = follow_pointer(self.root, [p for p in ref[1:].split("/") if p])
            except LookupError:
                raise SchemaError(f"{fmt(path)}: dangling $ref {ref!r}", keywords=["$ref"]) from None
            siblings = {k: v for k, v in node.items() if k not in ("$ref", "description", "title", "default")}
            if siblings and isinstance(target, dict):
                node = {**target, **siblings}
                ref = None
            else:
                node = target
        return node, ref

    def leaf(self, node: Any, path: tuple) -> Leaf | None:
        """Is ``node`` (already resolved) a grounded leaf? Raises on grounding a non-leaf type."""
        if not isinstance(node, dict):
            return None
        marker = node.get(GROUND_KEY)
        types = schema_types(node)
        if marker is not None:
            mode = marker_mode(marker, self.granularity, path)
            if mode is None:
                return None
            scalar = [t for t in types if t != "null"]
            if not scalar or any(t not in ("string", "number", "integer") for t in scalar):
                raise GroundingError(
                    f"{fmt(path)}: only string and number fields can be grounded, not "
                    f"{'/'.join(types) or 'an untyped field'} (mark the items of an array instead)", path=path)
            if len(scalar) > 1 and "string" in scalar:
                raise GroundingError(f"{fmt(path)}: a grounded field must be a string or a number, not both",
                                     path=path)
            return Leaf("string" if scalar[0] == "string" else "number", mode, marker_repeat(marker, path))
        if self.ground is None or "const" in node:
            return None
        if "enum" in node:
            # request-level grounding narrows a string enum to the members written in the source,
            # when there is one (an enum of labels the text never spells out is left as is)
            vals = node["enum"]
            if self.ground in ("strings", "all") and isinstance(vals, list) and vals and \
                    all(isinstance(v, str) for v in vals) and self.enum_in_source(tuple(vals)):
                return Leaf("string", self.granularity)
            return None
        scalar = [t for t in types if t != "null"]
        if len(scalar) != 1:
            return None
        if scalar[0] == "string" and self.ground in ("strings", "all"):
            return Leaf("string", self.granularity)
        if scalar[0] in ("number", "integer") and self.ground in ("numbers", "all"):
            return Leaf("number", self.granularity)
        return None

    def enum_in_source(self, vals: tuple) -> bool:
        hit = self._enum_memo.get(vals)
        if hit is None:
            docs = [Doc(d) for d in self.docs]
            hit = self._enum_memo[vals] = any(d.find_string(v, self.granularity) for v in vals for d in docs)
        return hit

    def contains(self, node: Any, path: tuple, _stack: frozenset = frozenset()) -> bool:
        """Does ``node`` hold a grounded leaf anywhere below it?"""
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in _stack:
                return False
            _stack = _stack | {ref}
        node, _ = self.resolve(node, path)
        if not isinstance(node, dict):
            return False
        if self.leaf(node, path) is not None:
            return True
        for kw in ("properties", "patternProperties"):
            sub = node.get(kw)
            if isinstance(sub, dict) and any(self.contains(v, path + (k,), _stack) for k, v in sub.items()):
                return True
        for kw in ("items", "additionalProperties", "additionalItems", "contains", "not", "if", "then", "else"):
            sub = node.get(kw)
            if isinstance(sub, dict) and self.contains(sub, path + (kw,), _stack):
                return True
            if isinstance(sub, list) and any(self.contains(v, path + (kw, i), _stack) for i, v in enumerate(sub)):
                return True
        for kw in ("anyOf", "oneOf", "allOf", "prefixItems"):
            sub = node.get(kw)
            if isinstance(sub, list) and any(self.contains(v, path + (kw, i), _stack) for i, v in enumerate(sub)):
                return True
        return False

    def leaves(self, value: Any, node: Any, path: tuple, depth: int = 0) -> Iterable[tuple[tuple, Any, Leaf]]:
        """``(path, value, leaf)`` for every grounded value in the JSON ``value`` of schema ``node``
        (for a union, the first branch ``value`` is valid against)."""
        if depth > 64:
            return
        node, _ = self.resolve(node, path)
        if not isinstance(node, dict):
            return
        leaf = self.leaf(node, path)
        if leaf is not None:
            if leaf.kind == "string" and isinstance(value, str):
                yield path, value, leaf
            elif leaf.kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield path, value, leaf
            return
        for kw in ("anyOf", "oneOf"):
            if isinstance(node.get(kw), list):
                rest = {k: v for k, v in node.items() if k != kw}
                for br in node[kw]:
                    sub = {**rest, **br} if isinstance(br, dict) and rest and "$ref" not in br else br
                    rs, _ = self.resolve(sub, path)
                    if make_validator(strip_markers({**(rs if isinstance(rs, dict) else {}),
                                                      **self._defs})).is_valid(value):
                        yield from self.leaves(value, sub, path, depth + 1)
                        return
                return
        if isinstance(node.get("allOf"), list) and len(node["allOf"]) == 1:
            yield from self.leaves(value, node["allOf"][0], path, depth + 1)
            return
        types = schema_types(node)
        if len(types) > 1:
            for t in types:
                if (t == "object" and isinstance(value, dict)) or (t == "array" and isinstance(value, list)) or \
                        (t == "string" and isinstance(value, str)):
                    yield from self.leaves(value, {**node, "type": t}, path, depth + 1)
                    return
            return
        if isinstance(value, dict):
            props = node.get("properties") or {}
            for k, v in value.items():
                if k in props:
                    yield from self.leaves(v, props[k], path + (k,), depth + 1)
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for i, v in enumerate(value):
                yield from self.leaves(v, node["items"], path + (i,), depth + 1)
