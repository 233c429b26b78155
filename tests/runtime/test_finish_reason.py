"""A free-text row that ends in pad (every token after its text is pad or a stop token) did stop:
``finish_reason="stop"``; only a row cut at ``max_new_tokens`` is ``"length"``."""
import pytest

from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.testing import embedded_model_available

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")


@pytest.fixture(scope="module")
def rt():
    return DiffusionRuntime.default(device="cpu")


def test_a_row_ending_in_pad_stopped(rt):
    pad, (eos, *_) = rt.pad_token_id, rt.eos_token_ids
    assert rt.split_output([11, 12, pad, pad], 8) == ([11, 12], "stop")
    assert rt.split_output([11, 12, pad, eos, pad], 8) == ([11, 12], "stop")
    assert rt.split_output([pad, pad], 8) == ([], "stop")
    res = rt.row_result(__import__("torch").tensor([11, 12, pad, pad]), 2, 8)
    assert (res.token_ids, res.stats.finish_reason) == ([11, 12], "stop")


def test_pad_inside_the_text_and_the_budget_still_count(rt):
    pad, (eos, *_) = rt.pad_token_id, rt.eos_token_ids
    assert rt.split_output([11, pad, 12, 13], 8) == ([11, 12, 13], "length")   # no stop: cut by the canvas
    assert rt.split_output([11, 12, 13, pad], 2) == ([11, 12], "length")       # the budget ran out first
    assert rt.split_output([11, 12, eos, 13], 8) == ([11, 12], "stop")
    assert rt.split_output([11, 12, pad, pad], 2) == ([11, 12], "length")      # stop token would be the 3rd


def test_old_rule_would_fail_here(rt):
    """The case this file pins: pads to the end, no stop token, inside the budget (was "length")."""
    pad = rt.pad_token_id
    assert pad not in rt.eos_token_ids
    assert rt.split_output([11, pad], 4)[1] == "stop"
