"""generate_json & co. on a random model: valid values or typed errors, repair and fallback fire."""
import json
import re
from typing import Literal

import jsonschema
import pytest
import torch
from pydantic import BaseModel, field_validator

from dgemma_struct import (Choice, GenerationResult, Grammar, Regex, errors, generate, generate_batch,
                           generate_choice, generate_grammar, generate_json, generate_regex, partial_json, stream)

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


class Person(BaseModel):
    name: str
    age: int
    status: Literal["active", "inactive"]


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_values_validate(tiny_runtime, seed):
    res = generate_json("hello", SCHEMA, runtime=tiny_runtime, max_new_tokens=96, seed=seed, return_details=True)
    jsonschema.validate(res.value, SCHEMA)
    assert json.loads(res.text) == res.value
    s = res.stats
    assert s.forward_passes > 0 and s.forced_tokens > 0 and s.mask_s > 0 and not s.fallback


def test_pydantic_model_returns_instance(tiny_runtime):
    p = generate_json("who?", Person, runtime=tiny_runtime, max_new_tokens=96, seed=1)
    assert isinstance(p, Person) and p.status in ("active", "inactive")


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_regex_choice_grammar(tiny_runtime, mode):
    import re

    r = generate_regex("code?", r"[A-Z]{3}-[0-9]{2}", runtime=tiny_runtime, mode=mode, max_new_tokens=32)
    assert re.fullmatch(r"[A-Z]{3}-[0-9]{2}", r)
    c = generate_choice("pick", ["positive", "negative", "neutral"], runtime=tiny_runtime, mode=mode)
    assert c in ("positive", "negative", "neutral")
    g = generate_grammar("expr", "arithmetic", runtime=tiny_runtime, mode=mode, max_new_tokens=48)
    assert g  # and parsed below with lark, an independent check
    from lark import Lark
    from dgemma_struct.constraints import builtin_grammars

    Lark(builtin_grammars()["arithmetic"].read_text()).parse(g)


def test_batch_rows_have_their_own_constraints(tiny_runtime):
    res = generate_batch(["a", "bb", "ccc"], [SCHEMA, Regex(r"[a-z]{3,5}"), Choice(["x", "yy"])],
                         runtime=tiny_runtime, max_new_tokens=96)
    assert all(isinstance(r, GenerationResult) for r in res)
    jsonschema.validate(res[0].value, SCHEMA)
    assert 3 <= len(res[1].text) <= 5 and res[2].text in ("x", "yy")


@pytest.mark.parametrize("spec,exc", [
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, errors.SchemaError),
    ({"type": "string", "minLength": 5, "maxLength": 2}, errors.SchemaError),
    ({"type": "nonsense"}, errors.SchemaError),
    (Regex("(unclosed"), errors.RegexError),
    (Grammar("start: foo\nfoo: 'a' |"), errors.GrammarError),
    (Choice([]), errors.ChoiceError),
])
def test_bad_specs_raise_typed_errors_before_generation(tiny_runtime, spec, exc):
    with pytest.raises(exc):
        generate("x", spec, runtime=tiny_runtime)


def test_strict_lists_unenforceable_keywords(tiny_runtime):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(errors.SchemaError) as info:
        generate("x", schema, runtime=tiny_runtime, strict=True)
    assert "uniqueItems" in info.value.keywords


@pytest.mark.parametrize("kwargs,exc", [
    (dict(max_new_tokens=0), errors.InvalidRequestError),
    (dict(mode="beam"), errors.InvalidRequestError),
    (dict(max_repairs=-1), errors.InvalidRequestError),
    (dict(max_new_tokens=100_000), errors.PromptTooLongError),
])
def test_bad_options(tiny_runtime, kwargs, exc):
    with pytest.raises(exc):
        generate("x", Regex("[a-z]+"), runtime=tiny_runtime, **kwargs)


def test_impossible_length_is_a_typed_error_up_front(tiny_runtime):
    with pytest.raises(errors.LengthError):
        generate("x", Choice(["a very long fixed answer that needs many tokens"]), runtime=tiny_runtime,
                 max_new_tokens=2)


