"""``guided_entropy_bound`` / ``guided_confidence_threshold`` / ``guided_greedy``: the entropy
bound, the stopping threshold and greedy sampling of the rows a constraint guide commits, read from
a checkpoint's ``dgemma_struct.json``; free rows keep the generation config's values (issue #33)."""
import dataclasses
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from dgemma_struct.constraints import Regex
from dgemma_struct.engine.canvas_steps import _row_settings
from dgemma_struct.engine.sampler import (CHECKPOINT_SETTINGS_FILE, DiffusionSettings, StableAndConfident,
                                          entropy_bound_accept, sample_at)
from dgemma_struct.errors import ModelLoadError
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.repair.preparation import constraint_for
from dgemma_struct.runtime import EMBEDDED_DIR, DiffusionRuntime


@pytest.fixture(scope="module")
def runtime():
    return DiffusionRuntime.default(device="cpu")


def _run(settings, rows, reproduce=False, greedy=False, scale=None):
    hook = SimpleNamespace(guided_rows=lambda: rows) if rows is not None else object()
    return SimpleNamespace(settings=settings, hook=hook, reproduce=reproduce, greedy=greedy, scale=scale)


def _bounds(run, ent):
    return _row_settings(run, ent).bound


def _confidences(run, ent):
    return _row_settings(run, ent).confidence


def test_each_row_gets_the_bound_of_its_kind():
    s = DiffusionSettings(entropy_bound=1.0, guided_entropy_bound=0.0)
    ent = torch.zeros(3, 4)
    assert _bounds(_run(s, [True, True, True]), ent) == 0.0
    assert _bounds(_run(s, [False, False, False]), ent) == 1.0
    assert _bounds(_run(s, [True, False, True]), ent).tolist() == [[0.0], [1.0], [0.0]]
    assert _bounds(_run(s, None), ent) == 1.0                        # a hook that guides nothing
    assert _bounds(_run(s, [True] * 3, reproduce=True), ent) == 1.0  # model.generate's path is untouched
    assert _bounds(_run(DiffusionSettings(entropy_bound=1.0), [True] * 3), ent) == 1.0   # not set: one bound


def test_each_row_gets_the_stopping_threshold_of_its_kind():
    s = DiffusionSettings(entropy_bound=1.0, confidence_threshold=0.3, guided_confidence_threshold=0.0)
    ent = torch.zeros(3, 4)
    assert _confidences(_run(s, [True, True, True]), ent) == 0.0
    assert _confidences(_run(s, [True, False, True]), ent).tolist() == pytest.approx([0.0, 0.3, 0.0])
    assert _confidences(_run(s, [False] * 3), ent) == 0.3
    assert _confidences(_run(s, [True] * 3, reproduce=True), ent) == 0.3
    assert _bounds(_run(s, [True, False, True]), ent) == 1.0          # the bound is not guided here


def test_guided_rows_are_greedy_only_when_the_request_sets_no_temperature():
    s = DiffusionSettings(guided_greedy=True)
    ent = torch.zeros(3, 4)
    assert _row_settings(_run(s, [True, False, True]), ent).greedy == [True, False, True]
    assert _row_settings(_run(s, [True] * 3), ent).greedy is True
    assert _row_settings(_run(s, [True, False, True], scale=1.0), ent).greedy is False   # a temperature was set
    assert _row_settings(_run(s, [False, True, False], greedy=True), ent).greedy is True  # temperature 0: every row
    assert _row_settings(_run(s, [True] * 3, reproduce=True), ent).greedy is False
    assert _row_settings(_run(DiffusionSettings(), [True] * 3), ent).greedy is False


def test_per_row_greedy_takes_the_argmax_of_its_rows_only():
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 50)
    fill = torch.zeros(2, 6, dtype=torch.long)
    gens = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)]
    got = sample_at(logits, fill=fill, positions=[list(range(6))] * 2, generators=gens, greedy=[True, False])
    assert got[0].tolist() == logits[0].argmax(-1).tolist()
    again = sample_at(logits, fill=fill, positions=[[], list(range(6))],
                      generators=[None, torch.Generator().manual_seed(1)])
    assert got[1].tolist() == again[1].tolist()   # the sampled row drew what it draws alone


def test_a_per_row_threshold_stops_per_row():
    logits = torch.tensor([[[9.0, 0.0], [9.0, 0.0]]] * 3)   # confident everywhere: mean entropy ~0.001
    argmax = logits.argmax(-1)
    stopper = StableAndConfident(stability_threshold=0, confidence_threshold=0.3)
    assert stopper(argmax, logits).tolist() == [True, True, True]
    assert stopper(argmax, logits, confidence_threshold=torch.tensor([0.0, 0.3, 0.0])).tolist() == [False, True, False]
    assert stopper(argmax, logits, confidence_threshold=0.0).tolist() == [False, False, False]


def test_a_per_row_bound_accepts_per_row():
    logits = torch.tensor([[[9.0, 0.0], [0.0, 1.0], [9.0, 0.0]]] * 2)   # entropies 0.001, 0.58, 0.001
    got = entropy_bound_accept(logits, torch.tensor([[0.0], [1.0]]))
    assert got.tolist() == [[True, False, False], [True, True, True]]


