"""Tool calling with guaranteed arguments, in DiffusionGemma's native format.

Gemma 4 writes a call as ``<|tool_call>call:NAME{key:VALUE,...}<tool_call|>`` (one or more), then
``<|tool_response>`` (a stop token). Keys are bare, strings are ``<|"|>raw text<|"|>`` with no
escapes, numbers / ``true`` / ``false`` / ``null`` / arrays / objects as in JSON. The markers are
single control tokens (ids 48, 49, 52 on Gemma 4), never spelled from ordinary pieces.

This module turns tool declarations (pydantic models, Python functions, OpenAI tool dicts) into one
grammar over the declared tools, so the canvas can only ever hold calls to a declared tool whose
arguments follow that tool's JSON Schema; after decoding, arguments are converted to JSON and
validated (jsonschema, and pydantic for model tools), and what the grammar cannot express goes
through the same repair loop and AR fallback as JSON.

Example (needs a tokenizer with Gemma 4's tool tokens, e.g. the real checkpoint's)::

    from pydantic import BaseModel
    from dgemma_struct.tools import tool_call_grammar, as_tool

    class GetWeather(BaseModel):
        city: str

    print(tool_call_grammar([as_tool(GetWeather)], marker_ids=GEMMA4_MARKERS)[:40])
"""
from dgemma_struct.tools.api import generate_tool_calls
from dgemma_struct.tools.constraint import ToolCall, ToolCallConstraint, ToolCallResult, compile_tool_calls
from dgemma_struct.tools.declarations import TOOL_CHOICES, Tool, ToolCallError, as_tool, normalise_tools
from dgemma_struct.tools.grammar import tool_call_grammar
from dgemma_struct.tools.syntax import (GEMMA4_MARKERS, MARKER_TOKENS, control_token_id, encode_arguments,
                                        parse_tool_calls)

__all__ = ["Tool", "ToolCall", "ToolCallResult", "ToolCallError", "as_tool", "normalise_tools", "tool_call_grammar",
           "compile_tool_calls", "parse_tool_calls", "encode_arguments", "generate_tool_calls", "GEMMA4_MARKERS",
           "TOOL_CHOICES"]