def _flaky_model(reject_first: int):
    calls = {"n": 0}

    class Flaky(BaseModel):
        name: str
        age: int

        @field_validator("age")
        @classmethod
        def _reject(cls, v):
            calls["n"] += 1
            if calls["n"] <= reject_first:
                raise ValueError(f"injected failure {calls['n']}")
            return v

    return Flaky, calls


def test_repair_fires_and_is_counted(tiny_runtime):
    Flaky, calls = _flaky_model(reject_first=1)
    res = generate_json("x", Flaky, runtime=tiny_runtime, max_new_tokens=96, max_repairs=2, return_details=True,
                        repair_junk=False)  # only the validator's failure triggers a repair here
    assert isinstance(res.value, Flaky)
    assert res.stats.repairs == 1 and not res.stats.fallback and calls["n"] == 2


def test_fallback_fires_after_repairs_run_out(tiny_runtime):
    Flaky, calls = _flaky_model(reject_first=3)
    res = generate_json("x", Flaky, runtime=tiny_runtime, max_new_tokens=96, max_repairs=2, return_details=True,
                        repair_junk=False)
    assert isinstance(res.value, Flaky)
    assert res.stats.fallback and res.stats.repairs == 2 and calls["n"] == 4


def test_never_valid_raises_generation_failed_with_details(tiny_runtime):
    Flaky, calls = _flaky_model(reject_first=10**9)
    with pytest.raises(errors.GenerationFailed) as info:
        generate_json("x", Flaky, runtime=tiny_runtime, max_new_tokens=96, max_repairs=1)
    err = info.value
    assert any("injected failure" in e for e in err.errors)
    assert err.partial_text.startswith('{"name":') and err.stats.fallback


def test_timeout_is_typed(tiny_runtime):
    with pytest.raises(errors.GenerationTimeout):
        generate("x", SCHEMA, runtime=tiny_runtime, timeout_s=1e-9)


def test_stream_ends_with_a_validated_value(tiny_runtime):
    events = list(stream("hello", SCHEMA, runtime=tiny_runtime, max_new_tokens=96, seed=2))
    assert events[-1].done
    jsonschema.validate(events[-1].value, SCHEMA)
    assert all(not e.done for e in events[:-1])


def test_the_stream_runs_on_the_batch_road_and_ends_as_generate_does(tiny_runtime, monkeypatch):
    import dgemma_struct.scheduling.run as run_mod

    rows = []
    real = run_mod.ContinuousScheduler.submit
    monkeypatch.setattr(run_mod.ContinuousScheduler, "submit", lambda self, req: (rows.append(req), real(self, req)))
    kw = dict(runtime=tiny_runtime, max_new_tokens=96, seed=3)
    events = list(stream("hello", SCHEMA, **kw))
    assert len(rows) == 1 and rows[0].on_canvas is not None        # one scheduler row, streamed
    drafts, last = events[:-1], events[-1]
    assert drafts and [e.canvas_index for e in drafts] == list(range(len(drafts)))
    for a, b in zip(drafts, drafts[1:]):                             # committed canvases only grow
        assert b.token_ids[:len(a.token_ids)] == a.token_ids
    assert last.done and last.validated
    assert last.value == generate("hello", SCHEMA, max_repairs=1, fallback=False, **kw)
    assert len(rows) == 2                                            # generate: a batch of one on the same road


def test_single_requests_report_model_and_constraint_time(tiny_runtime):
    res = generate("hello", SCHEMA, runtime=tiny_runtime, max_new_tokens=96, seed=0, return_details=True)
    batch = generate_batch(["hello"] * 2, SCHEMA, runtime=tiny_runtime, max_new_tokens=96, seed=[0, 1])
    for s in [res.stats] + [r.stats for r in batch]:
        assert s.model_s > 0 and s.mask_s > 0 and s.denoising_steps >= 1
        assert abs(s.model_s + s.other_s - s.wall_s) < 1e-6
    assert batch[0].text == res.text
    lengths = []   # a typed error's stats add up too (the server sends a cut-off row's stats)
    for seed in range(4):
        try:
            generate("x", OPEN, runtime=tiny_runtime, max_new_tokens=24, seed=seed, close_on_budget=False)
        except errors.LengthError as e:
            lengths.append(e.stats)
    assert lengths and all(s.model_s > 0 and abs(s.model_s + s.other_s - s.wall_s) < 1e-6 for s in lengths), lengths