def test_the_guide_reports_which_rows_it_commits(runtime):
    walker = constraint_for(Regex("[a-z]{1,4}"), runtime).canvas_walker()
    assert ConstraintGuide([walker, None], pad_token_id=0).guided_rows() == [True, False]


def test_the_embedded_checkpoint_commits_guided_rows_at_the_frontier_only():
    want = {"guided_entropy_bound": 0.0, "guided_confidence_threshold": 0.0, "guided_greedy": True}
    assert json.loads((EMBEDDED_DIR / CHECKPOINT_SETTINGS_FILE).read_text()) == want
    s = DiffusionRuntime.default(device="cpu").settings
    assert (s.guided_entropy_bound, s.guided_confidence_threshold, s.guided_greedy) == (0.0, 0.0, True)
    assert (s.entropy_bound, s.confidence_threshold) == (1.0, 0.3)   # free rows: the generation config


@pytest.mark.parametrize("key", ["guided_entropy_bound", "guided_confidence_threshold"])
def test_a_guided_row_commits_fewer_tokens_per_step_and_a_free_row_is_unchanged(runtime, key):
    """Same prompts and seeds; only one guided setting differs (the other as the checkpoint ships
    it). The free row of a mixed batch decodes exactly as without it; the guided row commits no more
    tokens per forward. (Not "at least as many forwards": with the stage 10 checkpoint the free-running
    row runs on to the budget in 3 forwards, the guided one closes its
    record in 2.)"""
    prompts = ["Extract the name and age as JSON.\nAda Lind is 34 years old.", "Say hello."]
    spec = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": False}
    base = dataclasses.replace(runtime.settings, guided_entropy_bound=None, guided_confidence_threshold=None)
    if key == "guided_confidence_threshold":
        base = dataclasses.replace(base, guided_entropy_bound=0.0)
    out = {}
    for g in (None, 0.0):
        walker = constraint_for(spec, runtime).canvas_walker()
        guide = ConstraintGuide([walker, None], pad_token_id=runtime.tokenizer.pad_token_id or 0)
        settings = dataclasses.replace(base, **{key: g})
        out[g] = runtime.generate_batch(prompts, max_new_tokens=48, seed=[1, 2], hook=guide, settings=settings)
    assert out[0.0][1].token_ids == out[None][1].token_ids
    guided, free = out[0.0][0].stats, out[None][0].stats
    assert guided.tokens_per_forward <= free.tokens_per_forward, (guided, free)


def test_guided_greedy_decodes_the_guided_row_as_temperature_0_and_the_free_row_as_before(runtime):
    prompts = ["Extract the name and age as JSON.\nAda Lind is 34 years old.", "Say hello."]
    spec = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": False}

    def run(greedy, temperature=None):
        walker = constraint_for(spec, runtime).canvas_walker()
        guide = ConstraintGuide([walker, None], pad_token_id=runtime.tokenizer.pad_token_id or 0)
        settings = dataclasses.replace(runtime.settings, guided_greedy=greedy)
        return runtime.generate_batch(prompts, max_new_tokens=48, seed=[1, 2], hook=guide, settings=settings,
                                      temperature=temperature)

    off, on, zero = run(False), run(True), run(False, temperature=0.0)
    assert on[1].token_ids == off[1].token_ids     # the free row samples as before
    assert on[0].token_ids == zero[0].token_ids    # the guided row takes the argmax
    assert run(True, temperature=1.0)[0].token_ids == run(False, temperature=1.0)[0].token_ids  # asked: kept


@pytest.mark.parametrize("content, match", [
    ('{"guided_entropy_bound": -1}', "must be a number >= 0"),
    ('{"guided_entropy_bound": "low"}', "must be a number >= 0"),
    ('{"guided_confidence_threshold": -0.5}', "guided_confidence_threshold must be a number >= 0"),
    ('{"guided_confidence_threshold": true}', "guided_confidence_threshold must be a number >= 0"),
    ('{"guided_greedy": 1}', "guided_greedy must be true or false"),
    ('{"entropy": 0}', "unknown keys"),
    ("not json", "Expecting value"),
])
def test_a_bad_checkpoint_settings_file_is_a_typed_load_error(tmp_path, content, match):
    for f in EMBEDDED_DIR.iterdir():
        if f.suffix in (".json", ".jinja", ".safetensors"):
            shutil.copy(f, tmp_path / f.name)
    (tmp_path / CHECKPOINT_SETTINGS_FILE).write_text(content)
    with pytest.raises(ModelLoadError, match=match):
        DiffusionRuntime.from_pretrained(tmp_path, device="cpu")
    (tmp_path / CHECKPOINT_SETTINGS_FILE).write_text('{"guided_entropy_bound": null, "guided_confidence_threshold": 0}')
    settings = DiffusionRuntime.from_pretrained(tmp_path, device="cpu").settings
    assert settings.guided_entropy_bound is None and settings.guided_confidence_threshold == 0.0
