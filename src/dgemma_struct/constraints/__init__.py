"""Constraints: compile a spec (pydantic model, JSON Schema, regex, Lark grammar, choices) into a
:class:`Constraint` bound to a tokenizer, and walk diffusion canvases with :class:`CanvasWalker`.

    from dgemma_struct.constraints import compile_constraint, Regex, Grammar, Choice, JsonSchema
    c = compile_constraint(MyModel, tokenizer=hf_tokenizer)
    w = c.canvas_walker()
    res = w.walk(draft_ids)          # res.n_valid, res.bitmasks [n_valid+1, ceil(V/32)] int32
"""
from .canvas_mask import CanvasWalker, WalkResult, bitmask_allows, bitmask_to_bool
from .compile import (Constraint, ValidationIssue, ValidationOutcome, builtin_grammars, cache_clear, cache_info,
                      compile_constraint)
from .specs import Choice, Grammar, JsonSchema, Regex
from .tokenizer import TokenizerInfo, default_stop_token_ids, get_tokenizer_info, tokenizer_from_tiktoken

__all__ = ["compile_constraint", "Constraint", "Regex", "Grammar", "Choice", "JsonSchema", "CanvasWalker",
           "WalkResult", "ValidationIssue", "ValidationOutcome", "TokenizerInfo", "get_tokenizer_info",
           "tokenizer_from_tiktoken", "default_stop_token_ids", "cache_info", "cache_clear", "builtin_grammars",
           "bitmask_allows", "bitmask_to_bool"]
