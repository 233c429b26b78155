"""``dependentRequired`` in the grammar copy of a JSON Schema: llguidance does not read the keyword,
but over declared properties it is an ``anyOf`` llguidance compiles exactly."""
from __future__ import annotations

DEPENDENT_BRANCHES = 3   # dependentRequired keys compiled exactly (2^n anyOf branches); more are validated


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


def dependency_keywords(s: dict) -> None:
    """The grammar copy's dependency keywords, in place: draft-7 ``dependencies`` is removed (enforced by
    validation) and ``dependentRequired`` becomes its ``anyOf`` where it can (:func:`dependent_branches`)."""
    if isinstance(s.get("dependencies"), dict):
        s.pop("dependencies")
    if isinstance(s.get("dependentRequired"), dict):
        dependent_branches(s)
