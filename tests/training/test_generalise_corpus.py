"""The generalisation corpus: deterministic, answers copied from their sources, valid against their
schemas, and held-out families / field names / phrasings never in training."""
import json
import random
import re

import jsonschema
import pytest

from dgemma_struct.training import render, schemas
from dgemma_struct.training.field_names import NAMES
from dgemma_struct.training.generalise import EVAL_SPLITS, SPLITS, eval_examples, make_generalise_corpus

N = 600


@pytest.fixture(scope="module")
def train_corpus():
    return make_generalise_corpus(N, seed=3)


@pytest.fixture(scope="module")
def held():
    return eval_examples(150)


def _leaves(value):
    for _, v in render.flatten(value):
        yield from (v if isinstance(v, list) else [v])


def _keys(schema):
    for k, sub in schema.get("properties", {}).items():
        yield k
        yield from _keys(sub)


def test_same_seed_same_corpus_other_seed_other_corpus(train_corpus):
    assert make_generalise_corpus(N, seed=3) == train_corpus
    assert make_generalise_corpus(N, seed=4) != train_corpus
    assert eval_examples(20) == eval_examples(20)


def test_corpus_mixes_extraction_classification_tools_and_thinking(train_corpus):
    kinds = {e["kind"] for e in train_corpus}
    assert {"json", "classify", "tool", "short"} <= kinds
    assert any(e["thinking"] for e in train_corpus)
    types = {p.get("type", "enum") for e in train_corpus if e.get("template") and e["kind"] == "json"
             for p in e["schema"]["properties"].values()}
    assert types == {"string", "integer", "number", "boolean", "enum", "array", "object"}
    assert any(set(e["schema"]["required"]) < set(e["schema"]["properties"]) for e in train_corpus
               if e["kind"] == "json" and e.get("template"))  # optional fields occur


def test_every_answer_is_valid_and_copies_its_source(train_corpus, held):
    rows = [e for e in train_corpus if e["kind"] in ("json", "classify") and not e["thinking"]]
    rows += [e for s in held.values() for e in s]
    checked = 0
    for e in rows:
        assert json.loads(e["answer"]) == e["fields"]
        jsonschema.validate(e["fields"], e["schema"])
        if e["kind"] == "json" and e.get("template"):
            for v in _leaves(e["fields"]):
                if not isinstance(v, bool):
                    assert str(v) in e["prompt"], (v, e["prompt"])
                    checked += 1
    assert checked > 1000


def test_verbatim_check_can_fail():
    e = make_generalise_corpus(1, seed=0, split="in_distribution")[0]
    value = next(v for v in _leaves(e["fields"]) if isinstance(v, str))
    assert value in e["prompt"] and value + "zzz" not in e["prompt"]


def test_held_out_families_and_names_never_in_training(train_corpus, held):
    train_fams = {e["family"] for e in train_corpus if e.get("template") and e["kind"] == "json"}
    held_fams = {e["family"] for e in held["held_out_families"]}
    assert held_fams and train_fams and not held_fams & train_fams
    assert all(schemas.held_out_family(f) for f in held_fams)
    train_keys = {k for e in train_corpus if e.get("template") and e["kind"] == "json" for k in _keys(e["schema"])}
    assert len(train_keys) > 500
    assert not [k for k in train_keys if schemas.held_out_name(k) and k not in schemas.NEST_NAMES]
    held_names = {k for e in held["held_out_families"] for k in _keys(e["schema"]) if schemas.held_out_name(k)}
    assert len(held_names) > 20


def test_held_out_phrasings_never_in_training(train_corpus, held):
    used = {e["template"] for e in train_corpus if e.get("template")}
    held_t = {e["template"] for e in held["held_out_phrasings"]}
    assert held_t and not held_t & used
    assert len(render.templates("held_out")) >= 5 and len(render.templates("train")) >= 25
    assert not set(render.SHIPPED_TEMPLATES) & set(render.templates("held_out"))
    assert all(e["template"] in render.templates("train") for e in held["held_out_families"] + held["in_distribution"])


