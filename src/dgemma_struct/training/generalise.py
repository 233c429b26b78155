"""The generalisation corpus: random schemas, many source layouts and phrasings, held-out splits.

Splits (the rule is :func:`~dgemma_struct.training.schemas.bucket`, stable across versions):

* ``"train"``: training families and training templates; also tool calls, thinking turns, short
  answers and the eight original families (:mod:`dgemma_struct.training.corpus`), so nothing the
  shipped model could do is dropped;
* ``"in_distribution"``: extraction prompts of training families and templates (fresh values);
* ``"held_out_families"``: held-out families (their fields mostly held-out names), training templates;
* ``"held_out_phrasings"``: training families, held-out templates.

Every extraction answer copies its strings and numbers verbatim from the prompt and validates
against its schema.

    >>> ex = make_generalise_corpus(2, seed=0, split="held_out_families")[0]
    >>> ex["kind"], ex["split"]
    ('json', 'held_out_families')
"""
from __future__ import annotations

import json
import random
from typing import Any

from dgemma_struct.training import render, schemas, words
from dgemma_struct.training.corpus import make_example
from dgemma_struct.training.dialect_corpus import tool_example, with_thinking

SPLITS = ("train", "in_distribution", "held_out_families", "held_out_phrasings")
EVAL_SPLITS = SPLITS[1:]
EVAL_SEED = 777  # eval splits are drawn from this seed (+ the split's index); training uses its own


def _dump(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def extraction_example(r: random.Random, family: str, template: str) -> dict[str, Any]:
    """One extraction prompt: a record of ``family`` rendered into a source, asked for by ``template``."""
    schema, value = schemas.draw_record(r, family)
    noun = family.replace("_", " ")
    src = render.render_source(r, noun, value)
    prompt = render.fill(template, noun, keys=render.keys_phrase(r, list(schema["properties"])), src=src)
    return {"kind": "json", "family": family, "prompt": prompt, "answer": _dump(value), "schema": schema,
            "fields": value, "tools": None, "thinking": False, "template": template}


def classify_example(r: random.Random, template: str) -> dict[str, Any]:
    """A sentiment or topic sentence and its label, asked for as JSON under a drawn key."""
    if r.random() < 0.5:
        what, options = "sentiment", ["positive", "negative", "neutral"]
        lab = r.choice(options)
        src = r.choice({"positive": words.POSITIVE, "negative": words.NEGATIVE, "neutral": words.NEUTRAL}[lab])
    else:
        what, options = "topic", list(words.TOPICS)
        lab = r.choice(options)
        src = r.choice(words.TOPICS[lab])
    key = r.choice((what, "label", "category", "class"))
    opts = ", ".join(options[:-1]) + " or " + options[-1]
    schema = {"type": "object", "properties": {key: {"enum": options}}, "required": [key],
              "additionalProperties": False}
    return {"kind": "classify", "family": what, "prompt": template.format(what=what, options=opts, src=src),
            "answer": _dump({key: lab}), "schema": schema, "fields": {key: lab}, "tools": None, "thinking": False,
            "template": template}


def make_generalise_example(r: random.Random, split: str = "train") -> dict[str, Any]:
    """One example of ``split`` (see the module docstring)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    fams = schemas.families("held_out" if split == "held_out_families" else "train")
    temps = render.templates("held_out" if split == "held_out_phrasings" else "train")
    if split != "train":
        ex = extraction_example(r, r.choice(fams), r.choice(temps))
        return {**ex, "split": split}
    u = r.random()
    if u < 0.58:
        ex = extraction_example(r, r.choice(fams), r.choice(temps))
    elif u < 0.66:
        ex = classify_example(r, r.choice(render.templates("train", render.CLASSIFY_TEMPLATES)))
    elif u < 0.76:
        ex = tool_example(r)
    else:
        ex = make_example(r)  # the original corpus: families, short answers, tools, thinking
        return {**ex, "split": split, "template": None}
    if r.random() < 0.08:
        ex = with_thinking(ex)
    return {**ex, "split": split}


def make_generalise_corpus(n: int, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """``n`` examples of ``split``, deterministic in ``seed``."""
    r = random.Random(f"{seed}:{split}")
    return [make_generalise_example(r, split) for _ in range(n)]


def eval_examples(n_per_split: int, seed: int = EVAL_SEED) -> dict[str, list[dict[str, Any]]]:
    """``n_per_split`` extraction examples for each of :data:`EVAL_SPLITS`."""
    return {s: make_generalise_corpus(n_per_split, seed=seed, split=s) for s in EVAL_SPLITS}
