"""The guide's rules on scripted step views: no model forward, the view tensors built by hand."""
import pytest
import torch

from dgemma_struct.constraints import Choice, Regex
from dgemma_struct.errors import GenerationTimeout
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.engine.hooks import StepView
from dgemma_struct.repair.preparation import constraint_for

L = 8


def _walker(rt, spec):
    return constraint_for(spec, rt).canvas_walker()


def _view(rt, B=1, canvas_index=0):
    V = rt.model.config.text_config.vocab_size
    return StepView(canvas_index=canvas_index, step=1, max_steps=1, logits=torch.zeros(B, L, V),
                    canvas=torch.zeros(B, L, dtype=torch.long), frozen=torch.zeros(B, L, dtype=torch.bool),
                    frozen_tokens=torch.zeros(B, L, dtype=torch.long), done=torch.zeros(B, dtype=torch.bool),
                    active=torch.ones(B, dtype=torch.bool))


def _ids(rt, text):
    return rt.tokenizer.encode(text, add_special_tokens=False)


def _step(guide, view, sample, accept):
    """One denoising step: masks, then the sampler's (scripted) sample and acceptances."""
    guide.mask_logits(view)
    f = guide.rows[0].n_frozen  # the scripted run starts at the frontier
    view.sample = torch.tensor([[0] * f + sample + [0] * (L - f - len(sample))])
    view.accept = torch.tensor([[True] * f + accept + [False] * (L - f - len(accept))])
    guide.accept(view)


def test_forced_tokens_are_written_without_a_forward(tok_runtime):
    guide = ConstraintGuide([_walker(tok_runtime, Choice(["hello"]))], pad_token_id=0)
    view = _view(tok_runtime)
    guide.start_canvas(view)
    out = guide.outcome(0)
    assert out.complete and out.tokens == _ids(tok_runtime, "hello") and out.forced == len(out.tokens) + 1
    assert bool(view.done[0]) and bool(view.frozen[0].all())


def test_commit_rule_freezes_only_the_accepted_run_from_the_frontier(tok_runtime):
    a, b, c = (_ids(tok_runtime, x)[0] for x in "abc")
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-z]{1,6}"))], pad_token_id=0, progress=False)
    view = _view(tok_runtime)
    guide.start_canvas(view)
    _step(guide, view, [a, b, c], [True, False, True])  # position 1 not accepted: 2 waits
    assert guide.rows[0].walker.frozen_tokens == [a] and view.frozen[0].tolist()[:3] == [True, False, False]


def test_without_the_progress_rule_an_unaccepted_frontier_stalls_into_a_dead_end(tok_runtime):
    a = _ids(tok_runtime, "a")[0]
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-z]{1,6}"))], pad_token_id=0, progress=False,
                            stall_steps=3)
    view = _view(tok_runtime)
    guide.start_canvas(view)
    for _ in range(3):
        _step(guide, view, [a], [False])
    assert guide.outcome(0).dead_end and guide.outcome(0).tokens == []


def test_progress_rule_commits_the_frontier_even_when_not_accepted(tok_runtime):
    a = _ids(tok_runtime, "a")[0]
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-z]{1,6}"))], pad_token_id=0, progress=True)
    view = _view(tok_runtime)
    guide.start_canvas(view)
    guide.mask_logits(view)
    assert view.sample_at_pos == [(0, 0)]  # the frontier is always sampled (host positions: no device tensor)
    view.sample = torch.tensor([[a] + [0] * (L - 1)])
    view.accept = torch.zeros(1, L, dtype=torch.bool)
    guide.accept(view)
    assert guide.rows[0].walker.frozen_tokens == [a]


def test_the_mask_never_allows_a_token_the_grammar_forbids(tok_runtime):
    x = _ids(tok_runtime, "x")[0]
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-c]{1,6}"))], pad_token_id=0)
    view = _view(tok_runtime)
    guide.start_canvas(view)
    guide.mask_logits(view)
    assert view.logits[0, 0, x] == float("-inf") and view.logits[0, 0, _ids(tok_runtime, "a")[0]] == 0


def test_the_budget_caps_a_row_at_budget_minus_one_tokens_then_only_a_stop(tok_runtime):
    a = _ids(tok_runtime, "a")[0]
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-z]{1,6}"))], pad_token_id=0, budgets=[3])
    view = _view(tok_runtime)
    guide.start_canvas(view)
    _step(guide, view, [a] * 5, [True] * 5)
    assert guide.rows[0].walker.frozen_tokens == [a, a]      # budget 3: two tokens, then a stop only
    eos = tok_runtime.eos_token_ids[0]
    _step(guide, view, [eos], [True])
    assert guide.outcome(0).tokens == [a, a] and guide.outcome(0).complete and bool(view.done[0])


def test_a_spent_budget_without_a_stop_ends_the_row_incomplete(tok_runtime):
    a = _ids(tok_runtime, "a")[0]
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-z]{1,6}"))], pad_token_id=0, budgets=[3])
    view = _view(tok_runtime)
    guide.start_canvas(view)
    _step(guide, view, [a] * 2, [True] * 2)
    _step(guide, view, [a], [True])   # no room left and not a stop: the row is over
    assert guide.outcome(0).tokens == [a, a] and not guide.outcome(0).complete and bool(view.done[0])


