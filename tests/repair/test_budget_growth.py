"""Budget overruns (issue #32): a default ``max_new_tokens`` grows when an output runs out of it (a
caller's own budget never does), and budget-aware closing leaves room for the element a step can open."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from dgemma_struct.guide import budget as closing
from dgemma_struct.options import AUTO_BUDGET_CAP, DefaultBudget, GenerateOptions
from dgemma_struct.repair.preparation import constraint_for
from dgemma_struct.repair.session import Attempt, RepairSession
from dgemma_struct.results import GenerationStats

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "s": {"type": "string"}},
          "required": ["a", "s"]}


def _session(rt, opts):
    return RepairSession(rt, [], constraint_for(SCHEMA, rt), opts, seed=0, deadline=None)


def _unfinished(rt):
    return Attempt(rt.tokenizer.encode('{"a":1,"s":"hello wor', add_special_tokens=False), False, False,
                   GenerationStats())


def test_default_budget_is_told_apart_from_a_callers_128():
    assert GenerateOptions().auto_budget and GenerateOptions().max_new_tokens == 128
    assert not GenerateOptions(max_new_tokens=128).auto_budget
    assert GenerateOptions().with_overrides(seed=3).auto_budget
    assert not GenerateOptions().with_overrides(max_new_tokens=64).auto_budget


def test_a_default_budget_doubles_on_an_overrun_up_to_the_cap(tok_runtime):
    s = _session(tok_runtime, GenerateOptions())
    seen = []
    for _ in range(4):
        s.judge(_unfinished(tok_runtime))
        seen.append(s.opts.max_new_tokens)
    assert seen == [256, 512, AUTO_BUDGET_CAP, AUTO_BUDGET_CAP] and isinstance(s.opts.max_new_tokens, DefaultBudget)


@pytest.mark.parametrize("explicit", [128, 64])
def test_a_callers_budget_never_grows(tok_runtime, explicit):
    s = _session(tok_runtime, GenerateOptions(max_new_tokens=explicit))
    s.judge(_unfinished(tok_runtime))
    assert s.opts.max_new_tokens == explicit


def test_a_dead_end_does_not_grow_the_budget(tok_runtime):
    s = _session(tok_runtime, GenerateOptions())
    a = _unfinished(tok_runtime)
    s.judge(Attempt(a.tokens, False, True, a.stats))
    assert s.opts.max_new_tokens == 128


def test_closing_keeps_room_for_the_longest_recent_plan(monkeypatch):
    """At an element boundary the plan is short (``]}``) but one step can open an element whose plan is
    long: the row must close while that would still fit, not when only the short plan does."""
    plan = {"now": []}
    monkeypatch.setattr(closing, "_next_plan", lambda r, remaining: plan["now"])
    row = SimpleNamespace(walker=SimpleNamespace(frozen_tokens=[]), budget=100, committed=0, closing_est=None,
                          plan_lens=[], must_close=False, plan_hint=None)

    def room(committed, plan_len):
        row.committed, row.walker.frozen_tokens, plan["now"] = committed, [0] * committed, [5] * plan_len
        return closing.free_room(row, None)[0]

    m = closing.CLOSING_MARGIN
    assert room(60, 20) == 99 - 60 - 20 - m          # inside an element: twenty tokens to close
    assert room(70, 2) == 99 - 70 - 20 - m           # at the boundary: room for another element, not 99-70-2-m
    assert room(70 + closing.PEAK_WINDOW + 1, 2) == max(0, 99 - 70 - closing.PEAK_WINDOW - 1 - 2 - m)


def _grounded_near_the_end(tok_runtime):
    from dgemma_struct.grounding import compile_grounded

    tok = tok_runtime.tokenizer
    src = "Service cat. Rules urlhost and bootstrap and channel info netprofilezookeeperwithalongtail."
    schema = {"type": "object", "properties": {"rules": {"type": "array", "items": {"type": "string"}},
                                               "channel": {"type": "string"}, "service": {"type": "string"}},
              "required": ["channel", "service"], "additionalProperties": False}
    c = compile_grounded(schema, tok, source=src, ground="all", stop_token_ids=tok_runtime.eos_token_ids)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    prefix = enc('{"rules":["urlhost","bootstrap","channel info')
    w = c.canvas_walker()
    w.commit(prefix)
    cands = closing.closer_ids(w)
    short = closing.closing_plan(w, cands[0], cands[1], 64, cands[2], cands[3])     # '"],"channel":"...'
    return c, w, enc, prefix, cands, short


def test_a_run_that_would_leave_no_plan_in_budget_is_cut_and_the_row_closes(tok_runtime):
    """One canvas step near the end may accept tokens that lengthen the closing plan by more than they
    use: here the first letters of a long grounded word (the rest is forced) inside a new array element,
    with two required fields still to write. Capped only by the room, the row went past the point where
    any plan fits and ran out of every budget (a held-out record of evaluate_splits fell back to AR).
    The run is cut to a prefix that leaves a plan in budget, and the row closes from there."""
    from dgemma_struct.guide.rows import RowState

    c, w, enc, prefix, (quote, bracket, byte_ids, byte_values), short = _grounded_near_the_end(tok_runtime)
    run = enc(" netprofilezookeeperwithalongtail")
    budget = len(prefix) + len(short) + closing.CLOSING_MARGIN + 3 + 1             # room 2..3, stop included
    row = RowState(walker=w, budget=budget)
    room, plan = closing.free_room(row, None)
    assert 0 < room < len(plan)
    late = c.canvas_walker()                                  # what the room alone let through
    late.commit(prefix + run[:room])
    late.commit(late.forced_tokens(64))
    left = budget - 1 - len(late.frozen_tokens)
    assert closing.closing_plan(late, quote, bracket, max(left - closing.CLOSING_MARGIN, 0), byte_ids,
                                byte_values) is None
    got = closing.cap_run(row, list(run), None)
    assert len(got) < room and row.must_close and w.frozen_tokens == prefix        # tried, rolled back
    assert closing.free_room(row, None)[0] == 0                                    # it closes now
    w.commit(got)
    left = budget - 1 - len(w.frozen_tokens)
    assert closing.closing_plan(w, quote, bracket, left, byte_ids, byte_values) is not None


def test_ar_near_the_end_never_takes_a_token_after_which_no_plan_fits(tok_runtime, monkeypatch):
    """The AR side: the model's favourite (the first token of a long grounded word, the rest forced) is
    masked out near the end when no closing plan would fit after it; the runner-up that keeps one is
    taken. When none of the top tokens keeps one, the row closes now."""
    import torch

    from dgemma_struct.guide.constraint_guide import ConstraintGuide

    c, w, enc, prefix, cands, short = _grounded_near_the_end(tok_runtime)
    bad, good = enc(" netprofilezookeeperwithalongtail")[0], enc('"')[0]
    budget = len(short) + closing.CLOSING_MARGIN + 3 + 1
    V = tok_runtime.model.config.text_config.vocab_size
    guide = ConstraintGuide([w], pad_token_id=0, budgets=[budget], close_on_budget=True)
    room, plan = closing.free_room(guide.rows[0], None)
    assert 0 < room < len(plan)
    logits = torch.zeros(1, V)
    logits[0, bad], logits[0, good] = 5.0, 4.0
    guide.mask_ar_logits(logits, torch.ones(1, dtype=torch.bool))
    assert logits[0, bad] == float("-inf") and int(logits.argmax()) == good and not guide.rows[0].must_close
    assert w.frozen_tokens == prefix                                               # tried, rolled back
    guide.drain()
    # none of the tokens checked keeps a plan: the row closes along its plan
    monkeypatch.setattr(closing, "NEAR_END_CHECKED", 1)
    guide = ConstraintGuide([c.canvas_walker()], pad_token_id=0, budgets=[budget + len(prefix)], close_on_budget=True)
    guide.rows[0].walker.commit(prefix)
    logits = torch.zeros(1, V)
    logits[0, bad] = 5.0
    guide.mask_ar_logits(logits, torch.ones(1, dtype=torch.bool))
    assert guide.rows[0].must_close and int(logits.argmax()) == guide.rows[0].closing_est[1][0]
    guide.drain()


def test_a_long_closing_is_planned_before_the_usual_window(tok_runtime):
    """A schema whose shortest completion is longer than the window where plans are estimated (its keys
    alone take most of a 128-token budget on the embedded tokenizer): no plan was estimated while more
    than 96 tokens were left, one canvas step then committed past the point where any plan fits, and a
    held-out record of evaluate_splits ended in LengthError. The row's first estimate now tells how long
    closing takes, and the window starts that much (plus a step) earlier."""
    from dgemma_struct.guide.rows import RowState

    keys = ["topic_taxonomy_taxons", "named_user_identifier", "averageUtilization", "warnings_as_errors",
            "container_runtime_version", "self_service_provisioning"]
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in keys}, "required": keys,
              "additionalProperties": False}
    w = constraint_for(schema, tok_runtime).canvas_walker()
    row = RowState(walker=w, budget=128)
    room, plan = closing.free_room(row, (0, 32))
    assert len(plan) + closing.CLOSING_MARGIN + 32 > closing.FAR_FROM_END     # the case: a long plan
    assert plan and room == 127 - len(plan) - closing.CLOSING_MARGIN           # estimated, not "far from the end"
    assert row.plan_hint == len(plan)
    # a short schema keeps the usual window: nothing estimated far from the end
    short = RowState(walker=constraint_for(SCHEMA, tok_runtime).canvas_walker(), budget=128)
    assert closing.free_room(short, (0, 32)) == (127, [])


def test_a_closing_search_that_finds_no_valid_plan_backs_off(tok_runtime, monkeypatch):
    """Where no closing plan validates, the searches are not rerun after every commit: the row backs
    off (8 commits, then 16 ... up to 128), keeping its last plan while the masks still take it. On
    large JSONSchemaBench schemas each search took 0.3-1.5 s and every such request ran into its
    timeout. A valid plan ends the back-off."""
    from dgemma_struct.guide.rows import RowState

    c = constraint_for(SCHEMA, tok_runtime)
    w = c.canvas_walker()
    row = RowState(walker=w, budget=200)
    calls, result = [], {"plan": None}
    monkeypatch.setattr(closing, "closing_plan_checked",
                        lambda *a, **k: calls.append(len(w.frozen_tokens)) or (result["plan"], result["plan"] is not None))
    ids = tok_runtime.tokenizer.encode('{"a":1,"s":"' + "x" * 80, add_special_tokens=False)
    for t in ids:
        w.commit([t])
        closing._estimate(row, len(w.frozen_tokens), 150)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert len(calls) < len(ids) // 4 and gaps[:3] == [8, 16, 32], calls
    # a plan that validates again: searched the next time the back-off allows, then every commit
    result["plan"] = tok_runtime.tokenizer.encode('"}', add_special_tokens=False)
    n = len(calls)
    for t in tok_runtime.tokenizer.encode("y" * 70, add_special_tokens=False):
        w.commit([t])
        closing._estimate(row, len(w.frozen_tokens), 150)
    assert len(calls) > n and row.search_gap == 0
