"""The constrained evaluation reports in-distribution, held-out families and held-out phrasings apart."""
import pytest

from dgemma_struct.testing import embedded_model_available
from dgemma_struct.training.eval_splits import evaluate_splits, leaf_accuracy
from dgemma_struct.training.generalise import EVAL_SPLITS


def test_leaf_accuracy_scores_fields_and_records():
    want = {"a": 1, "b": {"c": "x"}, "d": ["p", "q"]}
    assert leaf_accuracy(want, want, ["a", "b", "d"]) == (1.0, True)
    assert leaf_accuracy({"a": 1.0, "b": {"c": "x"}, "d": ["p"]}, want, ["a", "b", "d"]) == (1 / 3, False)
    assert leaf_accuracy({"a": 1, "b": {"c": "x"}, "d": ["p", "q"], "e": 3}, want, ["a", "b", "d", "e"])[0] == 0.75
    assert leaf_accuracy("nope", want, ["a"]) == (0.0, False)


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
def test_embedded_model_is_reported_per_split_mode_and_arm():
    from dgemma_struct.runtime import DiffusionRuntime

    rt = DiffusionRuntime.default(device="cpu")
    rep = evaluate_splits(rt, 1, modes=("diffusion",), arms=("constrained", "grounded"), max_new_tokens=64)
    assert list(rep["splits"]) == list(EVAL_SPLITS)
    for split in EVAL_SPLITS:
        for arm in ("constrained", "grounded"):
            s = rep["splits"][split]["diffusion"][arm]
            assert s["n"] == 1 and 0.0 <= s["field_accuracy"] <= 1.0 and 0.0 <= s["ar_fallback_rate"] <= 1.0
            assert {"exact_records", "median_forwards", "errors", "samples"} <= set(s)
    with pytest.raises(ValueError):
        evaluate_splits(rt, 1, arms=("free",))


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
def test_dgemma_struct_eval_report_holds_the_three_splits():
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.training.evaluate import evaluate

    rt = DiffusionRuntime.default(device="cpu")
    rep = evaluate(rt, n=1, batch_size=1, max_new_tokens=32, splits_n=1)
    assert list(rep["generalise"]["splits"]) == list(EVAL_SPLITS)
    assert set(rep["generalise"]["splits"]["held_out_families"]) == {"diffusion", "ar"}
    assert "generalise" not in evaluate(rt, n=1, batch_size=1, max_new_tokens=8, splits_n=0)


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
def test_unseen_names_are_scored_per_mode_and_family_against_the_reference():
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.training.eval_splits import evaluate_unseen_names
    from dgemma_struct.training.evaluate import evaluate
    from dgemma_struct.training.generalise import unseen_name_examples

    rt = DiffusionRuntime.default(device="cpu")
    rep = evaluate_unseen_names(rt, 4, modes=("ar",))
    assert rep["n"] == 4 and "diffusion" not in rep
    fams = [e["family"] for e in unseen_name_examples(4)]
    assert rep["families"] == sorted(set(fams))
    assert 0.0 <= rep["ar"]["exact"] <= 1.0
    # the overall rate is the per-family rates weighted by their counts
    assert rep["ar"]["exact"] == pytest.approx(sum(rep["ar"]["per_family"][f] * fams.count(f) for f in set(fams)) / 4,
                                               abs=1e-3)
    assert set(evaluate(rt, n=1, batch_size=1, max_new_tokens=8, splits_n=1)["unseen_names"]) >= {"diffusion", "ar"}


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
def test_splits_decode_with_the_given_settings_and_restore_the_runtimes(monkeypatch):
    import dataclasses

    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.scheduling import scheduler

    rt = DiffusionRuntime.default(device="cpu")
    own = rt.settings
    careful = dataclasses.replace(own, entropy_bound=0.0, confidence_threshold=0.0)
    seen = []
    real = scheduler.CanvasBatch

    def spy(*a, **kw):   # the settings each canvas batch of the evaluation decodes with
        seen.append(kw["settings"])
        return real(*a, **kw)

    monkeypatch.setattr(scheduler, "CanvasBatch", spy)
    rep = evaluate_splits(rt, 1, modes=("diffusion",), max_new_tokens=48, settings=careful, temperature=0.0)
    assert rt.settings is own and rep["settings"]["entropy_bound"] == 0.0 and rep["temperature"] == 0.0
    assert seen and all(s is careful for s in seen)
    assert evaluate_splits(rt, 1, modes=("ar",), max_new_tokens=8)["settings"] == dataclasses.asdict(own)
