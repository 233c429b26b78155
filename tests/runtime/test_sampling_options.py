"""Length caps, sampling options and NaN-free sampling of the runtime (tiny random model)."""
import math

import pytest
import torch

from dgemma_struct import errors
from dgemma_struct.engine.canvas import diffusion_loop
from dgemma_struct.engine.hooks import NullHook
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.engine.sampler import DiffusionSettings, sample_rows, token_entropy, top_p_filter
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.train import build_tokenizer


@pytest.fixture(scope="module")
def runtime(tiny_model):
    corpus = make_corpus(200, seed=5)
    tok = build_tokenizer([e["prompt"] for e in corpus] + [e["answer"] for e in corpus], vocab_size=512)
    rt = DiffusionRuntime(tiny_model, tok, name="tiny")
    rt.settings = DiffusionSettings(max_denoising_steps=6, entropy_bound=0.5, confidence_threshold=0.5)
    return rt


def test_split_caps_at_the_budget(runtime):
    eos, pad = runtime.eos_token_ids[0], runtime.pad_token_id
    assert runtime.split_output([7, 8, eos, 9], 5) == ([7, 8], "stop")
    assert runtime.split_output([7, 8, 9, 10, eos], 2) == ([7, 8], "length")   # EOS after the budget: cut
    assert runtime.split_output([7, 8, eos], 2) == ([7, 8], "length")          # the stop token counts
    assert runtime.split_output([7, eos], 2) == ([7], "stop")
    assert runtime.split_output([7, pad, 8], 2) == ([7, 8], "length")


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
@pytest.mark.parametrize("cap", [1, 3])
def test_free_text_is_capped_at_max_new_tokens(runtime, mode, cap):
    # the canvas is 16 positions: before the fix a 1-token budget returned up to 16 tokens as "stop"
    for seed in range(3):
        res = runtime.generate("hello there", max_new_tokens=cap, seed=seed, mode=mode)
        assert len(res.token_ids) <= cap and res.stats.generated_tokens == len(res.token_ids)
        assert res.stats.finish_reason in ("stop", "length")
        if len(res.token_ids) == cap:
            assert res.stats.finish_reason == "length"


def test_stream_is_capped_and_reports_the_finish_reason(runtime):
    events = list(runtime.stream("hello there", max_new_tokens=2, seed=0, drafts=True))
    assert all(len(e.token_ids) <= 2 for e in events)
    last = events[-1]
    assert last.done and last.finish_reason in ("stop", "length") and last.stats is not None
    assert last.finish_reason == last.stats.finish_reason
    ref = runtime.generate("hello there", max_new_tokens=2, seed=0)
    assert last.token_ids == ref.token_ids and last.finish_reason == ref.stats.finish_reason


def test_temperature_one_is_the_checkpoint_schedule(runtime):
    a = runtime.generate("hello", max_new_tokens=20, seed=4)
    b = runtime.generate("hello", max_new_tokens=20, seed=4, temperature=1.0)
    assert a.token_ids == b.token_ids


def test_temperature_and_top_p_change_the_sampling(runtime):
    base = [runtime.generate("hello", max_new_tokens=20, seed=s).token_ids for s in range(3)]
    hot = [runtime.generate("hello", max_new_tokens=20, seed=s, temperature=3.0).token_ids for s in range(3)]
    assert base != hot
    # AR: temperature 0 and None are greedy; sampling at t > 0 is reproducible by seed and differs
    greedy = runtime.generate("hello", max_new_tokens=10, mode="ar").token_ids
    assert runtime.generate("hello", max_new_tokens=10, mode="ar", temperature=0).token_ids == greedy
    sampled = [runtime.generate("hello", max_new_tokens=10, mode="ar", temperature=1.5, seed=s).token_ids
               for s in range(3)]
    assert sampled != [greedy] * 3
    assert runtime.generate("hello", max_new_tokens=10, mode="ar", temperature=1.5, seed=1).token_ids == sampled[1]
    # a nucleus of one token is the argmax: top_p -> 0 samples greedily
    for s in range(2):
        tiny = runtime.generate("hello", max_new_tokens=10, mode="ar", temperature=1.5, top_p=1e-9, seed=s)
        assert tiny.token_ids == greedy


