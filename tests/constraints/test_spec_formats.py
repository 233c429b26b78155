"""Format assertion that follows the specs (issue 23): one checker (jsonschema-rs' for the formats it
knows, :func:`~dgemma_struct.constraints.schema_checks.with_spec_formats`) behind ``matches`` /
validation on the JSON surface and in tool arguments. Strings from the official JSON-Schema-Test-Suite
``optional/format`` tests, inlined; python-jsonschema's format-nongpl checkers decided each of these
wrongly (accepted the invalid ones, refused the leap seconds and the IPv6 IRI)."""
from __future__ import annotations

import json

import pytest

from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.json_schema import make_validator
from dgemma_struct.constraints.schema_checks import SPEC_FORMATS, format_checks, with_spec_formats

CASES = [
    ("hostname", "xn--X", False),                       # invalid Punycode A-label
    ("hostname", "XN--aa---o47jg78q", False),           # "--" in the 3rd and 4th position
    ("hostname", "www.example.com", True),
    ("idn-hostname", "example.", False),                # trailing dot
    ("uri-template", "a b", False),
    ("uri-template", "{var=def}", False),               # a default value in a varspec
    ("uri-template", "http://example.com/{term:1}/{term}", True),
    ("relative-json-pointer", "\u0661/foo", False),     # an Arabic-Indic digit
    ("relative-json-pointer", "1/foo", True),
    ("uri-reference", "//[::ffff:192.168.0.01]/p", False),
    ("time", "23:59:60Z", True),                        # leap second
    ("date-time", "1998-12-31T23:59:60Z", True),
    ("iri", "http://[2001:db8::1]", True),
    ("regex", "\\a", False),                            # not ECMA-262
    ("regex", "(?P<name>x)", False),
    ("regex", "(?i)abc", False),
    ("regex", "([abc])+\\s+$", True),
]


@pytest.mark.parametrize("fmt, text, valid", CASES)
def test_format_verdicts_follow_the_spec(hf_tok, fmt, text, valid):
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string", "format": fmt}
    c = compile_constraint(schema, hf_tok, use_cache=False)
    assert c.validate_text(json.dumps(text)).ok is valid
    if not valid:
        assert not c.matches(json.dumps(text))


def test_checker_keeps_other_formats_and_older_drafts():
    assert set(format_checks()) == set(SPEC_FORMATS)
    v = with_spec_formats(make_validator({"$schema": "http://json-schema.org/draft-07/schema#", "format": "hostname"}))
    assert not v.is_valid("xn--X") and v.is_valid("example.com")
    v = with_spec_formats(make_validator({"format": "color"}))   # a format jsonschema-rs does not know: kept
    assert v.format_checker.checkers.get("color") == make_validator({}).format_checker.checkers.get("color")


def test_tool_arguments_use_the_same_checker(gemma4_tokenizer):
    from dgemma_struct.tools import compile_tool_calls, encode_arguments

    tool = {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {"host": {"type": "string", "format": "hostname"}}, "required": ["host"]}}}
    c = compile_tool_calls([tool], gemma4_tokenizer, stop_token_ids=[1, 106, 50])

    def call(host):
        return f"<|tool_call>call:ping{encode_arguments({'host': host})}<tool_call|>"
    assert c.validate_text(call("example.com")).ok
    assert not c.validate_text(call("xn--X")).ok
