"""The compiled tool-call constraint: the grammar over the declared tools plus per-call argument
validation, and its results (:class:`ToolCall`, :class:`ToolCallResult`)."""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import llguidance as llg

from dgemma_struct.constraints import (Constraint, Grammar, Regex, ValidationIssue, ValidationOutcome, compile_constraint,
                                      get_tokenizer_info)
from dgemma_struct.constraints.json_schema import iter_issues, make_validator
from dgemma_struct.constraints.schema_checks import with_spec_formats
from dgemma_struct.constraints.strict_objects import close_objects
from dgemma_struct.errors import InvalidRequestError, SchemaError
from dgemma_struct.results import GenerationStats
from dgemma_struct.tools.declarations import Tool, ToolCallError, check_choice, normalise_tools
from dgemma_struct.tools.grammar import custom_grammar_name, tool_call_grammar
from dgemma_struct.tools.syntax import MARKER_TOKENS, control_token_id, parse_tool_calls


@dataclass
class ToolCall:
    """One validated call: ``name``, ``arguments`` (a JSON-able dict valid against the tool's
    schema), ``value`` (the pydantic instance for model / function tools, else the dict), ``id``."""

    name: str
    arguments: dict[str, Any]
    value: Any = None
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))
    custom: bool = False   # a custom tool's call: its text is ``input``

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)

    @property
    def input(self) -> str | None:
        """A custom tool call's input text (it matches the tool's grammar); ``None`` for a function call."""
        return self.arguments.get("input") if self.custom else None


@dataclass
class ToolCallResult:
    """``calls`` (possibly empty with ``tool_choice="auto"``/``"none"``), ``content`` (the text answer
    when the model did not call), the raw ``text`` and ``stats``; with ``confidence=True`` also
    ``confidence`` (``{"": p}``: the probability of the whole call text under the constraint)."""

    calls: list[ToolCall]
    content: str | None
    text: str
    stats: GenerationStats = field(default_factory=GenerationStats)
    confidence: dict[str, float] | None = None

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else self.stats.finish_reason


class ToolCallConstraint(Constraint):
    """The compiled grammar over the declared tools plus per-call argument validation."""

    def __init__(self, grammar: str, info: Any, tools: Sequence[Tool], choice: str, marker_ids: Mapping[str, int],
                 inputs: Mapping[str, Constraint] | None = None):
        super().__init__("grammar", grammar, info, may_allow_specials=False,
                         description=f"tool calls over {len(tools)} tools ({choice})")
        self._marker_ids = {MARKER_TOKENS[role]: tid for role, tid in marker_ids.items()}
        # budget-aware closing: the string delimiter and the call's end marker close what is open
        self.closing_token_ids = (marker_ids["str"], marker_ids["call_close"])
        self.tools = {t.name: t for t in tools}
        self.tool_choice = choice
        # tool arguments are strict objects (the grammar writes declared keys only; validation agrees)
        self._validators = {t.name: with_spec_formats(make_validator(close_objects(dict(t.parameters))))
                            for t in tools}
        self.inputs = dict(inputs or {})   # custom tool name -> its input's compiled grammar

    def check_calls(self, text: str) -> tuple[list[ToolCall], str | None, list[ValidationIssue]]:
        if not text.startswith(MARKER_TOKENS["call_open"]):
            if self.tool_choice in ("auto", "none"):
                return [], text, []
            return [], None, [ValidationIssue((), "a tool call is required")]
        try:
            parsed = parse_tool_calls(text)
        except ValueError as err:
            return [], None, [ValidationIssue((), f"malformed tool call: {err}")]
        calls: list[ToolCall] = []
        issues: list[ValidationIssue] = []
        for k, (name, args) in enumerate(parsed):
            tool = self.tools.get(name)
            if tool is None:
                issues.append(ValidationIssue((k,), f"call to undeclared tool {name!r}"))
                continue
            errs = iter_issues(self._validators[name], args)
            if errs:
                issues += [ValidationIssue((k, "arguments", *p), m) for p, m in errs]
                continue
            value: Any = args
            grammar = self.inputs.get(name)
            if grammar is not None and not grammar.matches(args["input"]):
                issues.append(ValidationIssue((k, "arguments", "input"), "the input does not match the tool's grammar"))
                continue
            if tool.is_custom:
                calls.append(ToolCall(name=name, arguments=args, value=args["input"], custom=True))
                continue
            if tool.model is not None:
                try:
                    value = tool.model.model_validate(args)
                except Exception as err:  # pydantic.ValidationError
                    issues.append(ValidationIssue((k, "arguments"), str(err).splitlines()[0]))
                    continue
            calls.append(ToolCall(name=name, arguments=args, value=value))
        return calls, None, issues

    def validate_text(self, text: str) -> ValidationOutcome:
        calls, content, issues = self.check_calls(text)
        if issues:
            return ValidationOutcome(False, None, issues)
        return ValidationOutcome(True, ToolCallResult(calls=calls, content=content, text=text), [])

    def tokenize(self, text: str) -> list[int]:
        """Token ids of decoded text: the marker spellings become their control-token ids, the rest
        is tokenized as ordinary text (a spelled ``<|tool_call>`` inside a string never occurs: string
        values cannot hold ``<|``)."""
        pattern = "(" + "|".join(re.escape(m) for m in self._marker_ids) + ")"
        ids: list[int] = []
        for piece in re.split(pattern, text):
            if piece in self._marker_ids:
                ids.append(self._marker_ids[piece])
            elif piece:
                ids.extend(super().tokenize(piece))
        return ids

    def matches(self, text: str) -> bool:
        return self.grammar_accepts(text) and self.validate_text(text).ok


