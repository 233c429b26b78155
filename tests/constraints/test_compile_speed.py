"""Compile at llguidance speed and bounded memory (issue #14): fast metaschema check (jsonschema-rs,
jsonschema's wording for refusals), grammar compiled once, vocabulary scans once per tokenizer, a
byte-bounded compile cache, strict email format."""
from __future__ import annotations

import json

import llguidance as _llg
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
    with pytest.raises(SchemaError, match="regex"):
        compile_constraint({"type": "string", "pattern": r"[a-"}, tokenizer=hf_tok)
    with pytest.raises(SchemaError, match="regex"):  # a property no Unicode table knows
        compile_constraint({"type": "string", "pattern": r"\p{NoSuchProperty}+"}, tokenizer=hf_tok)
    # \p{L} is ECMA-262 (and llguidance reads it): compiled, validation spells it out for Python's re
    assert compile_constraint({"type": "string", "pattern": r"\p{L}+"}, tokenizer=hf_tok).matches('"π"')


def test_cache_bounded_by_bytes(hf_tok, monkeypatch):
    comp.cache_clear()
    one = comp._estimate_bytes(compile_constraint({"enum": ["x" * 50]}, tokenizer=hf_tok, use_cache=False))
    monkeypatch.setattr(comp._cache, "max_bytes", int(3.5 * one))
    for i in range(10):
        compile_constraint({"enum": ["x" * 49 + str(i)]}, tokenizer=hf_tok)
    info = comp.cache_info()
    assert info.currsize == 3 and info.currbytes <= info.maxbytes
    # an entry larger than the whole cache is compiled but not kept
    monkeypatch.setattr(comp._cache, "max_bytes", 10)
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


# ----------------------------------------------------------------------------------------------
# one grammar build per compile; vocabulary scans once per tokenizer (issue #14, part 2)
# ----------------------------------------------------------------------------------------------
class _CountingMatcher:
    """Stands in for ``llguidance.LLMatcher``: counts constructions and grammar builds."""

    built = 0
    grammars = 0

    def __new__(cls, *args, **kwargs):
        cls.built += 1
        return _REAL_MATCHER(*args, **kwargs)


_REAL_MATCHER = _llg.LLMatcher
for _name in ("grammar_from_json_schema", "grammar_from_regex", "grammar_from_lark"):
    def _counted(*a, _f=getattr(_REAL_MATCHER, _name), **k):
        _CountingMatcher.grammars += 1
        return _f(*a, **k)
    setattr(_CountingMatcher, _name, staticmethod(_counted))
for _name in ("validate_grammar", "validate_grammar_with_warnings"):
    def _full_compile(*a, _n=_name, **k):  # a second full compile of the grammar: what must not happen
        raise AssertionError(f"LLMatcher.{_n} called during a compile")
    setattr(_CountingMatcher, _name, staticmethod(_full_compile))


@pytest.mark.parametrize("spec", [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "format": "email"}},
     "required": ["a"], "uniqueItems": True},
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "regex", "choice", "grammar",
])
def test_each_compile_builds_one_matcher(hf_tok, monkeypatch, spec):
    from dgemma_struct.constraints import Choice, Grammar, Regex
    spec = {"regex": Regex(r"[a-z]+@[a-z]+\.com"), "choice": Choice(["yes", "no"]),
            "grammar": Grammar('start: "a" b\nb: "b"+')}.get(spec, spec) if isinstance(spec, str) else spec
    monkeypatch.setattr(_llg, "LLMatcher", _CountingMatcher)
    monkeypatch.setattr(_CountingMatcher, "built", 0)
    monkeypatch.setattr(_CountingMatcher, "grammars", 0)
    c = compile_constraint(spec, tokenizer=hf_tok, use_cache=False)
    assert (_CountingMatcher.grammars, _CountingMatcher.built) == (1, 1)
    c.new_matcher()
    c.canvas_walker()
    assert _CountingMatcher.built == 1  # matchers after the compile are copies of its template


def test_vocab_scan_once_per_tokenizer(monkeypatch):
    """A fresh tokenizer: its vocabulary is read once, when its info is built; infos with other stop ids,
    the LLTokenizer path and every closing-candidate call reuse that scan, and a cache hit reads no
    vocabulary at all (not even for the default stop ids)."""
    import importlib.util
    from pathlib import Path

    import dgemma_struct.constraints.tokenizer as tk
    from dgemma_struct.constraints import closing_candidates, get_tokenizer_info

    spec = importlib.util.spec_from_file_location("_constraints_conftest", Path(__file__).with_name("conftest.py"))
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    tok = fixtures.make_tokenizer(600)  # a vocabulary no other test builds: its info is not cached yet
    scans = []
    real = tk._scan
    monkeypatch.setattr(tk, "_scan", lambda lt: scans.append(lt) or real(lt))
    info = get_tokenizer_info(tok)
    assert len(scans) == 1
    reads = []
    real_vocab = tok.get_vocab
    monkeypatch.setattr(tok, "get_vocab", lambda: reads.append(1) or real_vocab())
    for _ in range(3):
        assert get_tokenizer_info(tok) is info  # default stop ids: no vocabulary read
    assert reads == []
    eos = tok.convert_tokens_to_ids("<eos>")
    other = get_tokenizer_info(tok, [eos, tok.convert_tokens_to_ids("<pad>")])
    via_lltok = get_tokenizer_info(info.lltok)
    for i in (info, other, via_lltok):
        for max_len in (8, None):
            closing_candidates(i, max_len)
    assert len(scans) == 2 and scans[1] is other.lltok  # one per LLTokenizer object, none for closing


