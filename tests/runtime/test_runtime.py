"""DiffusionRuntime on tiny random models: both modes, stats, streaming, batches and bad input."""
import json

import pytest
import torch

from dgemma_struct import errors
from dgemma_struct.engine.autoregressive import autoregressive_loop
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.engine.sampler import DiffusionSettings
from dgemma_struct.training.corpus import make_corpus
from dgemma_struct.training.train import build_tokenizer


@pytest.fixture(scope="module")
def runtime(tiny_model):
    corpus = make_corpus(200, seed=5)
    tok = build_tokenizer([e["prompt"] for e in corpus] + [e["answer"] for e in corpus], vocab_size=512)
    rt = DiffusionRuntime(tiny_model, tok, name="tiny")
    rt.settings = DiffusionSettings(max_denoising_steps=6, entropy_bound=0.5, confidence_threshold=0.5)
    return rt


@pytest.mark.parametrize("mode", ["diffusion", "ar"])
def test_generate_returns_text_and_stats(runtime, mode):
    res = runtime.generate("Give the phone number.\nCall 555-123-4567.", max_new_tokens=24, seed=0, mode=mode)
    assert isinstance(res.text, str) and len(res.token_ids) <= 24
    s = res.stats
    assert s.mode == mode and s.forward_passes > 0 and s.wall_s > 0
    assert 0 < s.model_s <= s.wall_s
    if mode == "diffusion":
        assert s.canvases >= 1 and s.forward_passes <= s.canvases * 6
        assert s.tokens_per_forward > 0


def test_seed_makes_runs_repeatable(runtime):
    a = runtime.generate("hello", max_new_tokens=16, seed=11)
    b = runtime.generate("hello", max_new_tokens=16, seed=11)
    assert a.token_ids == b.token_ids


def test_batch_with_left_padding_matches_single_rows_in_ar(runtime):
    prompts = ["short", "a much longer prompt with many more words in it"]
    batch = runtime.generate_batch(prompts, max_new_tokens=8, mode="ar")
    singles = [runtime.generate(p, max_new_tokens=8, mode="ar") for p in prompts]
    assert singles[1].token_ids == batch[1].token_ids  # the longest row has no padding
    assert singles[0].token_ids == batch[0].token_ids  # the left-padded row: masks and positions


def test_ar_cache_matches_full_recompute(runtime):
    """Greedy AR with the KV cache equals argmax of a cache-free forward over the whole sequence."""
    model = runtime.model
    ids = torch.tensor([runtime.encode_prompt("What date is mentioned?")])
    out = autoregressive_loop(model, ids, torch.ones_like(ids), max_new_tokens=6, eos_token_ids=[-1],
                              pad_token_id=0)
    seq = out.sequences
    with torch.no_grad():
        hidden = model.model.encoder(input_ids=seq[:, :-1]).last_hidden_state
        logits = torch.tanh(model.lm_head(hidden).float() / 30.0) * 30.0
    expect = logits.argmax(-1)[0, ids.shape[1] - 1:]
    assert seq[0, ids.shape[1]:].tolist() == expect.tolist()


def test_stream_yields_committed_canvases(runtime):
    events = list(runtime.stream("hello there", max_new_tokens=40, seed=0, drafts=True))
    assert events[-1].done
    committed = [e for e in events if not e.draft and not e.done]
    assert len(committed) >= 1 and any(e.draft for e in events)


def test_chat_messages_use_the_template(runtime):
    ids = runtime.encode_prompt([{"role": "user", "content": "hi"}])
    assert ids[0] == runtime.tokenizer.bos_token_id
    assert runtime.encode_prompt("hi") == ids


@pytest.mark.parametrize("kwargs,exc", [
    (dict(max_new_tokens=0), errors.InvalidRequestError),
    (dict(max_new_tokens=-3), errors.InvalidRequestError),
    (dict(mode="beam"), errors.InvalidRequestError),
    (dict(max_new_tokens=10_000), errors.PromptTooLongError),
])
def test_bad_requests_raise_typed_errors(runtime, kwargs, exc):
    with pytest.raises(exc):
        runtime.generate("hello", **kwargs)


def test_bad_prompt_type(runtime):
    with pytest.raises(errors.InvalidRequestError):
        runtime.generate(42)


def test_not_a_diffusiongemma_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(errors.ModelLoadError, match="not a DiffusionGemma"):
        DiffusionRuntime.from_pretrained(tmp_path)
    with pytest.raises(errors.ModelLoadError):
        DiffusionRuntime.from_pretrained(tmp_path / "missing")


def test_save_and_reload_roundtrip(runtime, tmp_path):
    runtime.model.save_pretrained(tmp_path)
    runtime.tokenizer.save_pretrained(tmp_path)
    rt2 = DiffusionRuntime.from_pretrained(tmp_path)
    assert rt2.generate("hi", max_new_tokens=8, mode="ar").token_ids == runtime.generate("hi", max_new_tokens=8,
                                                                                          mode="ar").token_ids


def test_a_prompt_is_templated_once_per_runtime(monkeypatch):
    """The server counts a prompt's tokens (usage, context checks) and then generates from it: the
    chat template runs once; each call gets its own list; unhashable-by-JSON prompts still encode."""
    from dgemma_struct import ChatPrompt
    from dgemma_struct.testing import tiny_runtime

    rt = tiny_runtime()
    calls = []
    real = rt._encode
    monkeypatch.setattr(rt, "_encode", lambda p: (calls.append(p), real(p))[1])
    msgs = [{"role": "user", "content": "templated once? \U0001F600 " + str(id(calls))}]
    first = rt.encode_prompt(msgs)
    first.append(-1)                                  # the caller's copy: the memo is not touched
    assert rt.encode_prompt(list(msgs)) == first[:-1] == real(msgs)
    assert len(calls) == 1
    rt.encode_prompt(ChatPrompt(messages=msgs))       # not memoised, still encoded
    assert len(calls) == 2
    with pytest.raises(Exception):
        rt.encode_prompt(12)
