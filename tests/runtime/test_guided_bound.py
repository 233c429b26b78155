"""``guided_entropy_bound``: the entropy bound of the rows a constraint guide commits, read from a
checkpoint's ``dgemma_struct.json``; free rows keep the generation config's bound (issue #33)."""
import dataclasses
import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from dgemma_struct.constraints import Regex
from dgemma_struct.engine.canvas_steps import _bounds
from dgemma_struct.engine.sampler import CHECKPOINT_SETTINGS_FILE, DiffusionSettings, entropy_bound_accept
from dgemma_struct.errors import ModelLoadError
from dgemma_struct.guide.constraint_guide import ConstraintGuide
from dgemma_struct.repair.preparation import constraint_for
from dgemma_struct.runtime import EMBEDDED_DIR, DiffusionRuntime


@pytest.fixture(scope="module")
def runtime():
    return DiffusionRuntime.default(device="cpu")


def _run(settings, rows, reproduce=False):
    hook = SimpleNamespace(guided_rows=lambda: rows) if rows is not None else object()
    return SimpleNamespace(settings=settings, hook=hook, reproduce=reproduce)


def test_each_row_gets_the_bound_of_its_kind():
    s = DiffusionSettings(entropy_bound=1.0, guided_entropy_bound=0.0)
    ent = torch.zeros(3, 4)
    assert _bounds(_run(s, [True, True, True]), ent) == 0.0
    assert _bounds(_run(s, [False, False, False]), ent) == 1.0
    assert _bounds(_run(s, [True, False, True]), ent).tolist() == [[0.0], [1.0], [0.0]]
    assert _bounds(_run(s, None), ent) == 1.0                        # a hook that guides nothing
    assert _bounds(_run(s, [True] * 3, reproduce=True), ent) == 1.0  # model.generate's path is untouched
    assert _bounds(_run(DiffusionSettings(entropy_bound=1.0), [True] * 3), ent) == 1.0   # not set: one bound


def test_a_per_row_bound_accepts_per_row():
    logits = torch.tensor([[[9.0, 0.0], [0.0, 1.0], [9.0, 0.0]]] * 2)   # entropies 0.001, 0.58, 0.001
    got = entropy_bound_accept(logits, torch.tensor([[0.0], [1.0]]))
    assert got.tolist() == [[True, False, False], [True, True, True]]


def test_the_guide_reports_which_rows_it_commits(runtime):
    walker = constraint_for(Regex("[a-z]{1,4}"), runtime).canvas_walker()
    assert ConstraintGuide([walker, None], pad_token_id=0).guided_rows() == [True, False]


def test_the_embedded_checkpoint_commits_guided_rows_at_the_frontier_only():
    assert json.loads((EMBEDDED_DIR / CHECKPOINT_SETTINGS_FILE).read_text()) == {"guided_entropy_bound": 0.0}
    rt = DiffusionRuntime.default(device="cpu")
    assert rt.settings.guided_entropy_bound == 0.0 and rt.settings.entropy_bound == 1.0


def test_a_guided_row_commits_fewer_tokens_per_step_and_a_free_row_is_unchanged(runtime):
    """Same prompts and seeds; only the guided bound differs. The free row of a mixed batch decodes
    exactly as with one bound; the guided row takes at least as many forwards."""
    prompts = ["Extract the name and age as JSON.\nAda Lind is 34 years old.", "Say hello."]
    spec = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": False}
    out = {}
    for g in (None, 0.0):
        walker = constraint_for(spec, runtime).canvas_walker()
        guide = ConstraintGuide([walker, None], pad_token_id=runtime.tokenizer.pad_token_id or 0)
        settings = dataclasses.replace(runtime.settings, guided_entropy_bound=g)
        out[g] = runtime.generate_batch(prompts, max_new_tokens=48, seed=[1, 2], hook=guide, settings=settings)
    assert out[0.0][1].token_ids == out[None][1].token_ids
    assert out[0.0][0].stats.forward_passes >= out[None][0].stats.forward_passes


@pytest.mark.parametrize("content, match", [
    ('{"guided_entropy_bound": -1}', "must be a number >= 0"),
    ('{"guided_entropy_bound": "low"}', "must be a number >= 0"),
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
    (tmp_path / CHECKPOINT_SETTINGS_FILE).write_text('{"guided_entropy_bound": null}')
    assert DiffusionRuntime.from_pretrained(tmp_path, device="cpu").settings.guided_entropy_bound is None