def test_the_split_rule_is_a_stable_hash():
    assert schemas.bucket("family", "flight") == schemas.bucket("family", "flight")
    assert [schemas.bucket("x", str(i)) for i in range(4)] == [schemas.bucket("x", str(i)) for i in range(4)]
    assert {schemas.bucket("field", n) for n in NAMES} == set(range(schemas.PARTS))
    assert EVAL_SPLITS == SPLITS[1:]
    with pytest.raises(ValueError):
        make_generalise_corpus(1, split="nope")


def test_field_vocabulary_is_large_and_plain():
    assert len(NAMES) >= 2000 and len(set(NAMES)) == len(NAMES)
    assert all(n.isidentifier() and 3 <= len(n) <= 24 for n in NAMES)
    assert schemas.split_words("deletionTimestamp") == ["deletion", "timestamp"]
    assert schemas.field_of("item_count").kind == "integer" and schemas.field_of("is_active").kind == "boolean"


def test_fresh_names_swap_people_consistently_and_only_in_training(train_corpus, held):
    from dgemma_struct.training import words
    from dgemma_struct.training.generalise import FRESH_NAMES, fresh_names

    listed = set(words.FIRST) | set(words.LAST)
    ex = {"prompt": "Call Alice Smith or Bob Smith; Alice answers.", "answer": '{"a":"Alice Smith","b":"Bob Smith"}',
          "fields": {"a": "Alice Smith", "b": ["Bob Smith"]}}
    out = fresh_names(random.Random(5), ex)
    a_first, a_last = out["fields"]["a"].split()
    assert a_first not in listed and a_last not in listed and a_last == out["fields"]["b"][0].split()[1]
    assert out["prompt"].count(a_first) == 2 and json.loads(out["answer"])["a"] == out["fields"]["a"]
    assert fresh_names(random.Random(5), {"prompt": "no people", "answer": "x", "fields": {}})["prompt"] == "no people"
    # in training about FRESH_NAMES of the examples that name a listed person are renamed
    people = [e for e in train_corpus if e["kind"] in ("json", "short", "tool") and not e["thinking"]
              and any(n in e["prompt"].split() for n in ("Call", "call", "Reserve", "Extract"))]
    renamed = [e for e in train_corpus if not any(w.strip(".,;:") in listed for w in e["prompt"].split())
               and e["kind"] == "short" and e["family"] == "phone"]
    assert people and renamed
    phones = [e for e in train_corpus if e["kind"] == "short" and e["family"] == "phone"]
    assert 0.05 < len(renamed) / len(phones) < 0.6, (len(renamed), len(phones), FRESH_NAMES)
    # the evaluation splits keep the lists' names: they measure what they measured before
    assert eval_examples(20) == eval_examples(20)


def test_unseen_name_examples_name_nobody_from_the_lists():
    from dgemma_struct.training import words
    from dgemma_struct.training.generalise import NAME_FAMILIES, unseen_name_examples

    listed = set(words.FIRST) | set(words.LAST)
    ex = unseen_name_examples(40)
    assert len(ex) == 40 and ex == unseen_name_examples(40)
    assert {e["family"] for e in ex} == set(NAME_FAMILIES)
    for e in ex:
        assert not [w for w in e["prompt"].replace(".", " ").split() if w in listed], e["prompt"]
        assert re.fullmatch(e["regex"], e["answer"])
        if e["family"] != "date":  # a date is asked for in another format
            assert e["answer"] in e["prompt"]


