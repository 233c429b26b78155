"""Held-out evaluation of a checkpoint (the model card's table) and the loss-curve plot.

Unconstrained, on purpose: it measures what the model does by itself, which the constraint layer
then lifts to 100% validity.

Run::

    dgemma-struct eval --model src/dgemma_struct/embedded --n 200

The report also holds ``generalise``: constrained field accuracy, exact records, forwards and
AR-fallback rate on the generalisation splits (in-distribution, held-out families, held-out
phrasings), see :mod:`dgemma_struct.training.eval_splits`.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import jsonschema

from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.engine.sampler import DiffusionSettings
from dgemma_struct.training.corpus import make_corpus

HELD_OUT_SEED = 12345  # training used seed 0; the eval split is a different draw


def field_accuracy(value: Any, fields: dict) -> float:
    if not isinstance(value, dict) or not fields:
        return 0.0
    return sum(value.get(k) == v for k, v in fields.items()) / len(fields)


def _answer_part(text: str) -> str:
    """The answer after a thought block, if any (``text`` decoded with special tokens kept)."""
    return text.split("<channel|>", 1)[1] if "<channel|>" in text else text


def call_scores(calls: list[tuple[str, dict]], expected: list[dict]) -> tuple[bool, float]:
    """(the expected tool names in order, share of expected arguments with the exact value)."""
    names_ok = [n for n, _ in calls] == [c["name"] for c in expected]
    hits = sum(args.get(k) == v for (_, args), want in zip(calls, expected) for k, v in want["arguments"].items())
    return names_ok, hits / max(1, sum(len(c["arguments"]) for c in expected))


def _tool_scores(text: str, expected: list[dict]) -> tuple[bool, bool, float]:
    """(parsed, same tool names in order, share of expected arguments with the exact value)."""
    from dgemma_struct.tools.syntax import parse_tool_calls

    try:
        calls = parse_tool_calls(text)
    except ValueError:
        return False, False, 0.0
    return (True, *call_scores(calls, expected))


def evaluate(runtime: DiffusionRuntime, n: int = 200, *, seed: int = HELD_OUT_SEED, batch_size: int = 16,
             settings: DiffusionSettings | None = None, max_new_tokens: int = 96, splits_n: int = 8) -> dict:
    """Per mode, on ``n`` held-out examples, unconstrained: valid-JSON rate, schema-valid rate,
    field accuracy and short-answer exact match (prompts without thinking), tool-call parse rate,
    tool-name and argument accuracy, well-formed thought blocks and their answers' field accuracy
    (thinking on), and TPF over every row.

    ``report["generalise"]``: the constrained evaluation of ``splits_n`` prompts per split
    (in-distribution, held-out families, held-out phrasings; diffusion and AR) of
    :func:`~dgemma_struct.training.eval_splits.evaluate_splits`; ``splits_n=0`` skips it.
    ``report["unseen_names"]``: as many short answers whose person has an invented name
    (:func:`~dgemma_struct.training.eval_splits.evaluate_unseen_names`), skipped with them."""
    from dgemma_struct.prompts import ChatPrompt

    examples = make_corpus(n, seed=seed)
    prompts = [ChatPrompt([{"role": "user", "content": e["prompt"]}], tools=e.get("tools"),
                          template_kwargs={"enable_thinking": True} if e.get("thinking") else {}) for e in examples]
    report: dict[str, Any] = {"n": n, "seed": seed, "device": str(runtime.model.device),
                              "dtype": str(runtime.model.dtype).removeprefix("torch.")}
    tok = runtime.tokenizer
    for mode in ("diffusion", "ar"):
        rows = []
        for i in range(0, n, batch_size):
            results = runtime.generate_batch(prompts[i:i + batch_size], max_new_tokens=max_new_tokens, seed=i,
                                             mode=mode, settings=settings)
            for e, r in zip(examples[i:i + batch_size], results):
                rows.append((e, r, tok.decode(r.token_ids, skip_special_tokens=False)))
        json_rows = [(e, r) for e, r, _ in rows if e["kind"] == "json" and not e["thinking"]]
        valid = schema_valid = 0
        acc = []
        for e, r in json_rows:
            try:
                v = json.loads(r.text)
                valid += 1
            except ValueError:
                acc.append(0.0)
                continue
            try:
                jsonschema.validate(v, e["schema"])
                schema_valid += 1
            except jsonschema.ValidationError:
                pass
            acc.append(field_accuracy(v, e["fields"]))
        short = [(e, r) for e, r, _ in rows if e["kind"] == "short" and not e["thinking"]]
        tools = [(_tool_scores(_answer_part(raw), e["fields"]["calls"])) for e, _, raw in rows if e["kind"] == "tool"]
        thinking = [(e, raw) for e, _, raw in rows if e["thinking"]]
        think_json = []
        for e, raw in thinking:
            if e["kind"] == "json":
                try:
                    think_json.append(field_accuracy(json.loads(_answer_part(raw)), e["fields"]))
                except ValueError:
                    think_json.append(0.0)
        report[mode] = {
            "json_prompts": len(json_rows),
            "valid_json_rate": valid / max(1, len(json_rows)),
            "schema_valid_rate": schema_valid / max(1, len(json_rows)),
            "field_accuracy": statistics.mean(acc) if acc else 0.0,
            "short_prompts": len(short),
            "short_answer_exact": sum(r.text == e["answer"] for e, r in short) / max(1, len(short)),
            "tool_prompts": len(tools),
            "tool_calls_parsed": sum(t[0] for t in tools) / max(1, len(tools)),
            "tool_names_exact": sum(t[1] for t in tools) / max(1, len(tools)),
            "tool_argument_accuracy": statistics.mean(t[2] for t in tools) if tools else 0.0,
            "thinking_prompts": len(thinking),
            "thought_block_well_formed": sum(raw.startswith("<|channel>thought\n") and "<channel|>" in raw
                                             for _, raw in thinking) / max(1, len(thinking)),
            "thinking_json_field_accuracy": statistics.mean(think_json) if think_json else 0.0,
            "mean_tokens_per_forward": statistics.mean(r.stats.tokens_per_forward for _, r, _ in rows),
            "mean_forward_passes": statistics.mean(r.stats.forward_passes for _, r, _ in rows),
            "samples": [{"prompt": e["prompt"], "expected": e["answer"], "got": raw}
                        for e, _, raw in rows if e["kind"] in ("json", "tool")][:4],
        }
    if splits_n:
        from dgemma_struct.training.eval_splits import evaluate_splits, evaluate_unseen_names

        report["generalise"] = evaluate_splits(runtime, splits_n, max_new_tokens=max(max_new_tokens, 128))
        report["unseen_names"] = evaluate_unseen_names(runtime, splits_n)
    return report


def plot_loss(log_path: Path, out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log = json.loads(Path(log_path).read_text())
    steps = [r["step"] for r in log]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
    ax.plot(steps, [r["diffusion_loss"] for r in log], label="diffusion (canvas denoising)")
    ax.plot(steps, [r["ar_loss"] for r in log], label="AR (encoder next token)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    ax.set_title("Embedded DiffusionGemma training loss")
    ax.legend()
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png)
