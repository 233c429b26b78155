"""Constraints: compile a spec (pydantic model, JSON Schema, regex, Lark grammar, choices) into a
:class:`Constraint` bound to a tokenizer, and walk diffusion canvases with :class:`CanvasWalker`.

    from dgemma_struct.constraints import compile_constraint, Regex, Grammar, Choice, JsonSchema
    c = compile_constraint(MyModel, tokenizer=hf_tokenizer)
    w = c.canvas_walker()
    res = w.walk(draft_ids)          # res.n_valid, res.bitmasks [n_valid+1, ceil(V/32)] int32

Modules: :mod:`.specs` (what the output must be), :mod:`.compile` (spec -> constraint, cache),
:mod:`.constraint` (the compiled constraint, its kind and validators), :mod:`.grammars` /
:mod:`.json_schema` (the per-kind compilers), :mod:`.walker` (per-step masks), :mod:`.closing`
(budget-aware closing plans), :mod:`.tokenizer`, :mod:`.safety`, :mod:`.thinking`.
"""
from .bitmask_np import allowed_among, bitmask_allows, bitmask_to_bool
from .closing import closer_ids, closing_candidates, closing_plan, closing_plan_checked, plan_still_closes
from .compile import cache_clear, cache_info, compile_constraint
from .constraint import (ChoiceValidator, Constraint, ConstraintKind, GrammarValidator, JsonValidator, ValidationIssue,
                         ValidationOutcome, Validator)
from .grammars import builtin_grammars
from .specs import Choice, Grammar, JsonSchema, Regex
from .tokenizer import TokenizerInfo, default_stop_token_ids, get_tokenizer_info, tokenizer_from_tiktoken
from .walker import CanvasWalker, WalkResult

__all__ = ["compile_constraint", "Constraint", "Regex", "Grammar", "Choice", "JsonSchema", "CanvasWalker",
           "WalkResult", "ValidationIssue", "ValidationOutcome", "TokenizerInfo", "get_tokenizer_info",
           "tokenizer_from_tiktoken", "default_stop_token_ids", "cache_info", "cache_clear", "builtin_grammars",
           "bitmask_allows", "bitmask_to_bool", "ConstraintKind", "Validator", "JsonValidator", "ChoiceValidator",
           "GrammarValidator", "closing_plan", "closing_plan_checked", "closing_candidates", "closer_ids", "plan_still_closes", "allowed_among"]
