"""The grounded grammar, without a model: every string it accepts is a span of the source (and
valid JSON), every span it should offer is accepted, numbers come from the source, composition
with pattern/enum/format/bounds, markers, offsets, HTML and the typed errors."""
from __future__ import annotations

import json
import random
from typing import Annotated, Optional

import numpy as np
import pytest
from pydantic import BaseModel, Field

from dgemma_struct.errors import GroundingError, SchemaError
from dgemma_struct.grounding import (Grounded, chunk_offsets, compile_grounded, has_grounding, render_html,
                                     source_numbers)
from dgemma_struct.runtime import EMBEDDED_DIR


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(EMBEDDED_DIR))


def one_field(kind: dict | None = None, **marker) -> dict:
    field = {"type": "string", "x-grounded": marker or True}
    field.update(kind or {})
    return {"type": "object", "properties": {"v": field}, "required": ["v"], "additionalProperties": False}


def doc(v) -> str:
    return json.dumps({"v": v}, ensure_ascii=False, separators=(",", ":"))


NASTY = 'Ann "Bo" O\'Neil\\x said:\n\tcafé 😀 (naïve), ok\x07end'


def spans_of(text: str, granularity: str) -> set[str]:
    ch = chunk_offsets(text, granularity)
    out = set()
    for i in range(len(ch)):
        for j in range(i, len(ch)):
            s = text[ch[i][0]:ch[j][1]]
            if not (s[0].isspace() or s[-1].isspace() or ord(s[0]) < 32 or ord(s[-1]) < 32 or
                    s[0] in ",;:.!?)]}" or s[-1] in ",;:([{" or not any(c.isalnum() for c in s)):
                out.add(s)
    return out


@pytest.mark.parametrize("granularity", ["words", "tokens", "chars"])
def test_accepts_exactly_the_spans(tok, granularity):
    """Every substring of a source full of quotes, backslashes, newlines, tabs, a control char,
    accents and an emoji: accepted iff it is a chunk-aligned span without edge whitespace."""
    c = compile_grounded(one_field(mode=granularity), tok, source=NASTY, use_cache=False)
    expected = spans_of(NASTY, granularity)
    subs = {NASTY[i:j] for i in range(len(NASTY)) for j in range(i + 1, len(NASTY) + 1)}
    assert len(subs) > 600
    for s in subs:
        assert c.grammar_accepts(doc(s)) == (s in expected), repr(s)
    for s in ["", "Dan", "Ann  Bo", "cafe", "😀😀", "Ann \"Bo\" O'Neil\\\\x"]:
        assert not c.grammar_accepts(doc(s)), repr(s)


def test_random_walks_give_valid_json_spans(tok):
    """Sampling any allowed token at every step never yields invalid JSON or a non-span."""
    c = compile_grounded(one_field(mode="chars"), tok, source=NASTY, use_cache=False)
    rng = random.Random(0)
    stops = set(c.stop_token_ids)
    done = 0
    for _ in range(40):
        m = c.new_matcher()
        toks = []
        for _step in range(80):
            allowed = np.flatnonzero(np.frombuffer(m.compute_logit_bias(), dtype=np.uint8)[:c.vocab_size])
            assert allowed.size, "dead end"
            choices = [int(t) for t in allowed if int(t) not in stops]
            if not choices or (len(choices) < allowed.size and rng.random() < 0.3):
                tok_id = next(int(t) for t in allowed if int(t) in stops)
            else:
                tok_id = rng.choice(choices)
            assert m.consume_token(tok_id)
            if tok_id in stops:
                break
            toks.append(tok_id)
        else:
            continue
        text = c.tokenizer_info.lltok.decode_str(toks)
        value = json.loads(text)["v"]
        assert value in NASTY and value == value.strip()
        assert c.validate_text(text).ok
        done += 1
    assert done >= 20


def test_numbers_only_from_source(tok):
    src = "Order ORD-12345: 3 x lamp at 19.90 each, 1,250 in stock, call 555-867-5309, temp -4."
    nums = [lit.value for lit, _, _ in source_numbers(src)]
    assert nums == [3, 19.90, 1250, -4]       # no digits of codes or phone numbers
    schema = {"type": "object", "properties": {
        "qty": {"type": "integer", "x-grounded": True, "minimum": 1, "maximum": 1000},
        "price": {"type": "number", "x-grounded": True}}, "required": ["qty", "price"]}
    c = compile_grounded(schema, tok, source=src)
    ok = lambda q, p: c.grammar_accepts(f'{{"qty":{q},"price":{p}}}')  # noqa: E731
    assert ok(3, "19.90") and ok(1000 - 997, 1250) and ok(3, -4)
    assert not ok(4, "19.90")          # not in the source
    assert not ok(1250, 3)             # above maximum
    assert not ok(555, 3)              # part of a phone number
    assert not ok("19.90", 3)          # not an integer
    assert not ok(3, "19.9")           # written as 19.90 in the source; 19.9 is a different literal
    assert c.validate_text('{"qty":3,"price":19.90}').ok


