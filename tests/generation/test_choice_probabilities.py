"""Option probabilities of a choice constraint (``dgemma_struct.choice_scores``): the numbers are a
distribution, deterministic, independent of batching, equal to a separate one-option-at-a-time
computation, and on the embedded model they pick the label the model was trained on."""
import math

import numpy as np
import pytest
import torch

from dgemma_struct.choice_scores import (ChoiceScores, choice_probabilities, noise_token, option_paths,
                                         path_scores, score_choices, stop_ids_of)
from dgemma_struct.constraints import Choice
from dgemma_struct.errors import ChoiceError, InvalidRequestError
from dgemma_struct.repair.preparation import constraint_for

PROMPT = "Classify the sentiment as positive, negative or neutral.\nThe food was cold and the waiter was rude."
LONG = "the quick brown fox jumps over the lazy dog near the river bank while it rains all day long"


def _allowed(matcher, V: int) -> np.ndarray:
    """The matcher's next-token mask as bools, straight from llguidance (not through a walker)."""
    import llguidance.numpy as lln

    bm = lln.allocate_token_bitmask(1, V)
    lln.fill_next_token_bitmask(matcher, bm, 0)
    t = np.arange(V)
    return ((bm[0][t >> 5].astype(np.int64) >> (t & 31)) & 1).astype(bool)


def _softcap(model, logits):
    cap = model.final_logit_softcapping
    return torch.tanh(logits.float() / cap) * cap if cap else logits.float()


@torch.no_grad()
def brute_force(rt, prompt, options, estimator):
    """One option at a time, one position at a time, no batching and no cache reuse: the model is
    called the way training calls it, the masks come from a fresh llguidance matcher."""
    from transformers import DynamicCache

    model = rt.model
    c = constraint_for(Choice(options), rt)
    V, L = c.vocab_size, model.config.canvas_length
    stops = [t for t in rt.eos_token_ids if t < V]
    prompt_ids = rt.encode_prompt(prompt)
    scores = []
    for option in options:
        path = c.tokenize(option) + [stops[-1]]
        used = set(path) | set(rt.eos_token_ids) | {rt.pad_token_id}
        noise = max(t for t in range(model.config.text_config.vocab_size) if t not in used)
        m = c.new_matcher()
        total = 0.0
        for i, tok in enumerate(path):
            allowed = torch.from_numpy(_allowed(m, V))
            if estimator == "ar":
                seq = torch.tensor([prompt_ids + path[:i]])
                hidden = model.model.encoder(input_ids=seq).last_hidden_state[0, -1]
                logits = _softcap(model, model.lm_head(hidden))
            else:
                k = i // L
                ctx = torch.tensor([prompt_ids + path[:k * L]])
                block = path[k * L:(k + 1) * L]
                canvas = block + [rt.pad_token_id] * (L - len(block))
                canvas[i - k * L] = noise
                cache = DynamicCache(config=model.config.get_text_config(decoder=True))
                enc = model.model.encoder(input_ids=ctx, attention_mask=torch.ones_like(ctx, dtype=torch.bool),
                                          past_key_values=cache)
                C = ctx.shape[1]
                logits = model(past_key_values=enc.past_key_values, decoder_input_ids=torch.tensor([canvas]),
                               decoder_attention_mask=torch.ones(1, C + L, dtype=torch.bool),
                               decoder_position_ids=torch.arange(C, C + L)[None]).logits[0, i - k * L]
            logp = torch.log_softmax(logits[:V].masked_fill(~allowed, float("-inf")), dim=-1)
            if i == len(path) - 1:
                total += float(torch.logsumexp(logp[stops], dim=0))
            else:
                total += float(logp[tok])
                assert m.consume_token(tok)
        scores.append(total)
    return scores


@pytest.mark.parametrize("estimator", ["canvas", "ar"])
def test_probabilities_are_a_distribution_and_deterministic(tiny_runtime, estimator):
    options = ["positive", "negative", "neutral"]
    a = score_choices(PROMPT, options, runtime=tiny_runtime, estimator=estimator)
    b = score_choices(PROMPT, options, runtime=tiny_runtime, estimator=estimator)
    assert isinstance(a, ChoiceScores) and a.estimator == estimator
    assert list(a.probabilities) == options
    assert abs(sum(a.probabilities.values()) - 1.0) < 1e-6
    assert all(0.0 <= p <= 1.0 for p in a.probabilities.values())
    assert all(math.isfinite(s) and s <= 1e-6 for s in a.scores)   # sums of log-probabilities
    assert a.scores == b.scores and a.probabilities == b.probabilities
    assert a.best == max(options, key=a.probabilities.get)
    assert choice_probabilities(PROMPT, options, runtime=tiny_runtime, estimator=estimator) == a.probabilities
    # the softmax of the scores, as documented
    e = np.exp(np.array(a.scores) - max(a.scores))
    assert np.allclose(list(a.probabilities.values()), e / e.sum(), atol=1e-9)