def test_partial_json_closes_open_structures():
    assert partial_json('{"a":[1,2') == {"a": [1, 2]}
    assert partial_json('{"a":"hel') == {"a": "hel"}
    assert partial_json('{"a":1,') == {"a": 1}
    assert partial_json("") is None


def test_junk_in_strings_is_detected():
    from dgemma_struct.constraints.json_locate import junk_paths

    assert junk_paths({"a": "ok", "b": ['x"}', "fine"], "c": {"d": "} []"}}) == [("b", 0), ("c", "d")]
    assert junk_paths({"email": "a@b.com", "n": 3}) == []
    assert junk_paths({"city": ":31", "time": "10:30", "url": "http://x.org"}) == [("city",)]


def test_batch_row_finished_by_forced_tokens_before_first_step(tiny_runtime):
    # A `const` row is written entirely by forced tokens in start_canvas, so it is done before the
    # first forward while its neighbour still denoises (once crashed on missing self-conditioning logits).
    out = generate_batch(["Say hello.", "Give a number."], [{"const": "hello"}, {"type": "integer"}],
                         runtime=tiny_runtime, max_new_tokens=16, seed=0, return_exceptions=True)
    assert not isinstance(out[0], Exception) and out[0].value == "hello" and out[0].text == '"hello"'
    assert not isinstance(out[1], Exception), out[1]
    assert isinstance(out[1].value, int) and not isinstance(out[1].value, bool)


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_deadline_stops_a_running_loop(tiny_runtime, mode):
    # The guide itself enforces the deadline at each step, in both loops (AR once ignored it).
    import time

    from dgemma_struct.api import constraint_for
    from dgemma_struct.guide.constraint_guide import ConstraintGuide

    walker = constraint_for(SCHEMA, tiny_runtime).canvas_walker()
    guide = ConstraintGuide([walker], pad_token_id=0, deadline=time.monotonic() - 1.0)
    with pytest.raises(errors.GenerationTimeout):
        tiny_runtime.generate("hello", max_new_tokens=16, seed=0, mode=mode, hook=guide)


def test_leaked_key_names_count_as_junk():
    from dgemma_struct.constraints.json_locate import junk_paths

    schema = {"type": "object", "properties": {"job": {"type": "string"},
                                               "address": {"type": "object", "properties": {"city": {}}}}}
    assert junk_paths({"job": "addressaddresscitycity"}, schema=schema) == [("job",)]
    assert junk_paths({"job": "cityaddress"}, schema=schema) == [("job",)]
    # one key name inside ordinary text is not junk
    assert junk_paths({"job": "city planner", "address": {"city": "Lyon"}}, schema=schema) == []


OPEN = {"type": "object", "properties": {"s": {"type": "string"}, "t": {"type": "array", "items": {"type": "string"}}},
        "required": ["s", "t"]}


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_budget_aware_closing_turns_length_errors_into_values(tiny_runtime, mode):
    # The random model never closes an open string by itself: without closing most seeds run out
    # of tokens (a typed LengthError); with it, every seed closes within budget and validates.
    without = with_ = 0
    for seed in range(4):
        try:
            generate("x", OPEN, runtime=tiny_runtime, max_new_tokens=24, seed=seed, mode=mode, close_on_budget=False)
            without += 1
        except errors.LengthError:
            pass
        res = generate("x", OPEN, runtime=tiny_runtime, max_new_tokens=24, seed=seed, mode=mode, return_details=True)
        jsonschema.validate(res.value, OPEN)
        assert len(res.token_ids) <= 24 and res.stats.budget_closing
        with_ += 1
    assert with_ == 4 and without < 4