def test_pattern_enum_format_compose(tok):
    src = "Call 555-867-5309 or 555-111-2222, write to tzhang@post.io. Status: shipped."
    schema = {"type": "object", "properties": {
        "phone": {"type": "string", "pattern": r"^\d{3}-\d{3}-\d{4}$", "x-grounded": True},
        "email": {"type": "string", "format": "email", "x-grounded": True},
        "status": {"enum": ["pending", "shipped"], "x-grounded": True},
        "code": {"type": "string", "minLength": 3, "maxLength": 4, "x-grounded": True}},
        "required": ["phone", "email", "status", "code"], "additionalProperties": False}
    c = compile_grounded(schema, tok, source=src)
    good = {"phone": "555-111-2222", "email": "tzhang@post.io", "status": "shipped", "code": "Call"}
    enc = lambda v: json.dumps(v, separators=(",", ":"))  # noqa: E731
    assert c.grammar_accepts(enc(good)) and c.validate_text(enc(good)).ok
    for k, bad in [("phone", "555-867"), ("phone", "555-000-0000"), ("email", "to tzhang@post.io."),
                   ("email", "tzhang@post.io."), ("status", "pending"), ("code", "or"), ("code", "Status")]:
        assert not c.grammar_accepts(enc({**good, k: bad})), (k, bad)


def test_unsatisfiable_fields_raise_before_generation(tok):
    with pytest.raises(GroundingError) as e:
        compile_grounded(one_field({"pattern": r"^\d{5}$"}), tok, source="no digits here")
    assert e.value.path == ("v",)
    with pytest.raises(GroundingError):
        compile_grounded(one_field({"enum": ["red", "blue"]}), tok, source="a green car")
    with pytest.raises(GroundingError):
        compile_grounded({"type": "object", "properties": {"n": {"type": "integer", "x-grounded": True,
                                                                 "minimum": 100}}, "required": ["n"]},
                         tok, source="only 7 and 9")


