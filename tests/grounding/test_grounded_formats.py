"""Grounding asserts ``format`` with the one spec-following checker (issue 23): jsonschema-rs' checks for
the formats it knows, as on the JSON surface and in tool arguments. Each value below is one where
python-jsonschema's own checker decides otherwise (see tests/constraints/test_spec_formats.py)."""
from __future__ import annotations

import json

import pytest

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.grounding import compile_grounded
from dgemma_struct.grounding.candidates import string_candidates
from dgemma_struct.runtime import EMBEDDED_DIR

CASES = [
    ("hostname", "xn--X", False),            # invalid Punycode A-label: python-jsonschema accepts it
    ("hostname", "XN--aa---o47jg78q", False),
    ("time", "23:59:60Z", True),             # leap second: python-jsonschema refuses it
    ("date-time", "1998-12-31T23:59:60Z", True),
    ("uri-template", "{var=def}", False),
]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(EMBEDDED_DIR))


def _schema(fmt: str, grounded: bool) -> dict:
    field = {"type": "string", "format": fmt, **({"x-grounded": True} if grounded else {})}
    return {"type": "object", "properties": {"v": field}, "required": ["v"], "additionalProperties": False}


@pytest.mark.parametrize("fmt, text, valid", CASES)
def test_grounded_format_verdicts_are_the_json_surfaces(tok, fmt, text, valid):
    src = f"Seen {text} at example.org on 2024-01-02, at 12:00:00Z, 1998-12-31T10:00:00Z and {{var}}."
    inst = json.dumps({"v": text}, separators=(",", ":"))
    surface = compile_constraint(_schema(fmt, False), tok, use_cache=False)
    grounded = compile_grounded(_schema(fmt, True), tok, source=src)
    assert surface.validate_text(inst).ok is valid
    assert grounded.validate_text(inst).ok is valid
    assert grounded.grammar_accepts(inst) is valid       # offered as a candidate exactly when valid
    assert (text in (string_candidates([src], {"type": "string", "format": fmt}, "words") or [])) is valid
