"""Presence rules in the grammar copy of a JSON Schema: ``dependentRequired`` (which llguidance does
not read) and a ``oneOf`` of ``required`` lists (which it reads as ``anyOf``). Over declared
properties each is an ``anyOf`` of which properties are present, which llguidance compiles exactly."""
from __future__ import annotations

from .safety import ANNOTATIONS

DEPENDENT_BRANCHES = 3   # dependentRequired keys compiled exactly (2^n anyOf branches); more are validated
ONE_OF_KEYS = 5          # properties a oneOf of required lists may name to be compiled exactly (2^n patterns)


def dependent_branches(s: dict) -> None:
    """``dependentRequired`` (which llguidance does not read) as the ``anyOf`` it means, in place: per
    key, either the key is absent or it is present with what it needs. A key already required just
    adds its needs to ``required``. Only where every name involved is declared in ``properties``
    (llguidance writes declared properties in their declared order, required or not; an undeclared
    required one it would pin to one place); else, with more than :data:`DEPENDENT_BRANCHES` keys, or
    an ``anyOf`` / ``oneOf`` beside it, the keyword stays for llguidance to report (enforced by validation).

        >>> s = {"type": "object", "properties": {"email": {}, "phone": {}},
        ...      "dependentRequired": {"email": ["phone"]}}
        >>> dependent_branches(s); s["anyOf"]
        [{'properties': {'email': False}}, {'required': ['email', 'phone']}]
    """
    dr, props = s["dependentRequired"], s.get("properties")
    if not isinstance(props, dict) or not all(
            k in props and isinstance(v, list) and all(isinstance(x, str) and x in props for x in v)
            for k, v in dr.items()):
        return
    have = s.get("required") if isinstance(s.get("required"), list) else []
    req = set(have)
    open_keys = {}
    for k, need in dr.items():
        if k in req:
            req |= set(need)
        elif need:
            open_keys[k] = need
    if len(open_keys) > DEPENDENT_BRANCHES or (open_keys and ("anyOf" in s or "oneOf" in s)):
        return
    s.pop("dependentRequired")
    if req - set(have):
        s["required"] = list(dict.fromkeys([*have, *sorted(req)]))
    branches: list[dict] = [{}]
    for k, need in open_keys.items():
        branches = [alt for b in branches for alt in (
            {**b, "properties": {**b.get("properties", {}), k: False}},
            {**b, "required": list(dict.fromkeys([*b.get("required", []), k, *need]))})]
    if open_keys:
        s["anyOf"] = branches


def one_of_required(s: dict) -> None:
    """A ``oneOf`` whose branches only list ``required`` properties ("either ``radius`` or ``length`` and
    ``width``") as the ``anyOf`` of the presence patterns in which exactly one branch holds, in place
    (llguidance reads ``oneOf`` as ``anyOf``: both alternatives were drafted and validation refused them).
    Only where every name is declared and at most :data:`ONE_OF_KEYS` are named, without an ``anyOf``
    beside it; else it stays (enforced by validation). No pattern at all, given the object's own
    ``required``, is ``anyOf: [false]``: no value (a :class:`SchemaError` where the object must be written).

        >>> s = {"properties": {"r": {}, "w": {}}, "oneOf": [{"required": ["r"]}, {"required": ["w"]}]}
        >>> one_of_required(s); s["anyOf"]
        [{'required': ['r'], 'properties': {'w': False}}, {'required': ['w'], 'properties': {'r': False}}]
    """
    branches, props = s.get("oneOf"), s.get("properties")
    if not isinstance(branches, list) or len(branches) < 2 or not isinstance(props, dict) or "anyOf" in s:
        return
    sets = []
    for b in branches:
        req = b.get("required") if isinstance(b, dict) and set(b) - set(ANNOTATIONS) == {"required"} else None
        if not isinstance(req, list) or not all(isinstance(k, str) and k in props for k in req):
            return
        sets.append(set(req))
    keys = [k for k in props if any(k in x for x in sets)]
    if len(keys) > ONE_OF_KEYS:
        return
    have = set(s["required"]) if isinstance(s.get("required"), list) else set()
    patterns = []
    for bits in range(2 ** len(keys)):
        present = {k for i, k in enumerate(keys) if bits >> i & 1}
        if (have & set(keys)) <= present and sum(x <= present for x in sets) == 1:
            absent = {k: False for k in keys if k not in present}
            patterns.append({**({"required": [k for k in keys if k in present]} if present else {}),
                             **({"properties": absent} if absent else {})})
    s.pop("oneOf")
    s["anyOf"] = patterns or [False]   # none: no value (an error where the object must be written)


def dependency_keywords(s: dict) -> None:
    """The grammar copy's presence rules, in place: draft-7 ``dependencies`` is removed (enforced by
    validation), a ``oneOf`` of required lists and ``dependentRequired`` become the ``anyOf`` they mean
    where they can (:func:`one_of_required`, :func:`dependent_branches`)."""
    if isinstance(s.get("dependencies"), dict):
        s.pop("dependencies")
    if isinstance(s.get("oneOf"), list):
        one_of_required(s)
    if isinstance(s.get("dependentRequired"), dict):
        dependent_branches(s)
