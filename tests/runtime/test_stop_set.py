"""The runtime's whole stop set ends a constrained output, and no stop token reaches ``.text``."""
import pytest

from dgemma_struct import Regex, generate
from dgemma_struct.api import constraint_for
from dgemma_struct.engine.model_config import STOP_IDS, TURN_END_ID
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.engine.sampler import DiffusionSettings
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.train import build_tokenizer


@pytest.fixture(scope="module")
def runtime(tiny_model):
    corpus = make_corpus(200, seed=5)
    tok = build_tokenizer([e["prompt"] for e in corpus] + [e["answer"] for e in corpus], vocab_size=512)
    rt = DiffusionRuntime(tiny_model, tok, name="tiny")  # generation config: eos_token_id = [1, 6, 14]
    rt.settings = DiffusionSettings(max_denoising_steps=6, entropy_bound=0.5, confidence_threshold=0.5)
    return rt


def test_constraints_compiled_for_a_runtime_stop_on_every_eos_id(runtime):
    assert runtime.eos_token_ids == list(STOP_IDS) == [1, 6, 14]
    c = constraint_for(Regex("[a-z]{2,6}"), runtime)
    assert set(c.stop_token_ids) == {1, 6, 14}
    for stop in runtime.eos_token_ids:
        w = c.canvas_walker()
        w.commit(runtime.tokenizer.encode("ab", add_special_tokens=False) + [stop])
        assert w.is_stopped()


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_whichever_stop_token_the_model_writes_is_stripped(runtime, monkeypatch, mode):
    from dgemma_struct.guide.constraint_guide import ConstraintGuide

    seen = []
    init, mask, mask_ar = ConstraintGuide.__init__, ConstraintGuide.mask_logits, ConstraintGuide.mask_ar_logits

    # patched on the class, wherever the API builds its guide: the model prefers ``<turn|>``
    # wherever the grammar allows a stop
    def __init__(self, *a, **k):
        init(self, *a, **k)
        seen.append(self)

    def mask_logits(self, view):
        mask(self, view)
        view.logits[..., TURN_END_ID] += 1e4  # masked logits: only where a stop is allowed
        view.touched = None  # it changed every position: the loop must re-take every argmax

    def mask_ar_logits(self, logits, active):
        mask_ar(self, logits, active)
        logits[..., TURN_END_ID] += 1e4

    monkeypatch.setattr(ConstraintGuide, "__init__", __init__)
    monkeypatch.setattr(ConstraintGuide, "mask_logits", mask_logits)
    monkeypatch.setattr(ConstraintGuide, "mask_ar_logits", mask_ar_logits)
    res = generate("x", Regex("[a-z]{2,6}"), runtime=runtime, max_new_tokens=16, mode=mode, return_details=True)
    assert seen and seen[0].walkers[0].frozen_tokens[-1] == TURN_END_ID  # the output really ended with <turn|>
    assert TURN_END_ID not in res.token_ids and 1 not in res.token_ids
    assert "<turn|>" not in res.text and 2 <= len(res.value) <= 6 and res.value.isalpha()