def test_closing_plan_closes_open_structures(tiny_runtime):
    from dgemma_struct.api import constraint_for
    from dgemma_struct.constraints import closer_ids, closing_plan

    c = constraint_for(OPEN, tiny_runtime)
    tok = tiny_runtime.tokenizer
    quote, bracket, byte_ids, byte_values = closer_ids(c.canvas_walker())
    assert quote.size and bracket.size
    assert all(tok.decode([int(t)]).startswith('"') for t in quote)
    assert all(set(tok.decode([int(t)])) <= set("]}") for t in bracket)
    for prefix in ['{"s":"abc', '{"s":"a","t":["x', '{"s":"a","t":[', '{"s":"a\\"']:
        w = c.canvas_walker()
        w.commit(tok.encode(prefix))
        plan = closing_plan(w, quote, bracket, 32, byte_ids, byte_values)
        assert plan is not None and len(plan) <= 8, prefix
        text = prefix + tok.decode(plan)
        assert c.matches(text), text  # the plan completes the output
    # a regex whose next part needs a specific separator: punctuation not used yet is tried first
    email = constraint_for(Regex(r"[a-z0-9.]+@[a-z]+\.[a-z]+"), tiny_runtime)
    w = email.canvas_walker()
    w.commit(tok.encode("laura"))
    plan = closing_plan(w, quote, bracket, 16, byte_ids, byte_values)
    assert plan is not None and email.matches("laura" + tok.decode(plan)), plan


def test_the_verbs_take_a_runtime_and_a_generator_compiles_once(tiny_runtime):
    import asyncio

    from dgemma_struct import Generator, generate_choice, generate_grammar, generate_json, generate_json_batch
    from dgemma_struct import agenerate_json, generate_regex

    rt = tiny_runtime
    assert generate_choice("pick", ["yes", "no"], runtime=rt) in ("yes", "no")
    assert re.fullmatch(r"[0-9]{3}", generate_regex("n", r"[0-9]{3}", runtime=rt))
    jsonschema.validate(generate_json("j", SCHEMA, runtime=rt, max_new_tokens=96), SCHEMA)
    g = generate_grammar("e", "arithmetic", runtime=rt, max_new_tokens=48)
    assert generate_json_batch(["a", "b"], {"type": "boolean"}, runtime=rt) in ([True, True], [True, False],
                                                                              [False, True], [False, False])
    assert asyncio.run(agenerate_json("a", {"type": "integer"}, runtime=rt)) is not None and g
    gen = Generator(rt, SCHEMA, max_new_tokens=96)
    one = gen("j")
    assert one == generate_json("j", SCHEMA, runtime=rt, max_new_tokens=96)  # the same call, compiled once
    assert gen.batch(["j", "k"])[0] == one
    assert asyncio.run(gen.acall("j")) == one
    events = list(gen.stream("j"))
    assert events[-1].done and events[-1].validated
    jsonschema.validate(events[-1].value, SCHEMA)


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_budget_aware_closing_finishes_a_regex(tiny_runtime, mode):
    pattern = r"[a-z0-9.]+@[a-z]+\.[a-z]+"
    for seed in range(3):
        res = generate("mail?", Regex(pattern), runtime=tiny_runtime, max_new_tokens=12, seed=seed, mode=mode,
                       return_details=True)
        assert re.fullmatch(pattern, res.value) and len(res.token_ids) <= 12



def test_junk_that_survives_the_repairs_is_returned_valid_without_fallback(tiny_runtime):
    # Every string this schema allows holds a brace, so every attempt "has junk": the repairs run,
    # then the valid value is returned (junk is a quality signal, not an error; no AR fallback).
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[{][a-z]{1,3}$"}},
              "required": ["s"], "additionalProperties": False}
    res = generate("x", schema, runtime=tiny_runtime, max_new_tokens=32, seed=0, max_repairs=1, return_details=True)
    jsonschema.validate(res.value, schema)
    assert res.stats.junk_repairs == 1 and res.stats.repairs == 1 and not res.stats.fallback