def compile_tool_calls(tools: Sequence[Any], tokenizer: Any, *, tool_choice: Any = "auto",
                       parallel_tool_calls: bool = True, stop_token_ids: Sequence[int] | None = None,
                       vocab_size: int | None = None, max_calls: int | None = None) -> ToolCallConstraint:
    """Compile the tool-call constraint for ``tokenizer`` (an HF tokenizer with Gemma 4's tool tokens).
    A custom tool's grammar is compiled by :func:`~dgemma_struct.constraints.compile_constraint`, as a
    ``Regex`` / ``Grammar`` output constraint is (a bad one raises the same ``RegexError`` / ``GrammarError``),
    and joins the call grammar as a sub-grammar."""
    decl = normalise_tools(tools)
    if not isinstance(parallel_tool_calls, bool):
        raise InvalidRequestError(f"parallel_tool_calls must be a bool, got {parallel_tool_calls!r}")
    if max_calls is not None and (isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1):
        raise InvalidRequestError(f"max_calls must be a positive int, got {max_calls!r}")
    choice, _ = check_choice(tool_choice, decl)
    ids = _marker_ids(tokenizer)
    lark = tool_call_grammar(decl, marker_ids=ids, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                             max_calls=max_calls)
    info = get_tokenizer_info(tokenizer, stop_token_ids=stop_token_ids, vocab_size=vocab_size)
    inputs = {t.name: compile_constraint(Regex(t.grammar[1]) if t.grammar[0] == "regex" else Grammar(t.grammar[1]),
                                         info) for t in decl if t.grammar is not None}
    try:
        g = llg.LLMatcher.grammar_from_lark(lark)
        if inputs:   # one top-level grammar: the calls, then each custom input grammar under its name
            g = json.dumps({"grammars": [{"lark_grammar": lark}] + [
                {**_grammar_entry(inputs[t.name].grammar), "name": custom_grammar_name(i)}
                for i, t in enumerate(decl) if t.name in inputs]})
        err = llg.LLMatcher.validate_grammar(g, info.lltok)
    except Exception as e:  # noqa: BLE001 - llguidance raises ValueError/RuntimeError
        raise ToolCallError(f"cannot compile the tool declarations: {str(e)[:500]}") from e
    if err:
        raise ToolCallError(f"cannot compile the tool declarations: {err.strip()[:500]}")
    try:
        return ToolCallConstraint(g, info, decl, choice, ids, inputs)
    except SchemaError as e:  # raised by Constraint for the wrong kind table
        raise ToolCallError(str(e)) from e


def _grammar_entry(grammar: str) -> dict[str, Any]:
    """A compiled constraint's grammar as one entry of llguidance's top-level ``grammars`` list (a regex
    compiles to top-level JSON, a Lark grammar stays Lark text)."""
    return json.loads(grammar)["grammars"][0] if grammar.lstrip().startswith("{") else {"lark_grammar": grammar}


def _marker_ids(tokenizer: Any) -> dict[str, int]:
    ids: dict[str, int] = {}
    for role, tok in MARKER_TOKENS.items():
        tid = control_token_id(tokenizer, tok)
        if tid is None:
            raise ToolCallError(f"this tokenizer has no {tok!r} control token: tool calls need Gemma 4's tool-call "
                                "tokens (the real DiffusionGemma checkpoint has them)")
        ids[role] = tid
    return ids