def test_per_row_seeds_make_rows_independent_of_their_batch(runtime):
    prompts = ["hello", "a longer prompt here"]
    batch = runtime.generate_batch(prompts, max_new_tokens=20, seed=[5, 9])
    alone = [runtime.generate_batch([p], max_new_tokens=20, seed=[s])[0] for p, s in zip(prompts, [5, 9])]
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
    assert [r.stats.seed for r in batch] == [5, 9]


@pytest.mark.parametrize("kwargs", [
    dict(seed=-1), dict(seed=1.5), dict(seed="7"), dict(seed=True), dict(seed=2**64),
    dict(temperature=-0.1), dict(temperature=float("nan")), dict(temperature=float("inf")), dict(temperature="hot"),
    dict(temperature=1e6), dict(top_p=0), dict(top_p=1.5), dict(top_p=float("nan")), dict(max_new_tokens=2.0),
    dict(settings={"t_min": 1}),
])
def test_bad_sampling_arguments_are_typed(runtime, kwargs):
    with pytest.raises(errors.InvalidRequestError):
        runtime.generate("hello", **kwargs)


def test_bad_token_ids_are_typed(runtime):
    for encoded in ([[1, 2, 10**9]], [[-1]], ["abc"], [[]], "abc"):
        with pytest.raises(errors.InvalidRequestError):
            runtime.generate_ids(encoded, max_new_tokens=4)


def test_entropy_is_nan_free_and_equals_categorical():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 300) * 4
    x[0, 1, :] = float("-inf")
    x[0, 1, 3] = 0.0
    ref = torch.distributions.Categorical(logits=x).entropy()
    assert torch.equal(token_entropy(x), ref)
    x[1, 2, :] = float("-inf")  # no allowed token: Categorical would raise, we give 0
    ent = token_entropy(x)
    assert not torch.isnan(ent).any() and ent[1, 2] == 0


def test_sample_rows_skips_dead_positions_and_filters_top_p():
    logits = torch.full((1, 3, 10), float("-inf"))
    logits[0, 0, 4] = 0.0
    logits[0, 2, :] = torch.arange(10.0)
    gens = [torch.Generator().manual_seed(0)]
    out = sample_rows(logits, fill=torch.full((1, 3), -1), where=torch.ones(1, 3, dtype=torch.bool),
                      generators=gens, top_p=1e-9)
    assert out.tolist() == [[4, -1, 9]]
    kept = top_p_filter(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])), 0.75)
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]


def test_a_hook_that_empties_a_position_never_gives_nan(tiny_model):
    class Empty(NullHook):
        def mask_logits(self, view):
            view.logits[:, 3, :] = float("-inf")

    ids = torch.randint(5, 512, (2, 6), generator=torch.Generator().manual_seed(2))
    s = DiffusionSettings(max_denoising_steps=4, entropy_bound=0.5, confidence_threshold=0.5)
    for generators in (None, [torch.Generator().manual_seed(i) for i in range(2)]):
        torch.manual_seed(0)
        out = diffusion_loop(tiny_model, ids, torch.ones_like(ids), max_new_tokens=16, settings=s,
                             eos_token_ids=[1, 6, 14], pad_token_id=0, hook=Empty(), generators=generators)
        assert out.sequences.shape == (2, 22) and out.sequences.min() >= 0


@pytest.mark.parametrize("prompt", ["\ud800 lone surrogate", [{"role": "user", "content": "ok \udfff"}],
                                    [{"role": "user", "content": 5}], [{"role": "user"}], [{"content": "x"}],
                                    [{"role": 3, "content": "x"}], ["x"], [],
                                    [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]])
def test_bad_prompts_are_typed(runtime, prompt):
    with pytest.raises(errors.InvalidRequestError):
        runtime.encode_prompt(prompt)


def test_text_content_parts_are_joined(runtime):
    parts = [{"role": "user", "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]}]
    assert runtime.encode_prompt(parts) == runtime.encode_prompt("hello")
