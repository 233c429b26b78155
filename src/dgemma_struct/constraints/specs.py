"""Spec wrapper types accepted by :func:`compile_constraint`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

__all__ = ["Regex", "Grammar", "Choice", "JsonSchema"]


@dataclass(frozen=True)
class Regex:
    """A regular expression the whole output must match (Rust ``regex`` syntax, anchored)."""

    pattern: str


@dataclass(frozen=True)
class Grammar:
    """A grammar: Lark or GBNF/EBNF text (GBNF -- rules written ``root ::= ...`` -- is detected by its
    ``::=`` and converted with llguidance's ``gbnf_to_lark``), a path to a ``.lark`` / ``.gbnf`` file, or
    the name of a built-in grammar in :mod:`dgemma_struct.grammars` (e.g. ``"arithmetic"``)."""

    source: Union[str, Path]
    start: str = "start"


@dataclass(frozen=True)
class Choice:
    """The output must be exactly one of ``choices``."""

    choices: tuple

    def __init__(self, choices: Sequence[str]):
        object.__setattr__(self, "choices", tuple(choices) if isinstance(choices, (list, tuple)) else choices)


@dataclass(frozen=True)
class JsonSchema:
    """A JSON Schema given as a dict or a JSON string."""

    schema: Any = field(hash=False, compare=False)

    def as_dict(self) -> Any:
        if isinstance(self.schema, (str, bytes)):
            return json.loads(self.schema)
        return self.schema