def test_an_optional_field_nothing_in_the_source_fills_is_left_out(tok):
    """An optional grounded field with no candidate in the source is not a GroundingError any more (it
    failed whole requests: "depth" asked for, the source has none): the grammar cannot write it; the
    other fields are grounded as before. A required one still raises."""
    schema = {"type": "object", "properties": {
        "depth": {"type": "integer"},
        "origin": {"type": "object", "properties": {"host": {"type": "string"}, "port": {"type": "integer"}},
                   "required": ["port", "host"]},
        "cost": {"type": "number"}, "name": {"type": "string"},
        "code": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["cost", "name"], "additionalProperties": False}
    c = compile_grounded(schema, tok, source="Ann Lee paid 935.22 at the docks", ground="all")
    assert c.matches('{"cost":935.22,"name":"Ann Lee"}')
    for bad in ('{"depth":935,"cost":935.22,"name":"Ann Lee"}', '{"cost":935.22,"name":"Ann Lee","code":"93522"}',
                '{"origin":{"host":"docks","port":935},"cost":935.22,"name":"Ann Lee"}'):
        assert not c.grammar_accepts(bad), bad
    with pytest.raises(GroundingError, match="/depth"):
        compile_grounded({**schema, "required": ["depth", "cost"]}, tok, source="Ann paid 935.22", ground="all")
    # the optional nested object is kept when the source can fill it; its span rules survive a dropped sibling
    c = compile_grounded(schema, tok, source="Ann Lee paid 935.22 at port 8080 of the docks", ground="all")
    assert c.matches('{"origin":{"host":"docks","port":8080},"cost":935.22,"name":"Ann Lee"}')
    assert not c.grammar_accepts('{"depth":7,"cost":935.22,"name":"Ann Lee"}')


@pytest.mark.parametrize("source", ["", "   \n\t ", [], ["", " "]])
def test_empty_source(tok, source):
    with pytest.raises(GroundingError, match="empty"):
        compile_grounded(one_field(), tok, source=source)


@pytest.mark.parametrize("field", [{"type": "boolean"}, {"type": "object"}, {"type": "array", "items": {}},
                                   {"type": "null"}, {}])
def test_grounding_a_non_scalar_field_is_a_typed_error(tok, field):
    schema = {"type": "object", "properties": {"x": {**field, "x-grounded": True}}}
    with pytest.raises(GroundingError, match="only string and number"):
        compile_grounded(schema, tok, source="some text")


def test_bad_options(tok):
    with pytest.raises(GroundingError):
        compile_grounded(one_field(), tok, source="x y", ground="everything")
    with pytest.raises(GroundingError):
        compile_grounded(one_field(), tok, source="x y", granularity="lines")
    with pytest.raises(GroundingError):
        compile_grounded(one_field(mode="sentences"), tok, source="x y")
    with pytest.raises(GroundingError, match="nothing to ground"):
        compile_grounded({"type": "object", "properties": {"a": {"type": "string"}}}, tok, source="x y")
    with pytest.raises(SchemaError):
        compile_grounded({"type": "object", "properties": {"a": {"$ref": "#/$defs/nope", "x-grounded": True}}},
                         tok, source="x y")
    with pytest.raises(GroundingError):
        Grounded("paragraphs")


class Address(BaseModel):
    city: Annotated[str, Grounded()]
    country: str


class Person(BaseModel):
    name: Annotated[str, Grounded()]
    age: Annotated[int, Grounded()]
    email: str = Field(json_schema_extra={"x-grounded": True})
    nick: Optional[Annotated[str, Grounded(mode="chars")]] = None
    address: Address
    skills: list[Annotated[str, Grounded()]] = []


SRC = "Tara Zhang (42) lives in Oslo, Norway; mail tzhang@post.io. Skills: rust, sql."


def test_pydantic_markers_and_nested_models(tok):
    assert has_grounding(Person) and not has_grounding({"type": "string"})
    c = compile_grounded(Person, tok, source=SRC)
    v = {"name": "Tara Zhang", "age": 42, "email": "tzhang@post.io", "nick": "ara",
         "address": {"city": "Oslo", "country": "Atlantis"}, "skills": ["rust", "sql"]}
    text = json.dumps(v, separators=(",", ":"))
    assert c.grammar_accepts(text)
    out = c.validate_text(text)
    assert out.ok and isinstance(out.value, Person)
    assert not c.grammar_accepts(text.replace('"Oslo"', '"Bergen"'))       # nested grounded field
    assert c.grammar_accepts(text.replace('"Atlantis"', '"Bergen"'))       # ungrounded field: free
    assert not c.grammar_accepts(text.replace('"ara"', '"Tar a"'))
    assert not c.grammar_accepts(text.replace('"sql"', '"go"'))            # array items grounded
    assert c.grammar_accepts(text.replace(',"nick":"ara"', ''))            # optional may be left out
    assert c.grammar_accepts(text.replace('"ara"', 'null'))
    spans, issues = c.locate(v)
    assert not issues
    got = {s.pointer: (s.start, s.end) for s in spans}
    assert got["/name"] == (0, 10) and got["/age"] == (12, 14)
    assert got["/skills/1"] == (SRC.index("sql"), SRC.index("sql") + 3)
    for s in spans:
        assert SRC[s.start:s.end] == s.text == str(s.value)


def test_request_level_ground_equals_markers(tok):
    plain = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                              "mood": {"enum": ["happy", "sad"]}},
             "required": ["name", "age", "mood"]}
    c = compile_grounded(plain, tok, source="Tara Zhang is 42.", ground="all")
    assert c.grammar_accepts('{"name":"Tara Zhang","age":42,"mood":"sad"}')  # enums stay closed sets
    assert not c.grammar_accepts('{"name":"Tara","age":41,"mood":"sad"}')
    s = compile_grounded(plain, tok, source="Tara Zhang is 42.", ground="strings")
    assert s.grammar_accepts('{"name":"Tara","age":41,"mood":"sad"}')
    assert not s.grammar_accepts('{"name":"Tar","age":41,"mood":"sad"}')
    e = compile_grounded(plain, tok, source="Tara Zhang is 42 and sad.", ground="all")
    assert e.grammar_accepts('{"name":"Tara","age":42,"mood":"sad"}')     # enum narrowed to what is written
    assert not e.grammar_accepts('{"name":"Tara","age":42,"mood":"happy"}')
    opt_out = {**plain, "properties": {**plain["properties"], "name": {"type": "string", "x-grounded": False}}}
    o = compile_grounded(opt_out, tok, source="Tara Zhang is 42.", ground="all")
    assert o.grammar_accepts('{"name":"Dara","age":42,"mood":"sad"}')


