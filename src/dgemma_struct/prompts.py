"""What a request may hold before it reaches the model: prompt forms (a user string, chat messages,
a :class:`ChatPrompt`), and the checks of seeds, sampling options and token budgets.

>>> chat_messages("Hi")
([{'role': 'user', 'content': 'Hi'}], {})
>>> check_seed(-1)
Traceback (most recent call last):
...
dgemma_struct.errors.InvalidRequestError: seed must be None or an integer in [0, 2**63), got -1
"""
from __future__ import annotations

import math
import numbers
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

from dgemma_struct.errors import InvalidRequestError, PromptTooLongError


@dataclass(frozen=True)
class ChatPrompt:
    """Chat messages plus what the checkpoint's chat template renders besides them: tool
    declarations (OpenAI ``tools`` entries, rendered into the system turn) and template options
    such as ``enable_thinking``."""

    messages: Sequence[dict]
    tools: Sequence[dict] | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)


Prompt = Union[str, Sequence[dict], ChatPrompt]
MODES = ("diffusion", "ar")

MAX_SEED = 2**63 - 1
MAX_TEMPERATURE = 100.0


def fresh_seed() -> int:
    """A seed from the OS's entropy pool (what ``seed=None`` means in the constrained API)."""
    return secrets.randbelow(2**62)


def check_seed(seed: Any, name: str = "seed") -> None:
    """``None`` or an integer in ``[0, 2**63)``; anything else is an :class:`InvalidRequestError`."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) <= MAX_SEED:
        raise InvalidRequestError(f"{name} must be None or an integer in [0, 2**63), got {seed!r}")


def check_sampling(temperature: Any, top_p: Any) -> None:
    """``temperature``: ``None`` or a finite number in ``[0, 100]``; ``top_p``: in ``(0, 1]``."""
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
                                    or not math.isfinite(temperature) or not 0 <= temperature <= MAX_TEMPERATURE):
        raise InvalidRequestError(f"temperature must be None or a number in [0, {MAX_TEMPERATURE:g}], "
                                  f"got {temperature!r}")
    if (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not math.isfinite(top_p)
            or not 0 < top_p <= 1):
        raise InvalidRequestError(f"top_p must be a number in (0, 1], got {top_p!r}")


def check_max_new_tokens(max_new_tokens: Any) -> None:
    """A positive integer; anything else is an :class:`InvalidRequestError`."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens <= 0:
        raise InvalidRequestError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")


def check_prompt_ids(encoded: Any, vocab_size: int) -> None:
    """A non-empty list of non-empty token-id lists, every id an integer in ``[0, vocab_size)``."""
    if (isinstance(encoded, (str, bytes)) or not isinstance(encoded, Sequence) or not encoded
            or any(isinstance(e, (str, bytes)) or not isinstance(e, Sequence) or len(e) == 0 for e in encoded)):
        raise InvalidRequestError("every prompt needs at least one token id")
    if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab_size
           for e in encoded for t in e):
        raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab_size})")


def _check_text(value: Any, what: str = "prompt") -> None:
    """Every string in ``value`` (nested lists/dicts) must be valid Unicode: no lone surrogates."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidRequestError(f"the {what} is not valid Unicode (a lone surrogate at character "
                                      f"{err.start})") from None
    elif isinstance(value, dict):
        for v in value.values():
            _check_text(v, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _check_text(v, what)


def _check_message(m: dict, i: int) -> dict:
    """A chat message: a string ``role``; ``content`` a string, a list of OpenAI-style text parts
    (joined), or absent/None (e.g. an assistant turn with tool calls)."""
    role, content = m.get("role"), m.get("content")
    if not isinstance(role, str) or not role:
        raise InvalidRequestError(f"message {i} needs a string 'role'")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise InvalidRequestError(f"message {i}: only text content parts are supported")
        return {**m, "content": "".join(p["text"] for p in content)}
    if content is None and "content" in m and not m.get("tool_calls"):
        raise InvalidRequestError(f"message {i} has no content")
    if content is not None and not isinstance(content, (str, dict)):
        raise InvalidRequestError(f"message {i} needs a string 'content', got {type(content).__name__}")
    if content is None and "content" not in m and not m.get("tool_calls"):
        raise InvalidRequestError(f"message {i} needs a 'content'")
    return m


#: tokens every chat turn costs at least (turn start, role, turn end), for the cheap length estimate
MIN_TOKENS_PER_MESSAGE = 3


def min_template_tokens(messages: Sequence[Any]) -> int:
    """A lower bound on a chat prompt's tokens, without running the template: every non-system turn
    costs :data:`MIN_TOKENS_PER_MESSAGE` (a system message may be folded into the first user turn).

    >>> min_template_tokens([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}])
    3
    """
    return MIN_TOKENS_PER_MESSAGE * sum(1 for m in messages if not (isinstance(m, dict) and
                                                                     m.get("role") in ("system", "developer")))


def chat_messages(prompt: Prompt, *, has_template: bool = True,
                  max_context: int | None = None) -> tuple[list[dict], dict[str, Any]]:
    """The checked chat messages of a prompt and the extra chat-template arguments (``tools`` and a
    :class:`ChatPrompt`'s template options). ``has_template``: whether the tokenizer has a chat
    template (without one, tools and template options cannot be rendered). ``max_context``: with a
    template, more messages than the context can hold even empty are a :class:`PromptTooLongError`
    at once, before the template runs (rendering is roughly quadratic in the message count)."""
    extra: dict[str, Any] = {}
    if isinstance(prompt, ChatPrompt):
        if prompt.tools:
            extra["tools"] = [dict(t) for t in prompt.tools]
        extra.update(prompt.template_kwargs)
        prompt = list(prompt.messages)
        if not has_template and extra:
            raise InvalidRequestError("this tokenizer has no chat template to render tools or template options")
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, Sequence) and all(isinstance(m, dict) for m in prompt) and prompt:
        messages = [_check_message(m, i) for i, m in enumerate(prompt)]
    else:
        raise InvalidRequestError("prompt must be a string or a non-empty list of chat messages")
    if has_template and max_context is not None and min_template_tokens(messages) > max_context:
        raise PromptTooLongError(f"{len(messages)} chat messages need at least {min_template_tokens(messages)} "
                                 f"tokens, more than the model's context of {max_context}")
    _check_text(messages)
    return messages, extra