def test_short_records_copy_their_values_validate_and_mostly_end_in_their_number():
    from dgemma_struct.training.generalise import short_record_corpus

    recs = short_record_corpus(400, seed=2)
    assert recs == short_record_corpus(400, seed=2) and recs != short_record_corpus(400, seed=3)
    for e in recs:
        value = json.loads(e["answer"])
        jsonschema.validate(value, e["schema"])
        assert value == e["fields"] and list(value) == e["schema"]["required"]
        assert all(str(v) in e["prompt"] for v in value.values()), e["prompt"]
        assert e["template"] in render.templates("train")  # never a held-out phrasing
    # the shape the original corpus lacked: the record's last field is a number, written after its other values
    def number_last(e):
        vals = [str(v) for v in e["fields"].values()]
        at = [e["prompt"].index(v) for v in vals]
        return isinstance(list(e["fields"].values())[-1], (int, float)) and at[-1] == max(at)
    assert sum(map(number_last, recs)) > len(recs) / 2
    assert any(e["fields"].get("age") is not None and len(e["fields"]) == 2 for e in recs)


def test_table_records_are_training_extractions_laid_out_as_a_table():
    from dgemma_struct.training.generalise import table_record_corpus
    from dgemma_struct.training.schemas import families

    recs = table_record_corpus(200, seed=2)
    assert recs == table_record_corpus(200, seed=2) and recs != table_record_corpus(200, seed=3)
    train_fams = set(families("train"))
    for e in recs:
        value = json.loads(e["answer"])
        jsonschema.validate(value, e["schema"])
        assert "|---" in e["prompt"] and e["split"] == "train", e["prompt"]
        assert e["template"] in render.templates("train") and e["family"] in train_fams   # never held out


def test_absent_records_ask_for_optional_fields_the_source_does_not_hold():
    from dgemma_struct.training.generalise import absent_record_corpus
    from dgemma_struct.training.schemas import families

    recs = absent_record_corpus(200, seed=2)
    assert recs == absent_record_corpus(200, seed=2) and recs != absent_record_corpus(200, seed=3)
    train_fams = set(families("train"))
    n_absent = []
    for e in recs:
        value = json.loads(e["answer"])
        jsonschema.validate(value, e["schema"])
        missing = [k for k in e["schema"]["properties"] if k not in value]
        assert missing and not set(missing) & set(e["schema"]["required"]), e["schema"]
        assert list(value) == [k for k in e["schema"]["properties"] if k in value]  # the answer keeps schema order
        assert e["template"] in render.templates("train") and e["family"] in train_fams   # never held out
        n_absent.append(len(missing))
    assert {1, 2} <= set(n_absent)
    # the absent fields sit at drawn places, not always last
    assert any(list(e["schema"]["properties"])[-1] in json.loads(e["answer"]) for e in recs)


def test_phrasing_records_are_composed_instructions_that_never_word_a_held_out_template():
    from dgemma_struct.training.generalise import phrasing_record_corpus
    from dgemma_struct.training.schemas import families

    recs = phrasing_record_corpus(300, seed=4)
    assert recs == phrasing_record_corpus(300, seed=4) and recs != phrasing_record_corpus(300, seed=5)
    train_fams = set(families("train"))
    for e in recs:
        jsonschema.validate(json.loads(e["answer"]), e["schema"])
        assert e["template"] not in render.TEMPLATES and e["family"] in train_fams and e["split"] == "train"
        assert not render._trigrams(e["template"]) & render.HELD_OUT_TRIGRAMS, e["template"]
        for v in e["fields"].values():   # the values are still copied from the source
            for leaf in (v if isinstance(v, list) else [v]):
                if isinstance(leaf, (str, int, float)) and not isinstance(leaf, bool):
                    assert str(leaf) in e["prompt"], (leaf, e["prompt"])
    assert len({e["template"] for e in recs}) > 250   # many phrasings, not a few
    # the decontamination is not vacuous: a held-out template's own wording is caught
    held = render.templates("held_out")
    assert held and all(render._trigrams(t) & render.HELD_OUT_TRIGRAMS for t in held)
    # and it steers the draw: without it some composed instructions would share a held-out trigram
    r = random.Random(0)
    parts = [render._ASK, render._WHAT, render._AS]
    raw = {f"{r.choice(parts[0])} {r.choice(parts[1])} {r.choice(parts[2])}.\n{{src}}" for _ in range(500)}
    assert any(render._trigrams(t) & render.HELD_OUT_TRIGRAMS for t in raw)
