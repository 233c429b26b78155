"""dgemma-struct: guaranteed structured outputs from DiffusionGemma text-diffusion models.

Example::

    from pydantic import BaseModel
    from dgemma_struct import generate_json

    class Person(BaseModel):
        name: str
        age: int

    person = generate_json("Extract the name and age as JSON.\\nAda Lovelace is 36.", schema=Person)
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module that defines it. The root imports them on first use (PEP 562):
# `import dgemma_struct` and the `dgemma-struct` command start without torch and transformers, so a
# Ctrl-C while they load reaches the command's own handler (one line, exit 130), and `--help` is quick.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("Generator", "agenerate", "agenerate_json", "generate", "generate_batch", "generate_choice",
                     "generate_grammar", "generate_json", "generate_json_batch", "generate_regex"), "api"),
    **dict.fromkeys(("Choice", "Constraint", "Grammar", "JsonSchema", "Regex", "compile_constraint"), "constraints"),
    "DgemmaStructError": "errors",
    "GenerateOptions": "options",
    "constraint_for": "repair.preparation",
    **dict.fromkeys(("partial_json", "stream", "stream_json"), "streaming"),
    **dict.fromkeys(("NullHook", "StepHook", "StepView"), "engine.hooks"),
    "choice_probabilities": "choice_scores",
    **dict.fromkeys(("CanvasEvent", "ChoiceResult", "GenerationResult", "GenerationStats", "TokenLogprob"),
                    "results"),
    **dict.fromkeys(("Grounded", "GroundedResult", "generate_grounded", "generate_grounded_batch"), "grounding"),
    "ChatPrompt": "prompts",
    "DiffusionRuntime": "runtime",
    **dict.fromkeys(("Tool", "ToolCall", "ToolCallResult", "generate_tool_calls"), "tools"),
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ below imports on demand
    from dgemma_struct.api import (Generator, agenerate, agenerate_json, generate, generate_batch, generate_choice,
                                   generate_grammar, generate_json, generate_json_batch, generate_regex)
    from dgemma_struct.choice_scores import choice_probabilities
    from dgemma_struct.constraints import Choice, Constraint, Grammar, JsonSchema, Regex, compile_constraint
    from dgemma_struct.engine.hooks import NullHook, StepHook, StepView
    from dgemma_struct.errors import DgemmaStructError
    from dgemma_struct.grounding import Grounded, GroundedResult, generate_grounded, generate_grounded_batch
    from dgemma_struct.options import GenerateOptions
    from dgemma_struct.prompts import ChatPrompt
    from dgemma_struct.repair.preparation import constraint_for
    from dgemma_struct.results import CanvasEvent, ChoiceResult, GenerationResult, GenerationStats, TokenLogprob
    from dgemma_struct.runtime import DiffusionRuntime
    from dgemma_struct.streaming import partial_json, stream, stream_json
    from dgemma_struct.tools import Tool, ToolCall, ToolCallResult, generate_tool_calls


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then cached in the package namespace)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dgemma_struct' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dgemma_struct.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__version__ = "0.1.0"
__all__ = [
    "generate", "generate_json", "generate_regex", "generate_grammar", "generate_choice", "generate_batch",
    "generate_json_batch", "agenerate", "agenerate_json", "stream", "stream_json", "partial_json", "constraint_for",
    "compile_constraint", "Constraint", "Regex", "Grammar", "Choice", "JsonSchema", "DiffusionRuntime",
    "GenerationResult", "GenerationStats", "CanvasEvent", "StepHook", "StepView", "NullHook", "DgemmaStructError",
    "generate_grounded", "generate_grounded_batch", "Grounded", "GroundedResult", "generate_tool_calls", "Tool",
    "ToolCall", "ToolCallResult", "ChatPrompt", "Generator", "GenerateOptions", "ChoiceResult", "choice_probabilities",
    "TokenLogprob", "__version__",
]
