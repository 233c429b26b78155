"""Grounded extraction: JSON values whose grounded strings are verbatim spans of a source text and
whose grounded numbers are numbers written in it, with the character offsets of every grounded
value, enforced *during* decoding (diffusion canvas or AR), not checked after the fact.

Mark fields as grounded

- per field in pydantic: ``name: Annotated[str, Grounded()]`` or
  ``Field(json_schema_extra={"x-grounded": True})``;
- in a plain JSON Schema: ``{"type": "string", "x-grounded": true}`` (or
  ``{"x-grounded": {"mode": "chars"}}``; ``false`` opts a field out of request-level grounding);
- for the whole request: ``ground="strings"`` (every free string field), ``"numbers"`` or
  ``"all"`` (strings and numbers).

The items of an array copy distinct places of the source: ``["red", "red"]`` needs "red" written
twice (a model that drafts one item again instead of closing the list gets a repair that may close
it); ``Grounded(repeat=True)`` / ``{"x-grounded": {"repeat": true}}`` on the items allows repeats.

Example::

    >>> from typing import Annotated
    >>> from pydantic import BaseModel
    >>> from dgemma_struct.grounding import Grounded, generate_grounded
    >>> class Person(BaseModel):
    ...     name: Annotated[str, Grounded()]
    ...     age: Annotated[int, Grounded()]
    >>> res = generate_grounded("Extract the name and age as JSON.\\nTara Zhang is 42.", Person)  # doctest: +SKIP
    >>> res.spans[0].text in res.sources[res.spans[0].doc]  # doctest: +SKIP
    True

How: the schema is compiled to an llguidance Lark grammar. Objects that hold grounded fields get
hand-written rules (properties in schema order, optional ones skippable); every other sub-schema
is embedded as ``%json {...}``. A grounded string is one lexeme: ``"`` + a substring of the source
+ ``"``, written with llguidance's ``%regex {"substring_chunks": [...]}`` over the source cut into
chunks (words: runs of letters/digits, runs of whitespace, single other characters; chars: code
points) that are JSON-escaped *one chunk at a time*, so a span can never end inside an escape
(``\\"``, ``\\\\``, ``\\n``, ``\\u0007``), intersected with "non-empty, no whitespace or control
character at either end". A grounded field with further constraints (pattern, format, enum,
const, lengths) gets the finite list of the source's spans that pass the field's own sub-schema
instead (empty list: :class:`~dgemma_struct.errors.GroundingError` before any generation).
Grounded numbers are the list of number literals of the source that pass the sub-schema.
Validation is against the ORIGINAL schema (jsonschema, and the pydantic model when given), plus a
check that every grounded value occurs in the source (an array's repeated string as often as it is
repeated), so repairs and the AR fallback keep both.
"""
from dgemma_struct.grounding.api import (DEMO_PROMPT, DEMO_SCHEMA, GroundedResult, demo, generate_grounded,
                                         generate_grounded_batch)
from dgemma_struct.grounding.constraint import GroundedConstraint, compile_grounded
from dgemma_struct.grounding.render import render_html
from dgemma_struct.grounding.sources import (GroundedSpan, chunk_offsets, edge_ok, grounded_sources,
                                             prompt_with_sources, source_numbers)
from dgemma_struct.grounding.spec import (GRANULARITIES, GROUND_KEY, GROUND_LEVELS, Grounded, grounding_options,
                                          has_grounding)

__all__ = ["Grounded", "GroundedSpan", "GroundedResult", "GroundedConstraint", "compile_grounded",
           "generate_grounded", "generate_grounded_batch", "grounded_sources", "has_grounding", "GROUND_KEY",
           "render_html", "demo", "grounding_options", "prompt_with_sources"]