def test_a_stopped_row_is_cut_and_ends_with_eos_on_commit(tok_runtime):
    a = _ids(tok_runtime, "a")[0]
    stop = {"now": False}
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-z]{1,6}"))], pad_token_id=0,
                            row_stop=[lambda: stop["now"]])
    view = _view(tok_runtime)
    guide.start_canvas(view)
    _step(guide, view, [a], [True])
    stop["now"] = True
    guide.mask_logits(view)
    out = guide.finish_canvas(view, torch.zeros(1, L, dtype=torch.long))
    assert guide.outcome(0).cut and bool(view.done[0])
    assert out[0].tolist()[:2] == [a, tok_runtime.eos_token_ids[0]]  # EOS at the cut, the walker never saw it
    assert guide.rows[0].walker.frozen_tokens == [a]


def test_a_passed_deadline_raises_in_both_loops(tok_runtime):
    guide = ConstraintGuide([_walker(tok_runtime, Regex("[a-z]{1,6}"))], pad_token_id=0, deadline=0.0)
    with pytest.raises(GenerationTimeout):
        guide.mask_logits(_view(tok_runtime))
    V = tok_runtime.model.config.text_config.vocab_size
    with pytest.raises(GenerationTimeout):
        guide.mask_ar_logits(torch.zeros(1, V), torch.ones(1, dtype=torch.bool))


def test_ar_mode_masks_and_commits(tok_runtime):
    a = _ids(tok_runtime, "a")[0]
    V = tok_runtime.model.config.text_config.vocab_size
    guide = ConstraintGuide([_walker(tok_runtime, Regex("a{2}"))], pad_token_id=0)
    active = torch.ones(1, dtype=torch.bool)
    logits = torch.zeros(1, V)
    guide.mask_ar_logits(logits, active)
    assert int(logits.argmax()) == a and bool(torch.isinf(logits).sum() == V - 1)
    guide.ar_token(torch.tensor([a]), active)
    guide.drain()
    assert guide.rows[0].walker.frozen_tokens == [a]


def test_host_hints_match_the_tensors_the_guide_wrote(tok_runtime):
    """The loop trusts ``frozen_upto`` / ``done_rows`` / ``touched_spans`` instead of reading the
    tensors back (issue 22): after every call they describe exactly what the guide wrote."""
    a = _ids(tok_runtime, "a")[0]
    walkers = [_walker(tok_runtime, Regex("[a-z]{1,6}")), _walker(tok_runtime, Choice(["hello"])), None]
    guide = ConstraintGuide(walkers, pad_token_id=0)
    view = _view(tok_runtime, B=3)

    def consistent():
        for b, upto in enumerate(view.frozen_upto):
            assert view.frozen[b].tolist() == [True] * upto + [False] * (L - upto)
        assert view.done_rows == view.done.tolist()

    guide.start_canvas(view)
    consistent()
    assert view.done_rows == [False, True, False] and view.frozen_upto[1] == L   # the choice is all forced
    guide.mask_logits(view)
    consistent()
    assert [s[:2] for s in view.touched_spans] == [(0, 0)] and view.sample_at_pos == [(0, 0)]
    lo, hi = view.touched_spans[0][1:]
    masked = torch.isinf(view.logits[0]).any(dim=-1).tolist()
    assert masked == [lo <= p < hi for p in range(L)]                              # exactly the span was masked
    view.sample = torch.full((3, L), a)
    view.accept = torch.tensor([[True, True] + [False] * (L - 2)] * 3)
    view.accept_rows = view.accept.tolist()
    guide.accept(view)
    consistent()
    assert view.frozen_upto[0] == 2 and view.frozen_tokens[0, :2].tolist() == [a, a]


def test_a_closing_plan_the_masks_refuse_is_never_committed(tok_runtime, monkeypatch):
    # commit() checks the matcher only, which takes ``"`` ``,"`` where the masks allow only ``","`` (the
    # string is at its maxLength): a plan in that spelling must not be committed, the fill closes instead
    import dgemma_struct.guide.constraint_guide as cg

    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"enum": ["x"]}},
              "required": ["a", "b"], "additionalProperties": False}
    w = _walker(tok_runtime, schema)
    w.commit(_ids(tok_runtime, '{"a":"yyyy'))
    start = len(w.frozen_tokens)
    refused = _ids(tok_runtime, '"') + _ids(tok_runtime, ',"b":"x"}')
    assert w.walk(refused).n_valid == 0 and w.constraint.grammar_accepts('{"a":"yyyy","b":"x"}')
    monkeypatch.setattr(cg, "free_room", lambda *a, **k: (0, list(refused)))
    guide = ConstraintGuide([w], pad_token_id=0, budgets=[64], close_on_budget=True, force_tokens=False)
    view = _view(tok_runtime)
    guide.start_canvas(view)
    guide.finish_canvas(view, torch.zeros(1, L, dtype=torch.long))
    new = w.frozen_tokens[start:]
    assert new and new[0] != refused[0]
    check = w.constraint.canvas_walker()   # every committed token is one the masks allow
    assert check.walk(w.frozen_tokens).n_valid == len(w.frozen_tokens)
