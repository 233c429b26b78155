"""Compile at llguidance speed and bounded memory (issue #14): fast metaschema check, grammar
compiled once, a byte-bounded compile cache, strict email format."""
from __future__ import annotations

import pytest

import dgemma_struct.constraints.compile as comp
from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.json_schema import _is_email, prepare_json_schema
from dgemma_struct.constraints.safety import parser_limits
from dgemma_struct.errors import SchemaError


def test_grammar_compiled_once(hf_tok):
    info = comp.get_tokenizer_info(hf_tok)
    plan = prepare_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}, info.lltok,
                               limits=parser_limits())
    assert plan.matcher is not None and not plan.matcher.is_error()
    c = comp._compile_json({"type": "integer"}, info, strict=False, whitespace="compact", separators=None)
    assert c.matches("12") and not c.matches("x")


def test_metaschema_errors_still_reported(hf_tok):
    with pytest.raises(SchemaError, match="invalid JSON Schema"):
        compile_constraint({"type": "string", "minLength": -1}, tokenizer=hf_tok)
    with pytest.raises(SchemaError, match="regex"):  # Python's re cannot run \p{L}: refused as before
        compile_constraint({"type": "string", "pattern": r"\p{L}+"}, tokenizer=hf_tok)


def test_cache_bounded_by_bytes(hf_tok, monkeypatch):
    comp.cache_clear()
    one = comp._estimate_bytes(compile_constraint({"enum": ["x" * 50]}, tokenizer=hf_tok, use_cache=False))
    monkeypatch.setattr(comp, "_CACHE_MAX_BYTES", int(3.5 * one))
    for i in range(10):
        compile_constraint({"enum": ["x" * 49 + str(i)]}, tokenizer=hf_tok)
    info = comp.cache_info()
    assert info.currsize == 3 and info.currbytes <= info.maxbytes
    # an entry larger than the whole cache is compiled but not kept
    monkeypatch.setattr(comp, "_CACHE_MAX_BYTES", 10)
    compile_constraint({"enum": ["big"]}, tokenizer=hf_tok)
    assert comp.cache_info().currsize == 3
    comp.cache_clear()
    assert comp.cache_info().currbytes == 0


@pytest.mark.parametrize("addr,ok", [
    ("ada@example.com", True), ('"quoted local"@example.org', True), ("a@[192.168.0.1]", True),
    ("x" * 64 + "@example.com", True), ("x" * 65 + "@example.com", False), ("a" * 136 + "@x.com", False),
    ("a b@example.com", False), ("ada@-bad.com", False), ("ada@" + "b" * 64 + ".com", False), ("no-at-sign", False),
])
def test_email_format_is_strict(hf_tok, addr, ok):
    assert _is_email(addr) is ok
    c = compile_constraint({"type": "string", "format": "email"}, tokenizer=hf_tok)
    import json
    assert c.validate_text(json.dumps(addr)).ok is ok
