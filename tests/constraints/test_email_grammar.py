"""``format: email`` in the grammar: a bounded dot-atom pattern, so the model cannot write an address the
RFC 5321 check rejects (before, llguidance's unbounded email regex let a rambling model write a 300-character
local part, every repair did it again and the request ended in a 422)."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.json_schema import EMAIL_GRAMMAR_PATTERN, _is_email
from dgemma_struct.testing import embedded_runtime  # noqa: F401  (a session-scoped fixture)

SCHEMA = {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"]}


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.from_regex(EMAIL_GRAMMAR_PATTERN, fullmatch=True))
def test_every_grammar_email_passes_the_format_check(address):
    assert _is_email(address), address


@pytest.mark.parametrize("address,in_grammar", [
    ("ines78@example.com", True), ("john.smith@mail.example.org", True), ("a+tag@x-y.co", True),
    ("x" * 32 + "@example.com", True),
    ("x" * 65 + "@example.com", False),            # local part over 64 octets: the check rejects it too
    ("}" + "add" * 30 + "@example.com", False),     # what the model wrote before
    ("a@b", False), ("a@-b.com", False), ("a..b@c.com", False), ("ab@xy--z.com", False),
    ("joe.bloggs@[127.0.0.1]", True), ("a@[255.255.255.255]", True),   # an IPv4 address literal
    ("a@[01.2.3.4]", False), ("a@[256.1.1.1]", False), ("a@[1.2.3]", False),
])
def test_grammar_email_bounds(hf_tok, address, in_grammar):
    c = compile_constraint(SCHEMA, tokenizer=hf_tok)
    text = json.dumps({"email": address}, separators=(",", ":"))
    assert c.grammar_accepts(text) is in_grammar
    if in_grammar:
        assert c.matches(text)


def test_email_with_its_own_pattern_is_left_alone(hf_tok):
    schema = {"type": "string", "format": "email", "pattern": "^[a-z]+@[a-z]+\\.com$"}
    c = compile_constraint(schema, tokenizer=hf_tok)
    assert c.grammar_accepts('"ab@cd.com"')
    assert not c.grammar_accepts('"a.b@cd.com"')


def test_the_server_load_request_that_ended_in_422_now_validates(embedded_runtime):
    # benchmarks/server_load.py request 665 (held-out corpus, seed 665) failed every level before
    from dgemma_struct import generate_json

    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "email": {"type": "string", "format": "email"}},
              "required": ["name", "age", "email"], "additionalProperties": False}
    prompt = ("Ines Zhang is 60 years old and can be reached at ines78@example.com.\n"
              "Return a JSON object with name, age and email.")
    value = generate_json([{"role": "user", "content": prompt}], schema=schema, runtime=embedded_runtime, seed=665)
    assert _is_email(value["email"]) and set(value) == {"name", "age", "email"}
