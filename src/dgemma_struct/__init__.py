"""dgemma-struct: guaranteed structured outputs from DiffusionGemma text-diffusion models.

Example::

    from pydantic import BaseModel
    from dgemma_struct import generate_json

    class Person(BaseModel):
        name: str
        age: int

    person = generate_json("Extract the name and age as JSON.\\nAda Lovelace is 36.", schema=Person)
"""
from dgemma_struct.api import (Generator, agenerate, agenerate_json, generate, generate_batch, generate_choice,
                               generate_grammar, generate_json, generate_json_batch, generate_regex)
from dgemma_struct.constraints import Choice, Constraint, Grammar, JsonSchema, Regex, compile_constraint
from dgemma_struct.errors import DgemmaStructError
from dgemma_struct.options import GenerateOptions
from dgemma_struct.repair.preparation import constraint_for
from dgemma_struct.streaming import partial_json, stream, stream_json
from dgemma_struct.engine.hooks import NullHook, StepHook, StepView
from dgemma_struct.choice_scores import choice_probabilities
from dgemma_struct.results import CanvasEvent, ChoiceResult, GenerationResult, GenerationStats, TokenLogprob
from dgemma_struct.grounding import Grounded, GroundedResult, generate_grounded, generate_grounded_batch
from dgemma_struct.prompts import ChatPrompt
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.tools import Tool, ToolCall, ToolCallResult, generate_tool_calls

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
