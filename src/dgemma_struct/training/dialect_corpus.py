"""Gemma 4 dialect examples for the embedded model: tool calls and thinking-then-answer turns.

Tool examples declare one to three tools (OpenAI ``tools`` entries, rendered into the system turn by
the chat template) and answer with native calls, arguments copied from the request::

    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|><|tool_response>

Thinking examples wrap an ordinary example: the prompt switches thinking on (``enable_thinking``)
and the answer starts with a short thought, ``<|channel>thought\\n…<channel|>``.

Example::

    >>> import random
    >>> ex = tool_example(random.Random(0))
    >>> ex["kind"], ex["answer"].startswith("<|tool_call>call:")
    ('tool', True)
"""
from __future__ import annotations

import random
from typing import Any

from dgemma_struct.tools.syntax import encode_arguments
from dgemma_struct.training import words

CURRENCIES = ["USD", "EUR", "GBP", "JPY"]


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS: dict[str, dict] = {
    "get_weather": _fn("get_weather", "Weather forecast for a city.",
                       {"city": {"type": "string"}, "days": {"type": "integer"}}, ["city", "days"]),
    "send_email": _fn("send_email", "Send an email.",
                      {"to": {"type": "string"}, "subject": {"type": "string"}}, ["to", "subject"]),
    "book_table": _fn("book_table", "Book a restaurant table.",
                      {"name": {"type": "string"}, "guests": {"type": "integer"}, "date": {"type": "string"}},
                      ["name", "guests", "date"]),
    "convert_currency": _fn("convert_currency", "Convert money between currencies.",
                            {"amount": {"type": "number"}, "source": {"type": "string", "enum": CURRENCIES},
                             "target": {"type": "string", "enum": CURRENCIES}}, ["amount", "source", "target"]),
    "track_order": _fn("track_order", "Where is an order.",
                       {"order_id": {"type": "string"}}, ["order_id"]),
    "add_contact": _fn("add_contact", "Save a contact.",
                       {"name": {"type": "string"}, "phone": {"type": "string"}}, ["name", "phone"]),
}


def _request(r: random.Random, name: str) -> tuple[str, dict[str, Any]]:
    """A user sentence asking for ``name`` and the arguments it implies."""
    f, l = words.random_name(r)
    if name == "get_weather":
        city, days = r.choice(words.CITIES), r.randrange(1, 8)
        return r.choice([f"What is the weather in {city} for the next {days} days?",
                         f"Give me a {days} day forecast for {city}."]), {"city": city, "days": days}
    if name == "send_email":
        to, subject = words.random_email(r, f, l), r.choice(["meeting", "invoice", "holiday", "report", "dinner"])
        return r.choice([f"Email {to} about the {subject}.", f"Send a mail to {to} with subject {subject}."]), \
            {"to": to, "subject": subject}
    if name == "book_table":
        iso, natural = words.random_date(r)
        guests = r.randrange(1, 13)
        return r.choice([f"Book a table for {guests} under {f} {l} on {natural}.",
                         f"Reserve dinner for {f} {l}, {guests} people, {natural}."]), \
            {"name": f"{f} {l}", "guests": guests, "date": iso}
    if name == "convert_currency":
        amount = r.randrange(1, 5000) if r.random() < 0.5 else round(r.uniform(1, 999), 2)
        src, dst = r.sample(CURRENCIES, 2)
        return r.choice([f"Convert {amount} {src} to {dst}.", f"How much is {amount} {src} in {dst}?"]), \
            {"amount": amount, "source": src, "target": dst}
    if name == "track_order":
        code = f"ORD-{r.randrange(10000, 99999)}"
        return r.choice([f"Where is my order {code}?", f"Track {code} please."]), {"order_id": code}
    phone = words.random_phone(r)
    return r.choice([f"Save {f} {l} with number {phone}.", f"Add {f} {l} to my contacts, phone {phone}."]), \
        {"name": f"{f} {l}", "phone": phone}


def _call(name: str, args: dict[str, Any]) -> str:
    return f"<|tool_call>call:{name}{encode_arguments(args)}<tool_call|>"


def tool_example(r: random.Random) -> dict[str, Any]:
    """A request, one to three declared tools, and the native call(s) answering it (two calls, in
    parallel, in about one example of six)."""
    wanted = r.sample(list(TOOLS), 2 if r.random() < 0.17 else 1)
    others = [n for n in TOOLS if n not in wanted]
    declared = wanted + r.sample(others, r.randrange(0, 3 - len(wanted)))
    r.shuffle(declared)
    sentences, calls = [], []
    for name in wanted:
        s, args = _request(r, name)
        sentences.append(s)
        calls.append({"name": name, "arguments": args})
    answer = "".join(_call(c["name"], c["arguments"]) for c in calls) + "<|tool_response>"
    return {"kind": "tool", "family": "+".join(wanted), "prompt": " Also, ".join(sentences), "answer": answer,
            "schema": None, "fields": {"calls": calls}, "tools": [TOOLS[n] for n in declared], "thinking": False}


def _thought(ex: dict[str, Any]) -> str:
    if ex["kind"] == "json":
        keys = list(ex["fields"])
        return f"The user wants {len(keys)} fields: {', '.join(keys)}. I copy them from the text."
    if ex["kind"] == "tool":
        return f"This needs {' and '.join(c['name'] for c in ex['fields']['calls'])}."
    return f"The answer is {ex['answer']}."


def with_thinking(ex: dict[str, Any]) -> dict[str, Any]:
    """``ex`` with thinking switched on and a short thought in front of its answer."""
    return {**ex, "thinking": True, "answer": f"<|channel>thought\n{_thought(ex)}<channel|>{ex['answer']}"}