def test_several_documents_spans_do_not_cross(tok):
    docs = ["Ada Lovelace wrote notes.", "Alan Turing broke codes."]
    c = compile_grounded(one_field(), tok, source=docs)
    assert c.grammar_accepts(doc("Alan Turing")) and c.grammar_accepts(doc("wrote notes."))
    assert not c.grammar_accepts(doc("notes. Alan"))
    spans, _ = c.locate({"v": "Turing"})
    assert (spans[0].doc, spans[0].start, spans[0].end) == (1, 5, 11)


def test_validation_rejects_non_spans_even_without_the_grammar(tok):
    c = compile_grounded(one_field(), tok, source="Tara Zhang is 42.")
    out = c.validate_text(doc("Dara Zhang"))
    assert not out.ok and out.errors[0].path == ("v",)


def test_html_marks_and_escapes(tok):
    src = 'Dr. <b>Who</b> & "Rose" met in 2005.'
    schema = {"type": "object", "properties": {"who": {"type": "string"}, "year": {"type": "integer"}}}
    c = compile_grounded(schema, tok, source=src, ground="all")
    spans, _ = c.locate({"who": "<b>Who</b>", "year": 2005})
    page = render_html(c.sources, spans, value={"who": "<b>Who</b>", "year": 2005}, title="t")
    assert "<b>Who</b>" not in page.replace("&lt;b&gt;Who&lt;/b&gt;", "")
    assert page.count("<mark") == 2 and ">who</span>" in page and ">year</span>" in page
    assert "&amp; &quot;Rose&quot;" in page or "&amp; \"Rose\"" in page


def test_forced_tokens_run_through_the_quote_that_opens_a_string_value(tok):
    """The walker forces keys, braces and the ``":"`` that opens a grounded string value, as for any
    JSON constraint (a walker that stopped before the quote was measured worse on the current model:
    docs/grounding.md, "Forced tokens")."""
    c = compile_grounded(Person, tok, source=SRC)
    w = c.canvas_walker()
    text = c.tokenizer_info.lltok.decode_str(w.forced_tokens(50))
    assert text.startswith('{"name') and text.endswith('"'), text
    w.commit(c.tokenize('{"name":"Tara Zhang"'))
    after = c.tokenizer_info.lltok.decode_str(w.forced_tokens(50))
    assert after == ',"age":42,"email":"', after   # the source's one number, then the next value's quote


def test_long_source_compiles_and_masks(tok):
    """A ~2,000-word source: compiles (large lexemes are not precomputed) and its first masks are
    computed without the lexer running out of fuel."""
    from dgemma_struct.training.corpus import make_corpus
    sents = [e["prompt"].split("\n")[-1] for e in make_corpus(400, seed=5) if e["kind"] == "json"]
    src = " ".join(sents)[:14000]
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    c = compile_grounded(schema, tok, source=src, ground="all", use_cache=False)
    m = c.new_matcher()
    assert m.consume_tokens(m.compute_ff_tokens())
    allowed = np.frombuffer(m.compute_logit_bias(), dtype=np.uint8)
    assert not m.is_error(), m.get_error()
    assert allowed.sum() > 50 * 200  # many span starts, not only a stop token
    name = src.split()[7]
    age = next(lit.literal for lit, _, _ in source_numbers(src) if lit.is_int)
    assert c.grammar_accepts(f'{{"name":"{name}","age":{age}}}')



def test_tokens_mode_never_cuts_inside_a_date_code_or_address(tok):
    """``granularity="tokens"``: a span starts and ends only where a whitespace-or-punctuation token
    does, so the embedded model's ``"08"`` / ``"-06"`` / ``"2000-08"`` out of a date (seen on the
    held-out splits in ``"words"`` mode) cannot be written; whole tokens and runs of them can."""
    src = "Filed 2000-08-19 at 10:30 by o'neil@post.io, ref R-71139 v8.19.18 (12/05/2024)."
    whole = ["2000-08-19", "10:30", "o'neil@post.io", "R-71139", "v8.19.18", "12/05/2024", "Filed 2000-08-19",
             "ref R-71139"]
    inside = ["08", "-08-19", "2000-08", "19", "10", "30", "post.io", "neil", "71139", "R", "19.18", "05/2024"]
    words = compile_grounded(one_field(mode="words"), tok, source=src, use_cache=False)
    tokens = compile_grounded(one_field(mode="tokens"), tok, source=src, use_cache=False)
    for s in whole:
        assert tokens.grammar_accepts(doc(s)) and words.grammar_accepts(doc(s)), s
    for s in inside:
        assert not tokens.grammar_accepts(doc(s)) and words.grammar_accepts(doc(s)), s