@pytest.mark.parametrize("estimator", ["canvas", "ar"])
@pytest.mark.parametrize("options", [["positive", "negative"], ["yes", "yes!"], ["no", LONG]],
                         ids=["two", "shared-prefix", "longer-than-a-canvas"])
def test_matches_a_one_at_a_time_brute_force(tiny_runtime, estimator, options):
    got = score_choices(PROMPT, options, runtime=tiny_runtime, estimator=estimator)
    want = brute_force(tiny_runtime, PROMPT, options, estimator)
    assert np.allclose(got.scores, want, atol=2e-4, rtol=1e-5), (got.scores, want)
    assert got.best == options[int(np.argmax(want))]
    # the brute force's probabilities are the same distribution
    e = np.exp(np.array(want) - max(want))
    assert np.allclose(list(got.probabilities.values()), e / e.sum(), atol=1e-4)


def test_the_long_option_needs_a_second_canvas(tiny_runtime):
    c = constraint_for(Choice(["no", LONG]), tiny_runtime)
    paths = option_paths(c, ["no", LONG], stop_ids_of(c)[-1])
    L = tiny_runtime.model.config.canvas_length
    assert len(paths[1].tokens) > L   # else the test proves nothing
    canvases = -(-len(paths[1].tokens) // L)
    # one encoder and one decoder pass per canvas, whatever the number of options
    assert score_choices(PROMPT, ["no", LONG], runtime=tiny_runtime).forward_passes == 2 * canvases
    assert score_choices(PROMPT, ["no", "yes"], runtime=tiny_runtime).forward_passes == 2
    assert score_choices(PROMPT, ["no", LONG], runtime=tiny_runtime, estimator="ar").forward_passes == 1


@pytest.mark.parametrize("estimator", ["canvas", "ar"])
def test_batching_gives_the_one_at_a_time_numbers(tiny_runtime, estimator):
    options = ["positive", "negative", "neutral", "yes", "yes!", LONG]
    c = constraint_for(Choice(options), tiny_runtime)
    paths = option_paths(c, options, stop_ids_of(c)[-1])
    ids = tiny_runtime.encode_prompt(PROMPT)
    batched, _ = path_scores(tiny_runtime, ids, paths, estimator=estimator)
    single = [path_scores(tiny_runtime, ids, [p], estimator=estimator)[0][0] for p in paths]
    assert np.allclose(batched, single, atol=1e-4, rtol=1e-5), (batched, single)
    # and in another order
    rev, _ = path_scores(tiny_runtime, ids, paths[::-1], estimator=estimator)
    assert np.allclose(batched, rev[::-1], atol=1e-4, rtol=1e-5)


def test_shared_prefix_paths(tiny_runtime):
    c = constraint_for(Choice(["yes", "yes!"]), tiny_runtime)
    stop = stop_ids_of(c)[-1]
    short, longer = option_paths(c, ["yes", "yes!"], stop)
    assert short.tokens[-1] == stop == longer.tokens[-1]
    end = short.allowed[-1]
    assert all(end[t] for t in tiny_runtime.eos_token_ids)     # "yes" may end here ...
    assert int(end.sum()) > len(tiny_runtime.eos_token_ids)   # ... or continue to "yes!"
    for p in (short, longer):   # every path token is allowed where it stands
        assert all(bool(p.allowed[i, t]) for i, t in enumerate(p.tokens))
    probs = choice_probabilities("Say yes.", ["yes", "yes!"], runtime=tiny_runtime)
    assert abs(sum(probs.values()) - 1) < 1e-6 and all(0 < v < 1 for v in probs.values())


def test_noise_token_is_never_on_the_path(tiny_runtime):
    c = constraint_for(Choice(["positive", "negative"]), tiny_runtime)
    for p in option_paths(c, ["positive", "negative"], stop_ids_of(c)[-1]):
        t = noise_token(tiny_runtime, p)
        assert t not in p.tokens and t not in tiny_runtime.eos_token_ids and t != tiny_runtime.pad_token_id


@pytest.mark.parametrize("bad", [[], ["a", "a"], ["yes", "no", "yes"], ["a", 3], ["a", ""], "abc", None,
                                 {"a": 1}], ids=["empty", "dup", "dup-later", "non-str", "empty-str", "str",
                                                 "none", "dict"])
def test_bad_choice_lists_are_typed_errors(tiny_runtime, bad):
    with pytest.raises(ChoiceError):
        choice_probabilities("hi", bad, runtime=tiny_runtime)


def test_an_option_the_grammar_cannot_end_is_a_choice_error(tiny_runtime):
    c = constraint_for(Choice(["yes", "no"]), tiny_runtime)
    stop = stop_ids_of(c)[-1]
    with pytest.raises(ChoiceError, match="cannot be ended"):
        option_paths(c, ["maybe"], stop)
    with pytest.raises(ChoiceError, match="cannot be ended"):   # a prefix of an option is not complete
        option_paths(constraint_for(Choice(["yes!"]), tiny_runtime), ["yes"], stop)


def test_unknown_estimator(tiny_runtime):
    with pytest.raises(InvalidRequestError, match="estimator"):
        choice_probabilities("hi", ["a", "b"], runtime=tiny_runtime, estimator="exact")


# --- the embedded model: a family it was trained on ---------------------------------------------

def _sentiment_items():
    from dgemma_struct.training.corpus import NEGATIVE, NEUTRAL, POSITIVE

    return [(f"Classify the sentiment as positive, negative or neutral.\n{s}", label)
            for label, group in (("positive", POSITIVE), ("negative", NEGATIVE), ("neutral", NEUTRAL))
            for s in group]


LABELS = ["positive", "negative", "neutral"]


def test_embedded_model_agrees_with_its_generated_label(embedded_runtime):
    from dgemma_struct.api import generate_choice

    prompt = "Classify the sentiment as positive, negative or neutral.\nThe food was wonderful and the staff were kind."
    generated = generate_choice(prompt, LABELS, runtime=embedded_runtime, seed=0)
    for estimator in ("canvas", "ar"):
        probs = choice_probabilities(prompt, LABELS, runtime=embedded_runtime, estimator=estimator)
        assert max(probs, key=probs.get) == generated == "positive"
        assert probs["positive"] > 0.8


def test_embedded_model_ranks_the_trained_label_first(embedded_runtime):
    """Measured: canvas 17/18, AR 18/18 of the corpus's sentiment sentences (generate_choice at
    seed 0: 15/18); a random ranking would get 6."""
    hits = {"canvas": 0, "ar": 0}
    for prompt, label in _sentiment_items():
        for estimator in hits:
            scores = score_choices(prompt, LABELS, runtime=embedded_runtime, estimator=estimator)
            hits[estimator] += scores.best == label
    assert hits["canvas"] >= 16 and hits["ar"] >= 17, hits


def test_embedded_model_mostly_agrees_with_generate_choice(embedded_runtime):
    """``generate_choice`` samples, so its label at one seed is not always the most probable one.
    Measured on the 18 sentiment sentences: canvas 14/18, AR 15/18 agree with seed 0."""
    from dgemma_struct.api import generate_choice

    agree = {"canvas": 0, "ar": 0}
    for prompt, _ in _sentiment_items():
        generated = generate_choice(prompt, LABELS, runtime=embedded_runtime, seed=0)
        for estimator in agree:
            agree[estimator] += score_choices(prompt, LABELS, runtime=embedded_runtime,
                                              estimator=estimator).best == generated
    assert agree["canvas"] >= 12 and agree["ar"] >= 13, agree


def test_generate_choice_returns_every_options_probability(tiny_runtime):
    from dgemma_struct import ChoiceResult, generate_choice

    options = ["alpha", "beta", "gamma"]
    res = generate_choice("Pick one.", options, runtime=tiny_runtime, max_new_tokens=8, return_probabilities=True)
    assert isinstance(res, ChoiceResult)
    assert res.value in options
    assert res.value == generate_choice("Pick one.", options, runtime=tiny_runtime, max_new_tokens=8)
    assert list(res.probabilities) == options
    assert abs(sum(res.probabilities.values()) - 1.0) < 1e-6
    with pytest.raises(InvalidRequestError):
        generate_choice("Pick one.", options, runtime=tiny_runtime, return_probabilities="yes")
