"""The repair corpus: rules a grammar cannot express, left to validation + repair (issue #32).

Each case is a spec whose rule the grammar leaves out, and a prompt of the embedded model's record
families whose facts satisfy it (as in the issue: every fact is in the prompt); the toy model still
breaks the rules now and then (a duplicate skill, a name the pattern refuses, a wrong date), and
then the repair has to converge. ``run_case`` runs one case through a real
:class:`~dgemma_struct.repair.session.RepairSession` with the embedded model and reports what the
benchmark (benchmarks/repair_convergence.py) and the test (test_repair_corpus.py) check: the value is
valid whenever one is returned, and no rejected value was written twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import jsonschema
from pydantic import AfterValidator, BaseModel, FutureDate, PastDate, field_validator, model_validator

from dgemma_struct.errors import GenerationFailed, LengthError
from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.preparation import prepare


class Skills(BaseModel):
    name: str
    skills: set[str]


class PastEvent(BaseModel):
    event: str
    date: PastDate


class FutureEvent(BaseModel):
    event: str
    date: FutureDate


class Person(BaseModel):
    name: str
    age: int
    email: str

    @field_validator("age")
    @classmethod
    def _adult_in_thirties(cls, v: int) -> int:
        if not 30 <= v <= 39:
            raise ValueError("age must be in the thirties")
        return v


class Booking(BaseModel):
    guest: str
    nights: int
    room: Literal["single", "double", "suite"]
    breakfast: bool

    @model_validator(mode="after")
    def _suite_stays(self) -> "Booking":
        if self.room == "suite" and self.nights < 3:
            raise ValueError("a suite is booked for three nights or more")
        if self.nights > 7:
            raise ValueError("at most a week")
        return self


def _no_digits(s: str) -> str:
    if any(c.isdigit() for c in s):
        raise ValueError("a city has no digits")
    if not s[:1].isupper():
        raise ValueError("a city starts with a capital letter")
    return s


class Contact(BaseModel):
    name: str
    phone: str
    city: Annotated[str, AfterValidator(_no_digits)]


_STR = {"type": "string"}
SCHEMAS: dict[str, dict] = {
    "if_then_else": {"type": "object", "properties": {
        "guest": _STR, "nights": {"type": "integer", "minimum": 1},
        "room": {"enum": ["single", "double", "suite"]}, "breakfast": {"type": "boolean"}},
        "required": ["guest", "nights", "room", "breakfast"], "additionalProperties": False,
        "if": {"properties": {"breakfast": {"const": True}}},
        "then": {"properties": {"room": {"enum": ["double", "suite"]}}},
        "else": {"properties": {"nights": {"maximum": 5}}}},
    "dependentRequired": {"type": "object", "properties": {"name": _STR, "city": _STR, "email": _STR,
                                                           "phone": _STR},
                          "required": ["name", "city"], "additionalProperties": False,
                          "dependentRequired": {"email": ["phone"]}},
    "not": {"type": "object", "properties": {"name": {"type": "string", "not": {"pattern": "^[A-M]"}},
                                             "age": {"type": "integer"}, "email": _STR},
            "required": ["name", "age", "email"], "additionalProperties": False},
    "contains": {"type": "object", "properties": {
        "name": _STR, "skills": {"type": "array", "items": _STR, "minItems": 1, "maxItems": 6,
                                 "contains": {"enum": ["python", "sql"]}}},
        "required": ["name", "skills"], "additionalProperties": False},
    "lookaround_pattern": {"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^(?!.*(?:Lopez|Ito|Brown)).*$"}, "age": {"type": "integer"},
        "email": _STR}, "required": ["name", "age", "email"], "additionalProperties": False},
    "uniqueItems": {"type": "object", "properties": {
        "name": _STR, "skills": {"type": "array", "items": _STR, "uniqueItems": True, "minItems": 3,
                                 "maxItems": 5}},
        "required": ["name", "skills"], "additionalProperties": False},
}


@dataclass(frozen=True)
class Case:
    name: str          # the rule it exercises
    spec: Any          # pydantic model or JSON Schema
    prompt: str


CASES: list[Case] = [
    Case("uniqueItems (set[str])", Skills,
         "Extract the name and skills (a list) as JSON.\nAna Ruiz knows Go, SQL and Excel."),
    Case("uniqueItems (schema)", SCHEMAS["uniqueItems"],
         "Extract the name and skills (a list) as JSON.\nSkills of Omar Ito: SQL, Python and Java."),
    Case("if/then/else", SCHEMAS["if_then_else"],
         "Booking: Hugo Lopez, 3 nights, double room, with breakfast.\nReturn a JSON object with guest, nights, "
         "room and breakfast."),
    Case("dependentRequired", SCHEMAS["dependentRequired"],
         "Extract the name, city, email and phone if given as JSON.\nLena Park is from Lima and uses "
         "lena4@mail.org, phone 555-867-5309."),
    Case("not", SCHEMAS["not"], "Extract the name, age and email as JSON.\nMeet Omar Ruiz, age 41, email omar@x.org."),
    # the skills as the toy model knows them (lower case, its own list): with "Excel, Go and SQL" neither
    # checkpoint extracted the list; the one before the fine-tune passed only by writing "python" anyway
    Case("contains", SCHEMAS["contains"],
         "Extract the name and skills (a list) as JSON.\nNadia Ito knows excel, rust and sql."),
    Case("look-around pattern", SCHEMAS["lookaround_pattern"],
         "Extract the name, age and email as JSON.\nYou can write to Emil Park (33) at emil@mail.org."),
    Case("PastDate", PastEvent, "Extract the event and date as JSON.\nThe gala in Oslo on 4 March 2011."),
    Case("FutureDate", FutureEvent, "Extract the event and date as JSON.\nThe fair in Lima on 2 May 2031."),
    Case("field_validator", Person, "Extract the name, age and email as JSON.\nMeet Julia Muller, age 35, "
                                    "email julia68@mail.org."),
    Case("model_validator", Booking, "Booking: Hugo Lopez, 4 nights, suite room, without breakfast.\n"
                                     "Return a JSON object with guest, nights, room and breakfast."),
    Case("AfterValidator", Contact, "Extract the name, phone and city as JSON.\nCall Omar Ito in Lima on 555-867-5309."),
]


# the prompt's fact breaks the rule, so the model's first answer is rejected and every attempt is a repair:
# each must try a value of its own (the request may still fail: the facts point the other way)
HARD_CASES: list[Case] = [
    Case("field_validator (age 45, rule: thirties)", Person,
         "Extract the name, age and email as JSON.\nMeet Julia Muller, age 45, email julia68@mail.org."),
    Case("model_validator (a suite for 2 nights)", Booking,
         "Booking: Hugo Lopez, 2 nights, suite room, without breakfast.\n"
         "Return a JSON object with guest, nights, room and breakfast."),
    Case("if/then/else (breakfast in a single)", SCHEMAS["if_then_else"],
         "Booking: Hugo Lopez, 9 nights, single room, with breakfast.\nReturn a JSON object with guest, nights, "
         "room and breakfast."),
    Case("look-around pattern (a refused name)", SCHEMAS["lookaround_pattern"],
         "Extract the name, age and email as JSON.\nYou can write to Emil Ito (33) at emil@mail.org."),
    Case("uniqueItems (one skill, three wanted)", SCHEMAS["uniqueItems"],
         "Extract the name and skills (a list) as JSON.\nSkills of Omar Ito: SQL."),
    Case("FutureDate (a date in 2001)", FutureEvent,
         "Extract the event and date as JSON.\nThe fair in Lima on 2 May 2001."),
]


@dataclass
class CaseRun:
    case: str
    mode: str
    seed: int
    ok: bool                 # a value came back
    valid: bool              # ... and it validates against the spec on its own
    error: str               # the typed error's class, "" on success
    attempts: int            # attempts run (repairs + 1, + 1 for the fallback)
    rejected: int            # distinct values validation rejected
    retried: int             # rejected values an attempt wrote again (the rule keeps it at 0)
    value: Any = None
    unfinished: int = 0      # attempts that ended with no value to judge (token budget or dead end)


def independently_valid(spec: Any, value: Any) -> bool:
    """Checks ``value`` against ``spec`` without the SDK (pydantic / jsonschema)."""
    try:
        if isinstance(spec, type) and issubclass(spec, BaseModel):
            spec.model_validate(value.model_dump() if isinstance(value, BaseModel) else value)
        else:
            jsonschema.Draft202012Validator(spec, format_checker=jsonschema.FormatChecker()).validate(value)
        return True
    except Exception:  # noqa: BLE001 - any failure is "not valid"
        return False


#: RepairSession.judge's reasons for an attempt that left no value to validate
UNFINISHED = ("the output did not finish within the token budget", "the grammar walk made no progress (dead end)")


def run_case(case: Case, *, mode: str = "diffusion", seed: int = 0, max_new_tokens: int = 64,
             max_repairs: int = 2, runtime: Any = None) -> CaseRun:
    """One case, one seed, through a real session with the embedded model (or ``runtime``)."""
    opts = GenerateOptions(mode=mode, seed=seed, max_new_tokens=max_new_tokens, max_repairs=max_repairs)
    session = prepare(case.prompt, case.spec, runtime, opts)
    error, value, ok = "", None, False
    try:
        value = session.solve().value
        ok = True
    except (GenerationFailed, LengthError) as e:
        error = type(e).__name__
    rej = session.rejected_values()
    unfinished = sum(e in UNFINISHED for e in session.errors)
    return CaseRun(case.name, mode, seed, ok, ok and independently_valid(case.spec, value), error,
                   session.stats.repairs + 1 + int(session.stats.fallback), len(rej),
                   sum(1 for r in rej if r["times"] > 1), value, unfinished)


__all__ = ["CASES", "HARD_CASES", "Case", "CaseRun", "run_case", "independently_valid"]
