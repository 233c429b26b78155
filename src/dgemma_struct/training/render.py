"""Sources and instructions for the generalisation corpus: a record's values written into text.

Five source layouts (a sentence, a short paragraph with a distractor, ``key: value`` lines, a
Markdown table, a bulleted list), field labels written as the key, as words or in Title Case, and
the fields in a shuffled order. Every string and number of the answer is written verbatim in the
source (booleans are written ``yes``/``no``/``true``/``false``). :data:`TEMPLATES` are the
extraction instructions; :data:`CLASSIFY_TEMPLATES` ask for a label as JSON. A template is held
out when :func:`~dgemma_struct.training.schemas.bucket` of its text (4 parts) is 0.

    >>> import random
    >>> src = render_source(random.Random(1), "pet", {"name": "Rex", "age": 4})
    >>> "Rex" in src and "4" in src
    True
"""
from __future__ import annotations

import random
import re
from typing import Any

from dgemma_struct.training.schemas import bucket, split_words

TEMPLATES = (
    "Extract the {keys} as JSON.\n{src}",
    "{src}\nReturn a JSON object with {keys}.",
    "Convert to JSON with fields {keys}: {src}",
    "Read the text and give {keys} in JSON.\nText: {src}",
    "{src}\n\nReturn the {noun}'s {keys} as JSON.",
    "Here is a {noun} record:\n{src}\nGive me a JSON object with {keys}.",
    "Parse the following {noun} into JSON ({keys}).\n\n{src}",
    "Turn this {noun} into structured data.\n{src}",
    "I need the {keys} from this {noun}, as JSON please.\n{src}",
    "What are the {keys}? Reply with JSON only.\n{src}",
    "{src}\nQ: What is the {keys} of the {noun}? Answer as JSON.",
    "Read the {noun} details and output JSON.\n---\n{src}\n---",
    "From the text, pull out {keys}.\nText: {src}",
    "Given: {src}\nOutput a JSON object containing {keys}.",
    "Please convert the {noun} below to JSON.\n{src}",
    "Summarise this {noun} as a JSON record with the fields {keys}.\n{src}",
    "Extract structured fields ({keys}) from:\n\"\"\"\n{src}\n\"\"\"",
    "Which {keys} does the text give? Answer in JSON.\n{src}",
    "Return {keys} as JSON.\n\nInput:\n{src}",
    "Document:\n{src}\n\nTask: extract {keys}. Respond with JSON.",
    "Capture the {noun} information in JSON form.\n{src}",
    "{src}\n\nJSON with {keys}:",
    "Record this {noun}: {src}",
    "Build a {noun} object from this note: {src}",
    "Can you extract the {noun} data? Fields: {keys}.\n{src}",
    "Using only the text, fill in {keys}.\n{src}",
    "Text: {src}\nExtract: {keys}\nFormat: JSON",
    "Give the {noun} as JSON.\n{src}",
    "Identify the {keys} in the following and return them as a JSON object.\n{src}",
    "Pull the {noun} fields out of this message and answer with JSON.\nMessage: {src}",
    "Structured output please: {keys}.\n{src}",
    "My {noun}:\n{src}\nCould you write it as JSON with {keys}?",
    "Fill the {noun} form from the text below.\n{src}",
    "{src}\nWhat {keys} are mentioned? Use JSON.",
    "Return only JSON. Fields: {keys}. Source: {src}",
    "Look at this {noun} and tell me its {keys} in JSON.\n{src}",
)
CLASSIFY_TEMPLATES = (
    "Classify the {what} of this text and return it as JSON.\n{src}",
    "{src}\nWhat is the {what}? Answer with a JSON object.",
    "Label the {what} ({options}). Respond in JSON.\nText: {src}",
    "Give the {what} of the following as JSON: {src}",
    "Is this {options}? Return the {what} as JSON.\n{src}",
    "Text: {src}\nReturn JSON with the {what}.",
    "Read the message and classify its {what}. JSON only.\nMessage: {src}",
    "Which {what} fits best: {options}? Answer in JSON.\n{src}",
)
LAYOUTS = ("sentence", "paragraph", "lines", "table", "list")


