"""The generalisation corpus: random schemas, many source layouts and phrasings, held-out splits.

Splits (the rule is :func:`~dgemma_struct.training.schemas.bucket`, stable across versions):

* ``"train"``: training families and training templates; also tool calls, thinking turns, short
  answers and the eight original families (:mod:`dgemma_struct.training.corpus`), so nothing the
  shipped model could do is dropped;
* ``"in_distribution"``: extraction prompts of training families and templates (fresh values);
* ``"held_out_families"``: held-out families (their fields mostly held-out names), training templates;
* ``"held_out_phrasings"``: training families, held-out templates.

In ``"train"``, a share :data:`FRESH_NAMES` of examples has its people's names (the ``words.FIRST`` /
``words.LAST`` lists) replaced by invented ones, in prompt and answer alike, so that copying a name is
learnt as copying, not as recalling one of 70 names (a prompt about "Ada" made a fine-tune forget the
answer's first token; issue #33).

Every extraction answer copies its strings and numbers verbatim from the prompt and validates
against its schema.

    >>> ex = make_generalise_corpus(2, seed=0, split="held_out_families")[0]
    >>> ex["kind"], ex["split"]
    ('json', 'held_out_families')
"""
from __future__ import annotations

import json
import random
import re
from typing import Any

from dgemma_struct.training import render, schemas, words
from dgemma_struct.training.corpus import make_example, short_answer
from dgemma_struct.training.dialect_corpus import tool_example, with_thinking

FRESH_NAMES = 0.25
_NAME_RE = re.compile(r"\b(" + "|".join(sorted(words.FIRST + words.LAST, key=len, reverse=True)) + r")\b")
SPLITS = ("train", "in_distribution", "held_out_families", "held_out_phrasings")
EVAL_SPLITS = SPLITS[1:]
EVAL_SEED = 777  # eval splits are drawn from this seed (+ the split's index); training uses its own


def _dump(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def extraction_example(r: random.Random, family: str, template: str, layout: str | None = None,
                       absent: int = 0) -> dict[str, Any]:
    """One extraction prompt: a record of ``family`` rendered into a source (in ``layout``, drawn when
    None), asked for by ``template``; ``absent`` optional fields asked for are not in the source."""
    schema, value = schemas.draw_record(r, family, absent=absent)
    noun = family.replace("_", " ")
    src = render.render_source(r, noun, value, layout)
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


def fresh_names(r: random.Random, ex: dict[str, Any]) -> dict[str, Any]:
    """``ex`` with each list name in its prompt swapped for an invented one, the same swap in its
    answer and fields (answers copy from prompts, so they stay verbatim copies).

    >>> ex = {"prompt": "Call Alice Smith.", "answer": '{"name":"Alice Smith"}', "fields": {"name": "Alice Smith"}}
    >>> out = fresh_names(random.Random(0), ex)
    >>> out["fields"]["name"] in out["prompt"] and "Alice" not in out["answer"]
    True
    """
    swap: dict[str, str] = {}
    for name in _NAME_RE.findall(ex["prompt"]):
        while name not in swap:
            new = words.invented_name(r)
            if new not in swap.values() and not _NAME_RE.fullmatch(new):
                swap[name] = new
    if not swap:
        return ex
    sub = lambda text: _NAME_RE.sub(lambda m: swap.get(m.group(0), m.group(0)), text)  # noqa: E731
    return {**ex, "prompt": sub(ex["prompt"]), "answer": sub(ex["answer"]), "fields": _map_strings(ex["fields"], sub)}


def _map_strings(value: Any, f) -> Any:
    if isinstance(value, str):
        return f(value)
    if isinstance(value, dict):
        return {k: _map_strings(v, f) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, f) for v in value]
    return value


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
        ex = fresh_names(r, ex) if r.random() < FRESH_NAMES else ex
        return {**ex, "split": split, "template": None}
    if r.random() < FRESH_NAMES:
        ex = fresh_names(r, ex)
    if r.random() < 0.08:
        ex = with_thinking(ex)
    return {**ex, "split": split}


_SHORT_RECORDS = (  # (noun, fields as (key, kind), sentences); the sentences put the number last, mostly
    ("person", (("name", "name"), ("age", "age")),
     ("{name} is {age} years old.", "{name}, age {age}.", "{name} is {age}.", "{name} turned {age} last month.",
      "Name: {name}\nAge: {age}", "{name} ({age})", "At {age}, {name} is the youngest on the team.")),
    ("person", (("name", "name"), ("city", "city"), ("age", "age")),
     ("{name} lives in {city} and is {age} years old.", "{name} ({age}) moved to {city}.",
      "{name}, from {city}, is {age}.")),
    ("product", (("product", "product"), ("price", "price")),
     ("The {product} costs {price}.", "{product}: {price}", "One {product} sells for {price} dollars.",
      "We paid {price} for the {product}.")),
    ("event", (("event", "event"), ("guests", "count")),
     ("The {event} has {guests} guests.", "{guests} people came to the {event}.", "The {event} sold {guests} seats.")),
    ("person", (("name", "name"), ("year", "year")),
     ("{name} was born in {year}.", "{name} joined in {year}.", "In {year}, {name} started here.")),
    ("player", (("name", "name"), ("points", "count")),
     ("{name} scored {points} points.", "{name} finished with {points}.", "Points for {name}: {points}")),
)
_SHORT_TYPES = {"name": {"type": "string"}, "city": {"type": "string"}, "product": {"type": "string"},
                "event": {"type": "string"}, "age": {"type": "integer"}, "count": {"type": "integer"},
                "year": {"type": "integer"}, "price": {"type": "number"}}