def test_a_span_needs_a_letter_or_digit_of_the_source_not_of_an_escape(tok):
    """``"@\\n'"`` is written with an ``n`` and ``"#\\u0007#"`` with digits, but neither holds a letter or
    digit of the source: no granularity admits them (the rule once looked at the escaped text)."""
    src = "x @\n' y #\x07# z"
    for granularity in ("words", "tokens", "chars"):
        c = compile_grounded(one_field(mode=granularity), tok, source=src, use_cache=False)
        assert not c.grammar_accepts(doc("@\n'")) and not c.grammar_accepts(doc("#\x07#")), granularity
        assert c.grammar_accepts(doc("@\n' y")) and c.grammar_accepts(doc("y #\x07#")), granularity


def test_source_spelling_a_rule_name_compiles(tok):
    """The span lexeme's edge rules are written once per grammar even when the source itself spells
    one of their names (it used to be looked up in the grammar text, source chunks included)."""
    schema = {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]}
    for granularity in ("words", "tokens", "chars"):
        c = compile_grounded(schema, tok, source="Call EDGE_WS now, Ann Lee.", ground="strings",
                             granularity=granularity, use_cache=False)
        assert c.lark.count("EDGE_WS:") == 1
        assert c.matches(doc("Ann Lee")) and not c.matches(doc(" Ann"))


def test_server_grounding_options():
    from dgemma_struct.grounding import grounding_options
    assert grounding_options(True) == {"ground": "strings"}
    for g in ("words", "tokens", "chars"):
        assert grounding_options({"ground": "all", "source": ["a b"], "granularity": g}) == {
            "ground": "all", "source": ("a b",), "granularity": g}
    for bad in [False, "yes", {"ground": "words"}, {"sauce": "x"}, {"source": ""}, {"source": [1]},
                {"granularity": "lines"}]:
        with pytest.raises(GroundingError):
            grounding_options(bad)


@pytest.mark.parametrize("seed", range(6))
def test_random_nasty_sources_exhaustive(tok, seed):
    """Random short sources over quotes, backslashes, control characters, accents, emoji and
    separators: in both modes exactly the expected spans are accepted, and each accepted output
    is valid JSON that decodes to that span."""
    rng = random.Random(seed)
    alphabet = ['"', "\\", "\n", "\t", "\x01", "\u2028", "é", "😀", " ", "a", "b", "7", ",", ".", "u", "n", "/",
                "-", ":", "'", "@"]
    src = "".join(rng.choice(alphabet) for _ in range(14)) + " ab"
    for granularity in ("words", "tokens", "chars"):
        c = compile_grounded(one_field(mode=granularity), tok, source=src, use_cache=False)
        expected = spans_of(src, granularity)
        for s in {src[i:j] for i in range(len(src)) for j in range(i + 1, len(src) + 1)}:
            text = doc(s)
            assert c.grammar_accepts(text) == (s in expected), (granularity, src, s)
            if s in expected:
                assert json.loads(text)["v"] == s