SHIPPED_TEMPLATES = TEMPLATES[:4]  # the original corpus's phrasings: always in training


def held_out_template(template: str) -> bool:
    return template not in SHIPPED_TEMPLATES and bucket("template", template, 4) == 0


def templates(split: str, pool: tuple[str, ...] = TEMPLATES) -> list[str]:
    """The templates of ``split``: ``"train"`` or ``"held_out"``."""
    return [t for t in pool if held_out_template(t) == (split == "held_out")]


# Parts of composed instructions (:func:`composed_template`), training only: a request, what it asks
# for, the output format, where the source goes. None of them is a held-out template's wording.
_ASK = ("Extract", "Get", "Pull out", "List", "Find", "Give", "Provide", "Write down", "Collect", "Report",
        "Copy out", "Note", "Take", "Fetch", "Gather", "Produce")
_WHAT = ("the {keys}", "{keys}", "the {noun}'s {keys}", "the fields {keys}", "the {noun} fields {keys}",
         "each value for {keys}", "these fields: {keys}")
_AS = ("as JSON", "in JSON", "in JSON format", "as a JSON record", "into JSON", "as one JSON object", "using JSON",
       "in a JSON object", "as a JSON dict", "formatted as JSON")
_LEAD = ("", "", "Please ", "Kindly ", "Now ", "Quick one: ", "Task: ")
_TAIL = ("", "", " JSON only.", " No extra text.", " Nothing else.", " Thanks!", " Keep the values verbatim.")
_ASKING = ("Can you {ask} {what} {as}?", "Could you {ask} {what} {as}?", "Would you {ask} {what} {as}?",
           "{lead}{Ask} {what} {as}.", "{lead}{Ask} {what} {as}.", "{lead}{Ask} {what} from the {noun} {as}.",
           "{lead}{Ask} {what} {as} from the text.")
_SOURCE = ("{src}", "{src}", "Text: {src}", "Source: {src}", "Note: {src}", "Record: {src}", '"{src}"',
           "Data:\n{src}", "Details: {src}", "<<{src}>>", "The {noun}:\n{src}")
_SEPS = ("\n", "\n", "\n\n", " ")


def _trigrams(template: str) -> set[tuple[str, ...]]:
    ws = re.findall(r"\{\w+\}|\w+", template.lower())
    return {tuple(ws[i:i + 3]) for i in range(len(ws) - 2)}


#: word trigrams of the held-out extraction templates: no composed instruction holds one
HELD_OUT_TRIGRAMS = set().union(*(_trigrams(t) for t in templates("held_out")))


def composed_template(r: random.Random) -> str:
    """An extraction instruction composed from parts (request, fields, format, source), for
    training on more phrasings than :data:`TEMPLATES` holds. Decontaminated: a draw that shares
    a word trigram with a held-out template (or is one of :data:`TEMPLATES`) is drawn again, so
    the held-out-phrasings split stays unseen.

    >>> t = composed_template(random.Random(0))
    >>> t.count("{src}"), not _trigrams(t) & HELD_OUT_TRIGRAMS
    (1, True)
    """
    while True:
        ask, lead, what, asking = r.choice(_ASK), r.choice(_LEAD), r.choice(_WHAT), r.choice(_ASKING)
        if "{noun}" in what:
            asking = asking.replace(" from the {noun}", "")
        body = asking.format(ask=ask.lower(), Ask=ask if lead.endswith(": ") or not lead else ask.lower(), lead=lead,
                             what=what, noun="{noun}", keys="{keys}", src="{src}", **{"as": r.choice(_AS)})
        body += r.choice(_TAIL)
        src, sep = r.choice(_SOURCE), r.choice(_SEPS)
        t = body + sep + src if r.random() < 0.7 else src + sep + body
        if t not in TEMPLATES and not _trigrams(t) & HELD_OUT_TRIGRAMS:
            return t


