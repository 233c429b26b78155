"""Gemma 4's tool-call syntax: the control tokens (:data:`MARKER_TOKENS`), JSON values written as
call arguments (:func:`encode_arguments`) and read back (:func:`parse_tool_calls`)."""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

#: Gemma 4's tool control tokens by role (names as in the tokenizer).
MARKER_TOKENS = {"call_open": "<|tool_call>", "call_close": "<tool_call|>", "str": '<|"|>',
                 "response": "<|tool_response>"}
GEMMA4_MARKERS = {"call_open": 48, "call_close": 49, "str": 52, "response": 50}
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
KEY = re.compile(r"[^\s:,{}\[\]<>\"]{1,128}")
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def encode_arguments(value: Any, *, str_delim: str = MARKER_TOKENS["str"]) -> str:
    """JSON value -> Gemma 4 argument syntax (what the chat template writes for past calls)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return f"{str_delim}{value}{str_delim}" if str_delim else value
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{encode_arguments(v, str_delim=str_delim)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode_arguments(v, str_delim=str_delim) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


class _Parser:
    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def error(self, what: str) -> ValueError:
        return ValueError(f"{what} at character {self.i}: {self.s[self.i:self.i + 30]!r}")

    def take(self, lit: str) -> bool:
        if self.s.startswith(lit, self.i):
            self.i += len(lit)
            return True
        return False

    def expect(self, lit: str) -> None:
        if not self.take(lit):
            raise self.error(f"expected {lit!r}")

    def value(self, depth: int = 0) -> Any:
        if depth > 64:
            raise self.error("nested too deeply")
        d = MARKER_TOKENS["str"]
        if self.take(d):
            j = self.s.find(d, self.i)
            if j < 0:
                raise self.error("unterminated string")
            out, self.i = self.s[self.i:j], j + len(d)
            return out
        if self.take("{"):
            obj: dict[str, Any] = {}
            if self.take("}"):
                return obj
            while True:
                m = KEY.match(self.s, self.i)
                if not m:
                    raise self.error("expected a key")
                self.i = m.end()
                self.expect(":")
                obj[m.group()] = self.value(depth + 1)
                if self.take("}"):
                    return obj
                self.expect(",")
        if self.take("["):
            arr: list[Any] = []
            if self.take("]"):
                return arr
            while True:
                arr.append(self.value(depth + 1))
                if self.take("]"):
                    return arr
                self.expect(",")
        for lit, v in (("true", True), ("false", False), ("null", None)):
            if self.take(lit):
                return v
        m = _NUMBER.match(self.s, self.i)
        if not m:
            raise self.error("expected a value")
        self.i = m.end()
        num = m.group()
        if m.group(2) or m.group(3):
            f = float(num)
            if f in (float("inf"), float("-inf")):
                raise self.error(f"number {num} is outside the range of a double")
            return f
        return int(num)


def parse_tool_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Parse ``<|tool_call>call:NAME{...}<tool_call|>`` calls from decoded text (special tokens kept).
    Raises ``ValueError`` when the text is not a sequence of well-formed calls; text after the calls
    that is only a stop marker is ignored. This is also what a post-hoc parser (vLLM's) does with
    free text, so the benchmark uses it for the unconstrained baseline."""
    p = _Parser(text.strip())
    calls: list[tuple[str, dict[str, Any]]] = []
    open_, close = MARKER_TOKENS["call_open"], MARKER_TOKENS["call_close"]
    while p.i < len(p.s):
        if p.s.startswith(MARKER_TOKENS["response"], p.i):
            break
        p.expect(open_)
        p.expect("call:")
        m = TOOL_NAME.match(p.s, p.i)
        if not m:
            raise p.error("expected a tool name")
        p.i = m.end()
        if not p.s.startswith("{", p.i):
            raise p.error("expected '{'")
        args = p.value()
        p.expect(close)
        calls.append((m.group(), args))
    if not calls:
        raise ValueError("no tool call in the text")
    return calls


def control_token_id(tokenizer: Any, token: str) -> int | None:
    """The id of a single-token ``token`` in ``tokenizer``, or None (no full-vocabulary copy: a
    262k ``get_vocab()`` costs seconds)."""
    try:
        tid = tokenizer.convert_tokens_to_ids(token)
    except Exception:  # noqa: BLE001 - tokenizers without the method or with odd inputs
        return None
    if not isinstance(tid, int) or tid < 0:
        return None
    try:
        back = tokenizer.convert_ids_to_tokens(tid)
    except Exception:  # noqa: BLE001
        return None
    return tid if back == token else None