def test_a_value_is_never_a_field_name_nor_crosses_a_table_cell(tok):
    """The embedded model copied header cells and labels as values ("initiatorName": "taxons",
    "hostname": "type |"); the span lexeme leaves out the texts that name a requested field (any
    case, words joined by spaces, ``_`` or ``-``; nested fields too) and spans over a cell border."""
    src = ("| taxons | Initiator Name |\n|---|---|\n| requests chat registries | Emil Jensen |\n"
           "Owner city: Mexico City; size: a|b")
    schema = {"type": "object", "properties": {
        "taxons": {"type": "string"}, "initiatorName": {"type": "string"},
        "owner": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "required": ["taxons", "initiatorName", "owner"]}
    c = compile_grounded(schema, tok, source=src, ground="strings", use_cache=False)

    def accepts(a: str, b: str = "Emil Jensen", city: str = "Mexico City") -> bool:
        return c.grammar_accepts(json.dumps({"taxons": a, "initiatorName": b, "owner": {"city": city}},
                                            separators=(",", ":")))
    assert accepts("requests chat registries") and accepts("requests") and accepts("Emil")
    for label in ("taxons", "Initiator Name"):
        assert not accepts(label) and not accepts("Emil Jensen", label), label
    assert not accepts("requests chat registries", city="city") and not accepts("requests", city="City")
    assert not accepts("taxons |") and not accepts("chat registries | Emil")
    # a pipe inside a word; a field name inside a longer value ("Mexico City" beside a city field)
    assert accepts("a|b") and accepts("Mexico City") and accepts("requests", city="Mexico City")
    assert not accepts("Owner city")   # "city:" names a field there: not value text
    # a word that names no field stays a value
    plain = compile_grounded(one_field(), tok, source="taxons are listed", use_cache=False)
    assert plain.grammar_accepts(doc("taxons"))


def test_a_value_never_spans_a_name_value_separator_nor_a_bullet(tok):
    """"driver opts: removal headless\n* burst: isolation": a value may not hold "burst: isolation"
    (a field's name then ``:``, ``=`` or `` - ``), start with a list bullet or end with a dash."""
    src = "* driver opts: removal headless\n* burst: isolation\n- tr_shipping_base - languages formats\nratio: 3:4"
    schema = {"type": "object", "properties": {"burst": {"type": "string"}, "driver_opts": {"type": "string"},
                                               "tr_shipping_base": {"type": "string"}},
              "required": ["burst", "driver_opts", "tr_shipping_base"]}
    c = compile_grounded(schema, tok, source=src, ground="strings", use_cache=False)

    def accepts(v: str) -> bool:
        return c.grammar_accepts(json.dumps({"burst": v, "driver_opts": "removal headless",
                                             "tr_shipping_base": "languages formats"}, separators=(",", ":")))
    assert accepts("isolation") and accepts("removal headless") and accepts("languages formats")
    assert accepts("3:4") and accepts("ratio: 3:4")          # a colon after a word that names no field
    for bad in ("burst: isolation", "headless\n* burst: isolation", "tr_shipping_base - languages formats",
                "- tr_shipping_base", "* burst", "isolation\n-", "removal headless\n*"):
        assert not accepts(bad), bad



def test_a_source_of_field_names_only_has_no_value_to_offer(tok):
    schema = {"type": "object", "properties": {"burst": {"type": "string"}, "guid": {"type": "string"}},
              "required": ["burst"]}
    with pytest.raises(GroundingError, match="no text of the source"):
        compile_grounded(schema, tok, source="* burst:\n| guid = |", ground="strings", use_cache=False)


LIST = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "x-grounded": True}},
                                         "n": {"type": "array", "items": {"type": "integer", "x-grounded": True}}},
        "required": ["tags"], "additionalProperties": False}


def test_array_items_copy_distinct_places_of_the_source(tok):
    c = compile_grounded(LIST, tok, source="Tags: red, blue, red and green; sizes 4 and 5.")
    # "red" is written twice: two items may copy it, each from its own place
    spans, issues = c.locate({"tags": ["red", "blue", "red"]})
    assert not issues and [s.start for s in spans if s.value == "red"] == [6, 17]
    # "blue" once: a second "blue" is one item too many, an issue a repair may close the array at
    out = c.validate_text('{"tags":["red","blue","blue"]}')
    assert not out.ok and [(e.path, e.superfluous) for e in out.errors] == [(("tags", 2), True)]
    assert "writes it 1 time" in out.errors[0].message
    # the same text in two arrays, or a repeated number, is not a repeat
    assert c.validate_text('{"tags":["blue"],"n":[4,4]}').ok


def test_repeat_marker_allows_repeated_items(tok):
    rep = json.loads(json.dumps(LIST))
    rep["properties"]["tags"]["items"]["x-grounded"] = {"repeat": True}
    c = compile_grounded(rep, tok, source="Tags: red, blue.")
    assert c.validate_text('{"tags":["blue","blue"]}').ok

    class Shirt(BaseModel):
        colours: list[Annotated[str, Grounded(repeat=True)]]
    assert compile_grounded(Shirt, tok, source="a red and blue shirt").validate_text('{"colours":["red","red"]}').ok
    with pytest.raises(GroundingError, match="repeat"):
        compile_grounded({"type": "object", "properties": {"t": {"type": "array", "items": {
            "type": "string", "x-grounded": {"repeat": "yes"}}}}}, tok, source="a b")
    with pytest.raises(GroundingError, match="repeat"):
        Grounded(repeat="yes")