def _candidates_by_full_scan(info, max_len):
    """The closing candidates as the first implementation computed them: a pass over every token."""
    lt = info.lltok
    quote, bracket, single = {}, {}, {}
    for t in range(info.vocab_size):
        if t in info.special_token_ids:
            continue
        bs = lt.decode_bytes([t])
        if len(bs) == 1:
            single.setdefault(bs[0], t)
        if bs and (max_len is None or len(bs) <= max_len) and all(ch in b'"]}' for ch in bs):
            (quote if bs[:1] == b'"' else bracket if b'"' not in bs else {})[t] = len(bs)
    order = sorted(single)
    return ([*sorted(quote, key=lambda t: -quote[t])], [*sorted(bracket, key=lambda t: -bracket[t])],
            [single[b] for b in order], bytes(order))


@pytest.mark.parametrize("max_len", [8, 2, None])
def test_closing_candidates_equal_a_full_scan(hf_tok, max_len):
    from dgemma_struct.constraints import closing_candidates, get_tokenizer_info

    for info in (get_tokenizer_info(hf_tok), get_tokenizer_info(hf_tok, [1, 2, 3], vocab_size=1300)):
        q, b, ids, vals = closing_candidates(info, max_len)
        assert (q.tolist(), b.tolist(), ids.tolist(), vals) == _candidates_by_full_scan(info, max_len)


# ----------------------------------------------------------------------------------------------
# the metaschema check: jsonschema-rs decides, jsonschema words the refusals
# ----------------------------------------------------------------------------------------------
BAD_SCHEMAS = [
    {"type": "nonsense"}, {"type": "string", "minLength": -1}, {"required": "a"}, {"properties": []},
    {"items": 5}, {"multipleOf": 0}, {"enum": "x"}, {"properties": {"a": {"type": ["string", 3]}}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "additionalProperties": "no"},
    {"$schema": "http://json-schema.org/draft-04/schema#", "properties": {"a": {"minimum": "1"}}},
    {"anyOf": []}, {"allOf": {}}, {"type": "string", "pattern": "a(b"},
    {"type": "object", "patternProperties": {"[": {}}}, {"$defs": {"a": {"maxItems": 1.5}}},
]


@pytest.mark.parametrize("schema", BAD_SCHEMAS, ids=lambda s: json.dumps(s)[:40])
def test_bad_schemas_refused_with_jsonschemas_wording(hf_tok, schema):
    import jsonschema

    from dgemma_struct.constraints.schema_checks import _patterns_compile, _rs_meta_valid, jsonschema_rs

    if jsonschema_rs is not None:  # the fast check reports it (so jsonschema only words the message)
        assert not (_rs_meta_valid(schema) and _patterns_compile(schema))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    with pytest.raises(jsonschema.exceptions.SchemaError) as want:
        cls.check_schema(schema)
    with pytest.raises(SchemaError) as got:
        compile_constraint(schema, tokenizer=hf_tok, use_cache=False)
    assert str(got.value).startswith("invalid JSON Schema at #")
    assert want.value.message[:80] in str(got.value)


def test_jsonschema_rs_agrees_with_jsonschema_on_the_bench(data_dir):
    """A spread sample of JSONSchemaBench: where jsonschema-rs and jsonschema disagree it is only
    (a) draft-04 ``enum`` members not unique (jsonschema-rs accepts; harmless for validation) or
    (b) a ``pattern`` jsonschema-rs' ECMA check refuses but Python's ``re`` (validation's engine)
    compiles (jsonschema-rs refuses; the fallback to jsonschema then accepts)."""
    import gzip

    import jsonschema

    from dgemma_struct.constraints.schema_checks import (_check_metaschema, _patterns_compile, _rs_meta_valid,
                                                         jsonschema_rs)

    if jsonschema_rs is None:
        pytest.skip("jsonschema-rs is not installed")
    # ../shared's full bench (about 10,000 schemas in 30+ subsets): every 40th, at least 60. Without it,
    # the bundled fixtures (tests/data/jsonschemabench: 4 subsets x 25 records): all of them, at least 90.
    files = sorted((data_dir / "jsonschemabench").glob("*.jsonl.gz"))
    full = len(files) > 4
    step, minimum = (40, 60) if full else (1, 90)
    schemas = []
    for f in files:
        with gzip.open(f, "rt") as fh:
            schemas += [json.loads(line)["schema"] for line in fh][::step]
    assert len(schemas) >= minimum, (len(schemas), "full bench" if full else "bundled fixtures")
    checked = 0
    for s in schemas:
        if not isinstance(s, dict):
            continue
        fast = _rs_meta_valid(s) and _patterns_compile(s)
        cls = jsonschema.validators.validator_for(s, default=jsonschema.Draft202012Validator)
        err = next(iter(cls(cls.META_SCHEMA).iter_errors(s)), None)
        if fast and err is not None:
            assert err.validator == "uniqueItems" and list(err.absolute_path)[-1] == "enum", err.message[:200]
        if not fast and err is None:
            with pytest.raises(jsonschema_rs.ValidationError, match='is not a "regex"'):
                jsonschema_rs.meta.validate(s)
            _check_metaschema(s)  # the fallback accepts it
        checked += 1
    assert checked >= minimum