def test_ar_masks_are_computed_ahead_and_change_nothing(tiny_runtime, monkeypatch):
    # The AR mask for token t is computed on a worker thread while the forward for token t runs;
    # the output must be exactly what the synchronous path gives.
    import dgemma_struct.guide.constraint_guide as G
    import dgemma_struct.guide.lookahead as LA

    used = []
    real = G.ConstraintGuide._ar_masks

    def spy(self, rows):
        used.append(threading.current_thread().name)
        return real(self, rows)

    import threading

    monkeypatch.setattr(G.ConstraintGuide, "_ar_masks", spy)
    ahead = generate("x", SCHEMA, runtime=tiny_runtime, max_new_tokens=64, seed=3, mode="ar", return_details=True)
    assert any(n.startswith("dgemma-mask") for n in used)

    class Sync:
        def submit(self, fn, *a):
            from concurrent.futures import Future

            f = Future()
            f.set_result(fn(*a))
            return f

    monkeypatch.setattr(LA, "_mask_pool", lambda: Sync())
    sync = generate("x", SCHEMA, runtime=tiny_runtime, max_new_tokens=64, seed=3, mode="ar", return_details=True)
    assert ahead.token_ids == sync.token_ids


def test_junk_detection_avoids_false_positives_and_odd_keys():
    from dgemma_struct.constraints.json_locate import junk_paths

    schema = {"type": "object", "title": "Meeting", "properties": {"day": {"type": "string"},
                                                                    "time": {"type": "string"}}}
    assert junk_paths({"day": "daytime meeting", "time": "9am"}, schema=schema) == []  # 3-letter key
    assert junk_paths({"day": "Typetitle"}, schema=schema) == []  # schema keywords are not key names
    assert junk_paths({"m": {1: "a"}}) == []  # non-string keys (pydantic dict[int, str]) do not crash
    assert junk_paths({"day": "timetime", "time": "x"}, schema=schema) == [("day",)]


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_closing_never_writes_closers_as_string_content(tiny_runtime, mode):
    # Outside a string the plan opens a value with a bare quote, never `"]}` (which would leave
    # `]}` as the new string's content).
    from dgemma_struct.constraints.json_locate import junk_paths

    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "string"}},
                                               "c": {"type": "string"}}, "required": ["a", "b", "c"]}
    for n in (20, 24):
        res = generate("x", schema, runtime=tiny_runtime, mode=mode, max_new_tokens=n, max_repairs=0, fallback=False,
                       repair_junk=False, return_details=True)
        jsonschema.validate(res.value, schema)
        assert junk_paths(res.value) == [], res.text


def test_mask_pool_is_rebuilt_after_fork(monkeypatch):
    import dgemma_struct.guide.lookahead as G

    first = G._mask_pool()
    assert G._mask_pool() is first
    monkeypatch.setattr(G.os, "getpid", lambda: -1)  # what a forked child sees: another pid
    assert G._mask_pool() is not first


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_a_stopped_row_leaves_its_batch_at_once(tiny_runtime, mode):
    # A server's caller that timed out or went away: its row is dropped at the next step (a typed
    # GenerationTimeout in its place), the other rows are unaffected.
    prompts = ["a", "b", "c"]
    alone = generate_batch(prompts, OPEN, runtime=tiny_runtime, max_new_tokens=48, seed=1, mode=mode,
                           return_exceptions=True)
    polls = []

    def stop_b():
        polls.append(1)
        return len(polls) > 2

    out = generate_batch(prompts, OPEN, runtime=tiny_runtime, max_new_tokens=48, seed=1, mode=mode,
                         return_exceptions=True, row_stop=[None, stop_b, None])
    assert isinstance(out[1], errors.GenerationTimeout)
    for i in (0, 2):
        assert not isinstance(out[i], Exception), out[i]
        jsonschema.validate(out[i].value, OPEN)
    assert [out[0].text, out[2].text] == [alone[0].text, alone[2].text]  # rows are independent
    with pytest.raises(errors.InvalidRequestError):
        generate_batch(prompts, OPEN, runtime=tiny_runtime, row_stop=[None])