def label(r: random.Random, name: str) -> str:
    """How the source names a field: the key itself, its words, or its words in Title Case."""
    ws = split_words(name) or [name]
    return r.choice((name, " ".join(ws), " ".join(ws), " ".join(w.capitalize() for w in ws)))


def _text(r: random.Random, v: Any, sep: str = ", ") -> str:
    if isinstance(v, bool):
        return r.choice(("yes", "true")) if v else r.choice(("no", "false"))
    if isinstance(v, list):
        return sep.join(_text(r, x) for x in v[:-1]) + (" and " if sep == ", " and len(v) > 1 else sep if len(v) > 1
                                                        else "") + _text(r, v[-1])
    return str(v)


def flatten(value: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(field path words, leaf value) pairs; a nested object's fields are named ``parent field``."""
    out = []
    for k, v in value.items():
        if isinstance(v, dict):
            out += flatten(v, f"{prefix}{k} ")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _sentence(r: random.Random, noun: str, pairs: list[tuple[str, str]]) -> str:
    parts = [r.choice(("its {l} is {v}", "the {l} is {v}", "{l} {v}", "with {l} {v}", "{l}: {v}")).format(l=lab, v=v)
             for lab, v in pairs]
    body = ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    return r.choice(("This {n}: {b}.", "For the {n}, {b}.", "The {n} record says {b}.", "{B}.", "{A} {n} where {b}."))\
        .format(n=noun, b=body, B=body[0].upper() + body[1:], A=article(noun).capitalize())


def article(noun: str) -> str:
    """``"an"`` before a vowel, else ``"a"``."""
    return "an" if noun[:1].lower() in "aeiou" else "a"


def fill(template: str, noun: str, **kw: str) -> str:
    """``template`` with ``a {noun}`` spelled ``an {noun}`` where needed, then formatted."""
    return template.replace("a {noun}", article(noun) + " {noun}").format(noun=noun, **kw)


def render_source(r: random.Random, noun: str, value: dict, layout: str | None = None) -> str:
    """``value`` written as text about a ``noun`` in one of :data:`LAYOUTS` (drawn when ``None``)."""
    layout = layout or r.choice(LAYOUTS)
    items = flatten(value)
    r.shuffle(items)
    if not items:
        return f"The {noun} has no details yet."
    labels = [label(r, name) for name, _ in items]
    if layout == "table":
        texts = [_text(r, v, "; ") for _, v in items]
        return "| " + " | ".join(labels) + " |\n|" + "---|" * len(items) + "\n| " + " | ".join(texts) + " |"
    texts = [_text(r, v) for _, v in items]
    if layout == "lines":
        sep = r.choice((": ", ": ", " = ", " - "))
        return "\n".join(f"{lab}{sep}{t}" for lab, t in zip(labels, texts))
    if layout == "list":
        bullet = r.choice(("- ", "* ", "• "))
        return "\n".join(f"{bullet}{lab}: {t}" for lab, t in zip(labels, texts))
    if layout == "sentence":
        return _sentence(r, noun, list(zip(labels, texts)))
    half = max(1, len(items) // 2)
    first = _sentence(r, noun, list(zip(labels, texts))[:half])
    rest = _sentence(r, noun, list(zip(labels, texts))[half:]) if items[half:] else ""
    noise = r.choice((f"It was filed last {r.choice(('week', 'month', 'year'))}.", "Nothing else was noted.",
                      f"Someone from {r.choice(('sales', 'support', 'ops', 'finance'))} added it.",
                      "Please keep this on file.", "The rest of the notes are unrelated."))
    return " ".join(x for x in (first, noise, rest) if x)


def keys_phrase(r: random.Random, keys: list[str]) -> str:
    shown = [k if r.random() < 0.6 else " ".join(split_words(k)) for k in keys]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
