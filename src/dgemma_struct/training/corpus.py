"""Synthetic instruction corpus for the embedded model.

Every example is a chat turn: a user prompt (an instruction plus a natural sentence) and the
model's answer. The answers are what this SDK constrains: JSON objects of varied schemas (flat,
nested, arrays, enums, optional fields), regex-shaped short answers (dates, emails, phone numbers,
codes), choices, and small grammar outputs (arithmetic, key=value lists).

Example::

    >>> from dgemma_struct.training.corpus import make_corpus
    >>> ex = make_corpus(3, seed=0)[0]
    >>> sorted(ex)  # doctest: +NORMALIZE_WHITESPACE
    ['answer', 'family', 'fields', 'kind', 'prompt', 'schema', 'thinking', 'tools']
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from dgemma_struct.training.dialect_corpus import tool_example, with_thinking
from dgemma_struct.training.words import (CITIES, COUNTRIES, DOMAINS, EVENTS, FIRST, JOBS, LAST, MONTHS,  # noqa: F401
                                          NEGATIVE, NEUTRAL, POSITIVE, PRODUCTS, ROOMS, SETTINGS, SKILLS, STATUSES,
                                          TOPICS, random_date, random_email, random_name, random_phone)


def _keys_phrase(keys: list[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]


def _json_prompt(r: random.Random, keys: list[str], sentence: str) -> str:
    kp = _keys_phrase(keys)
    template = r.choice([
        "Extract the {k} as JSON.\n{s}",
        "{s}\nReturn a JSON object with {k}.",
        "Convert to JSON with fields {k}: {s}",
        "Read the text and give {k} in JSON.\nText: {s}",
    ])
    return template.format(k=kp, s=sentence)


def _dump(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --- JSON families: each returns (prompt, value, schema) -------------------------------------------

def fam_person(r: random.Random):
    f, l = random_name(r)
    age, email = r.randrange(18, 90), random_email(r, f, l)
    sentence = r.choice([f"{f} {l} is {age} years old and can be reached at {email}.",
                         f"Meet {f} {l}, age {age}, email {email}.",
                         f"You can write to {f} {l} ({age}) at {email}."])
    value = {"name": f"{f} {l}", "age": age, "email": email}
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "email": {"type": "string", "format": "email"}},
              "required": ["name", "age", "email"], "additionalProperties": False}
    return _json_prompt(r, list(value), sentence), value, schema


def fam_contact(r: random.Random):
    f, l = random_name(r)
    phone, city = random_phone(r), r.choice(CITIES)
    sentence = r.choice([f"Call {f} {l} in {city} on {phone}.", f"{f} {l} lives in {city}; phone {phone}.",
                         f"Our contact in {city} is {f} {l}, reachable at {phone}."])
    value = {"name": f"{f} {l}", "phone": phone, "city": city}
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "phone": {"type": "string", "pattern": r"^\d{3}-\d{3}-\d{4}$"},
                                               "city": {"type": "string"}},
              "required": ["name", "phone", "city"], "additionalProperties": False}
    return _json_prompt(r, list(value), sentence), value, schema


def fam_event(r: random.Random):
    iso, natural = random_date(r)
    ev, city, n = r.choice(EVENTS), r.choice(CITIES), r.randrange(2, 500)
    sentence = r.choice([f"The {ev} in {city} on {natural} expects {n} guests.",
                         f"On {natural} there is a {ev} in {city} for {n} people.",
                         f"{n} people will attend the {ev} held in {city} on {natural}."])
    value = {"event": ev, "date": iso, "city": city, "guests": n}
    schema = {"type": "object", "properties": {"event": {"type": "string"},
                                               "date": {"type": "string", "format": "date"},
                                               "city": {"type": "string"},
                                               "guests": {"type": "integer", "minimum": 0}},
              "required": ["event", "date", "city", "guests"], "additionalProperties": False}
    return _json_prompt(r, list(value), sentence), value, schema


def fam_order(r: random.Random):
    code = f"ORD-{r.randrange(10000, 99999)}"
    prod, qty, status = r.choice(PRODUCTS), r.randrange(1, 20), r.choice(STATUSES)
    price = round(r.uniform(2, 900), 2)
    sentence = r.choice([f"Order {code}: {qty} x {prod} at {price} dollars each, status {status}.",
                         f"The {prod} order {code} ({qty} units, {price} each) is {status}.",
                         f"{code} is {status}: {qty} {prod} for {price} per unit."])
    value = {"order_id": code, "product": prod, "quantity": qty, "price": price, "status": status}
    schema = {"type": "object", "properties": {"order_id": {"type": "string", "pattern": r"^ORD-\d{5}$"},
                                               "product": {"type": "string"},
                                               "quantity": {"type": "integer", "minimum": 1},
                                               "price": {"type": "number"},
                                               "status": {"enum": STATUSES}},
              "required": list(value), "additionalProperties": False}
    return _json_prompt(r, list(value), sentence), value, schema


def fam_employee(r: random.Random):
    f, l = random_name(r)
    job, city = r.choice(JOBS), r.choice(CITIES)
    sentence = r.choice([f"{f} {l} works as a {job} in {city}.", f"In {city}, {f} {l} is a {job}.",
                         f"{f} {l}, a {job}, is based in {city}, {COUNTRIES[city]}."])
    value = {"name": f"{f} {l}", "job": job, "address": {"city": city, "country": COUNTRIES[city]}}
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "job": {"type": "string"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                    "required": ["city", "country"], "additionalProperties": False}},
        "required": ["name", "job", "address"], "additionalProperties": False}
    prompt = _json_prompt(r, ["name", "job", "address (city, country)"], sentence)
    return prompt, value, schema


def fam_skills(r: random.Random):
    f, l = random_name(r)
    skills = r.sample(SKILLS, r.randrange(1, 5))
    listed = ", ".join(skills[:-1]) + (" and " if len(skills) > 1 else "") + skills[-1]
    sentence = r.choice([f"{f} {l} knows {listed}.", f"Skills of {f} {l}: {listed}.",
                         f"{f} {l} is good at {listed}."])
    value = {"name": f"{f} {l}", "skills": skills}
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "skills": {"type": "array", "items": {"type": "string"},
                                                          "minItems": 1}},
              "required": ["name", "skills"], "additionalProperties": False}
    return _json_prompt(r, ["name", "skills (a list)"], sentence), value, schema


def fam_booking(r: random.Random):
    f, l = random_name(r)
    nights, room, breakfast = r.randrange(1, 15), r.choice(ROOMS), r.random() < 0.5
    bf = "with breakfast" if breakfast else "without breakfast"
    sentence = r.choice([f"{f} {l} booked a {room} room for {nights} nights {bf}.",
                         f"Booking: {f} {l}, {nights} nights, {room} room, {bf}."])
    value = {"guest": f"{f} {l}", "nights": nights, "room": room, "breakfast": breakfast}
    schema = {"type": "object", "properties": {"guest": {"type": "string"},
                                               "nights": {"type": "integer", "minimum": 1},
                                               "room": {"enum": ROOMS}, "breakfast": {"type": "boolean"}},
              "required": list(value), "additionalProperties": False}
    return _json_prompt(r, list(value), sentence), value, schema


def fam_optional(r: random.Random):
    f, l = random_name(r)
    city = r.choice(CITIES)
    has_email = r.random() < 0.5
    email = random_email(r, f, l)
    sentence = f"{f} {l} is from {city}" + (f" and uses {email}." if has_email else ".")
    value = {"name": f"{f} {l}", "city": city}
    if has_email:
        value["email"] = email
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                               "email": {"type": "string"}},
              "required": ["name", "city"], "additionalProperties": False}
    return _json_prompt(r, ["name", "city", "email if given"], sentence), value, schema


JSON_FAMILIES: dict[str, Callable] = {
    "person": fam_person, "contact": fam_contact, "event": fam_event, "order": fam_order,
    "employee": fam_employee, "skills": fam_skills, "booking": fam_booking, "optional": fam_optional,
}


# --- short answers: regex-shaped, choices, grammars ----------------------------------------------

def short_answer(r: random.Random) -> tuple[str, str, str, dict]:
    """Returns (family, prompt, answer, spec-description)."""
    k = r.randrange(7)
    f, l = random_name(r)
    if k == 0:
        iso, natural = random_date(r)
        s = r.choice([f"{f} {l} was born on {natural}.", f"The contract ends on {natural}."])
        return "date", f"What date is mentioned? Answer as YYYY-MM-DD.\n{s}", iso, {"regex": r"\d{4}-\d{2}-\d{2}"}
    if k == 1:
        e = random_email(r, f, l)
        return "email", f"What is the email address in this text?\nWrite to {f} {l} at {e} today.", e, \
            {"regex": r"[a-z0-9.]+@[a-z]+\.[a-z]+"}
    if k == 2:
        p = random_phone(r)
        return "phone", f"Give the phone number.\nYou can call {f} on {p} after six.", p, \
            {"regex": r"\d{3}-\d{3}-\d{4}"}
    if k == 3:
        code = f"ORD-{r.randrange(10000, 99999)}"
        return "code", f"What is the order code?\nPlease ship {code} to {r.choice(CITIES)}.", code, \
            {"regex": r"ORD-\d{5}"}
    if k == 4:
        label = r.choice(["positive", "negative", "neutral"])
        s = r.choice({"positive": POSITIVE, "negative": NEGATIVE, "neutral": NEUTRAL}[label])
        return "sentiment", f"Classify the sentiment as positive, negative or neutral.\n{s}", label, \
            {"choice": ["positive", "negative", "neutral"]}
    if k == 5:
        topic = r.choice(list(TOPICS))
        s = r.choice(TOPICS[topic])
        return "topic", f"Is this about sports, politics or tech?\n{s}", topic, \
            {"choice": ["sports", "politics", "tech"]}
    if r.random() < 0.5:
        a, b, c = r.randrange(1, 50), r.randrange(1, 50), r.randrange(1, 10)
        op_words = [("plus", "+"), ("minus", "-"), ("times", "*")]
        (w1, o1), (w2, o2) = r.choice(op_words), r.choice(op_words)
        if r.random() < 0.5:
            return "arith", f"Write as an arithmetic expression: {a} {w1} {b}.", f"{a}{o1}{b}", {"grammar": "arithmetic"}
        return "arith", f"Write as an arithmetic expression: {c} {w2} ({a} {w1} {b}).", \
            f"{c}{o2}({a}{o1}{b})", {"grammar": "arithmetic"}
    keys = r.sample(list(SETTINGS), r.randrange(1, 4))
    vals = [r.choice(SETTINGS[key]) for key in keys]
    desc = ", ".join(f"{key} is {v}" for key, v in zip(keys, vals))
    return "kv", f"List the settings as key=value pairs: {desc}.", ";".join(f"{k2}={v}" for k2, v in zip(keys, vals)), \
        {"grammar": "key_value"}


@dataclass
class Example:
    kind: str
    family: str
    prompt: str
    answer: str
    schema: dict | None = None
    fields: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "family": self.family, "prompt": self.prompt, "answer": self.answer,
                "schema": self.schema, "fields": self.fields, "tools": None, "thinking": False}


def make_example(r: random.Random, json_fraction: float = 0.62, tool_fraction: float = 0.15,
                 thinking_fraction: float = 0.08) -> dict:
    """One example: JSON extraction, a short answer or a tool call; thinking switched on for about
    ``thinking_fraction`` of them (see :mod:`dgemma_struct.training.dialect_corpus`)."""
    u = r.random()
    if u < json_fraction:
        fam = r.choice(list(JSON_FAMILIES))
        prompt, value, schema = JSON_FAMILIES[fam](r)
        ex = Example("json", fam, prompt, _dump(value), schema, value).to_dict()
    elif u < json_fraction + tool_fraction:
        ex = tool_example(r)
    else:
        fam, prompt, answer, spec = short_answer(r)
        ex = Example("short", fam, prompt, answer, spec, {"answer": answer}).to_dict()
    return with_thinking(ex) if r.random() < thinking_fraction else ex


def make_corpus(n: int, seed: int = 0, **fractions: float) -> list[dict]:
    """``n`` examples, deterministic in ``seed``."""
    r = random.Random(seed)
    return [make_example(r, **fractions) for _ in range(n)]