def short_record_example(r: random.Random) -> dict[str, Any]:
    """A two- or three-field record in one plain sentence, mostly ending in its number ("Ada Lind is
    34 years old."): the answer must close right after the number. The original corpus always had
    a field after a person's age, so with no field left the decoder wrote more digits
    (``"age": 422`` for 42; issue #33).

    >>> ex = short_record_example(random.Random(3))
    >>> ex["kind"], all(str(v) in ex["prompt"] for v in ex["fields"].values())
    ('json', True)
    """
    noun, fields, sentences = r.choice(_SHORT_RECORDS)
    f, l = words.random_name(r)
    draw = {"name": f"{f} {l}", "city": r.choice(words.CITIES), "product": r.choice(words.PRODUCTS),
            "event": r.choice(words.EVENTS), "age": r.randrange(1, 100), "count": r.randrange(1, 1000),
            "year": r.randrange(1900, 2026),
            "price": r.choice((r.randrange(1, 500), round(r.uniform(1, 900), 2)))}
    value = {key: draw[kind] for key, kind in fields}
    schema = {"type": "object", "properties": {key: dict(_SHORT_TYPES[kind]) for key, kind in fields},
              "required": list(value), "additionalProperties": False}
    src = r.choice(sentences).format(**value)
    template = r.choice(render.SHIPPED_TEMPLATES if r.random() < 0.5 else render.templates("train"))
    prompt = render.fill(template, noun, keys=render.keys_phrase(r, list(value)), src=src)
    ex = {"kind": "json", "family": f"short_{noun}", "prompt": prompt, "answer": _dump(value), "schema": schema,
          "fields": value, "tools": None, "thinking": False, "template": template, "split": "train"}
    return fresh_names(r, ex) if r.random() < 0.5 else ex


def short_record_corpus(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` :func:`short_record_example` records, deterministic in ``seed``."""
    r = random.Random(f"{seed}:short_records")
    return [short_record_example(r) for _ in range(n)]


def _training_extractions(n: int, r: random.Random, template: Any = None, **kw: Any) -> list[dict[str, Any]]:
    fams, temps = schemas.families("train"), render.templates("train")
    template = template or (lambda r: r.choice(temps))
    out = []
    for _ in range(n):
        ex = extraction_example(r, r.choice(fams), template(r), **{k: v(r) for k, v in kw.items()})
        out.append({**(fresh_names(r, ex) if r.random() < FRESH_NAMES else ex), "split": "train"})
    return out


def table_record_corpus(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` training extraction examples whose source is a Markdown table (training families and
    templates): a header row of labels over a row of values, read by column -- the layout the
    embedded model extracts worst (about a third of the fields right on every split, issue #33).

    >>> ex = table_record_corpus(1, seed=2)[0]
    >>> "|---" in ex["prompt"], ex["split"]
    (True, 'train')
    """
    return _training_extractions(n, random.Random(f"{seed}:table_records"), layout=lambda r: "table")


def absent_record_corpus(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` training extraction examples that ask for one or two optional fields the source does not
    hold: the answer leaves them out. The embedded model wrote such a field anyway, with a value taken
    from elsewhere in the source (half of its held-out-phrasing errors, issue #33).

    >>> ex = absent_record_corpus(1, seed=2)[0]
    >>> len(ex["schema"]["properties"]) > len(ex["fields"]), ex["split"]
    (True, 'train')
    """
    return _training_extractions(n, random.Random(f"{seed}:absent_records"), absent=lambda r: r.choice((1, 1, 2)))


def phrasing_record_corpus(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` training extraction examples asked for by a composed instruction
    (:func:`~dgemma_struct.training.render.composed_template`: thousands of phrasings, none sharing
    a word trigram with a held-out template). The embedded model's AR accuracy was 10 pp lower on
    held-out phrasings than on held-out families (issue #33); 29 training templates are few.

    >>> ex = phrasing_record_corpus(1, seed=2)[0]
    >>> ex["template"] in render.TEMPLATES, ex["split"]
    (False, 'train')
    """
    return _training_extractions(n, random.Random(f"{seed}:phrasing_records"), template=render.composed_template)


def make_generalise_corpus(n: int, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
    """``n`` examples of ``split``, deterministic in ``seed``."""
    r = random.Random(f"{seed}:{split}")
    return [make_generalise_example(r, split) for _ in range(n)]


def eval_examples(n_per_split: int, seed: int = EVAL_SEED) -> dict[str, list[dict[str, Any]]]:
    """``n_per_split`` extraction examples for each of :data:`EVAL_SPLITS`."""
    return {s: make_generalise_corpus(n_per_split, seed=seed, split=s) for s in EVAL_SPLITS}


NAME_FAMILIES = ("phone", "email", "date")  # the short answers whose prompt names a person


def unseen_name_examples(n: int, seed: int = EVAL_SEED + 7) -> list[dict[str, Any]]:
    """``n`` short answers (a phone number, an email, a date) whose prompt names a person by an
    invented name, the shape of the README's phone prompt ("You can call Ada on ...").

    >>> ex = unseen_name_examples(3)
    >>> [e["family"] in NAME_FAMILIES and not _NAME_RE.search(e["prompt"]) for e in ex]
    [True, True, True]
    """
    r, out = random.Random(f"{seed}:unseen_names"), []
    while len(out) < n:
        fam, prompt, answer, spec = short_answer(r)
        if fam not in NAME_FAMILIES:
            continue
        ex = fresh_names(r, {"prompt": prompt, "answer": answer, "fields": {"answer": answer}})
        if ex["prompt"] != prompt:  # a person was named, and renamed
            out.append({**ex, "kind": "short", "family": fam, "regex": spec["regex"]})
    return out
