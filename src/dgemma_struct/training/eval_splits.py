"""Constrained evaluation on the generalisation splits: in-distribution, held-out families, held-out phrasings.

Each split's extraction prompts (:func:`~dgemma_struct.training.generalise.eval_examples`) are
answered with the constrained API (every output valid by construction, or a typed error counted
as a failure) in each mode, optionally also grounded (strings and numbers spans of the prompt).
Per split, mode and arm: field accuracy (share of leaf fields equal to the reference; an optional
field the reference leaves out counts when the output leaves it out too), exact records, errors,
median and mean forwards, repairs per request and the AR-fallback rate.

    >>> leaf_accuracy({"a": 1, "b": {"c": "x"}}, {"a": 1, "b": {"c": "y"}}, ["a", "b", "z"])
    (0.6666666666666666, False)
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Mapping, Sequence

from dgemma_struct.training.generalise import EVAL_SEED, EVAL_SPLITS, eval_examples, unseen_name_examples
from dgemma_struct.training.render import flatten

ARMS = ("constrained", "grounded")


def leaf_accuracy(got: Any, expected: dict, keys: Sequence[str]) -> tuple[float, bool]:
    """(share of the record's leaf fields right, whole record right). ``keys``: the schema's
    top-level properties; one the reference leaves out is right when ``got`` leaves it out."""
    if not isinstance(got, dict):
        return 0.0, False
    want = dict(flatten(expected))
    have = dict(flatten(got))
    absent = [k for k in keys if k not in expected]
    hits = sum(have.get(k, object()) == v and type(have.get(k)) is type(v) for k, v in want.items())
    hits += sum(k not in got for k in absent)
    return hits / max(1, len(want) + len(absent)), got == expected


def _run(runtime: Any, examples: list[dict], mode: str, arm: str, max_new_tokens: int, batch_size: int,
         temperature: float | None = None, options: Mapping[str, Any] | None = None) -> list:
    from dgemma_struct.api import generate_batch
    from dgemma_struct.errors import GroundingError
    from dgemma_struct.grounding import generate_grounded_batch

    knobs = dict(options or {})
    out: list = []
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        prompts = [e["prompt"] for e in chunk]
        specs = [e["schema"] for e in chunk]
        seeds = list(range(i, i + len(chunk)))
        if arm == "grounded":
            # one seed for the chunk: generate_grounded_batch does not drop the seeds of rows it refuses
            res = generate_grounded_batch(prompts, specs, ground="all", runtime=runtime, max_new_tokens=max_new_tokens,
                                          return_exceptions=True, mode=mode, seed=i, temperature=temperature,
                                          **knobs)
            # a schema with nothing to ground (only booleans / enums) is served constrained, as a user would
            redo = [j for j, x in enumerate(res) if isinstance(x, GroundingError) and "nothing to ground" in str(x)]
            if redo:
                again = generate_batch([prompts[j] for j in redo], [specs[j] for j in redo], runtime=runtime,
                                       max_new_tokens=max_new_tokens, return_exceptions=True, mode=mode,
                                       seed=[seeds[j] for j in redo], temperature=temperature, **knobs)
                for j, x in zip(redo, again):
                    res[j] = x
            out += res
        else:
            out += generate_batch(prompts, specs, runtime=runtime, max_new_tokens=max_new_tokens,
                                  return_exceptions=True, mode=mode, seed=seeds, temperature=temperature,
                                  **knobs)
    return out


def _summary(examples: list[dict], results: list, wall: float) -> dict[str, Any]:
    from dgemma_struct.errors import DgemmaStructError

    acc, exact, fwd, repairs, fallback, errors = [], [], [], [], [], 0
    for e, res in zip(examples, results):
        if isinstance(res, DgemmaStructError):
            errors += 1
            acc.append(0.0)
            exact.append(False)
            stats = getattr(res, "stats", None)
        else:
            a, x = leaf_accuracy(res.value, e["fields"], list(e["schema"]["properties"]))
            acc.append(a)
            exact.append(x)
            stats = res.stats
        if stats is not None:
            fwd.append(stats.forward_passes)
            repairs.append(stats.repairs)
            fallback.append(bool(stats.fallback))
    n = len(examples)
    return {"n": n, "field_accuracy": round(statistics.mean(acc), 4) if acc else 0.0,
            "exact_records": round(sum(exact) / max(1, n), 4), "errors": errors,
            "median_forwards": statistics.median(fwd) if fwd else None,
            "mean_forwards": round(statistics.mean(fwd), 2) if fwd else None,
            "repairs_per_request": round(statistics.mean(repairs), 3) if repairs else None,
            "ar_fallback_rate": round(sum(fallback) / max(1, len(fallback)), 4),
            "seconds_per_request": round(wall / max(1, n), 3),
            "samples": [{"prompt": e["prompt"], "expected": e["answer"],
                         "got": getattr(r, "text", type(r).__name__)} for e, r in zip(examples[:2], results[:2])]}


def evaluate_splits(runtime: Any, n_per_split: int = 8, *, modes: Sequence[str] = ("diffusion", "ar"),
                    arms: Sequence[str] = ("constrained",), seed: int = EVAL_SEED, max_new_tokens: int = 128,
                    batch_size: int = 16, settings: Any = None, temperature: float | None = None,
                    options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{split: {mode: {arm: summary}}}`` over :data:`EVAL_SPLITS`, plus the settings used.
    ``settings``: the :class:`~dgemma_struct.engine.sampler.DiffusionSettings` to decode with (the
    runtime's own are restored afterwards); ``temperature``: as in :func:`~dgemma_struct.api.generate`
    (0 = greedy); ``options``: more of ``generate``'s keywords for every request (``{"canonical_tokens":
    False}``)."""
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise ValueError(f"unknown arms {sorted(unknown)}; choose from {ARMS}")
    if settings is not None:
        own = runtime.settings
        runtime.settings = settings
        try:
            return evaluate_splits(runtime, n_per_split, modes=modes, arms=arms, seed=seed, max_new_tokens=max_new_tokens,
                                   batch_size=batch_size, temperature=temperature, options=options)
        finally:
            runtime.settings = own
    data = eval_examples(n_per_split, seed=seed)
    report: dict[str, Any] = {"n_per_split": n_per_split, "seed": seed, "max_new_tokens": max_new_tokens,
                              "settings": dataclasses.asdict(runtime.settings), "temperature": temperature,
                              "options": dict(options or {}), "splits": {}}
    for split in EVAL_SPLITS:
        per_mode: dict[str, Any] = {}
        for mode in modes:
            per_mode[mode] = {}
            for arm in arms:
                t0 = time.perf_counter()
                results = _run(runtime, data[split], mode, arm, max_new_tokens, batch_size, temperature, options)
                per_mode[mode][arm] = _summary(data[split], results, time.perf_counter() - t0)
        report["splits"][split] = per_mode
    return report


def evaluate_unseen_names(runtime: Any, n: int = 30, *, modes: Sequence[str] = ("diffusion", "ar"),
                          batch_size: int = 16) -> dict[str, Any]:
    """Exact-answer rate per mode on :func:`~dgemma_struct.training.generalise.unseen_name_examples`,
    answered with the regex API: does the model copy a phone number, email or date when the person
    in the prompt has a name it never saw? (The name lists are small; a fine-tune that copied only
    after listed names lost the README's "call Ada" answer.)"""
    from dgemma_struct.constraints.specs import Regex

    examples = unseen_name_examples(n)
    asked = [{"prompt": e["prompt"], "schema": Regex(e["regex"])} for e in examples]
    report: dict[str, Any] = {"n": n, "families": sorted({e["family"] for e in examples})}
    for mode in modes:
        got = _run(runtime, asked, mode, "constrained", 32, batch_size)
        hits = [getattr(g, "value", None) == e["answer"] for e, g in zip(examples, got)]
        report[mode] = {"exact": round(sum(hits) / max(1, n), 4),
                        "per_family": {f: round(statistics.mean(h for h, e in zip(hits, examples) if e["family"] == f), 4)
                                       for f in report["families"]}}
    return report
