"""Tool calling, the verb: :func:`generate_tool_calls`."""
from __future__ import annotations

from typing import Any, Sequence

from dgemma_struct.api import generate
from dgemma_struct.errors import InvalidRequestError
from dgemma_struct.prompts import ChatPrompt
from dgemma_struct.runtime import DiffusionRuntime
from dgemma_struct.tools.constraint import ToolCallResult, compile_tool_calls


def generate_tool_calls(prompt_or_messages: Any, tools: Sequence[Any], *, tool_choice: Any = "auto",
                        parallel_tool_calls: bool = True, runtime: Any = None, **opts: Any) -> ToolCallResult:
    """Let the model call the declared tools; every returned call names a declared tool and its
    arguments validate against that tool's schema (or a typed error is raised).

    ``prompt_or_messages``: a user string or chat messages (``role: "tool"`` results included); the
    declarations are rendered into the system turn by the checkpoint's chat template. Other options
    are those of :func:`dgemma_struct.generate` (``max_new_tokens``, ``mode``, ``seed``, ...).
    ``confidence=True``: ``result.confidence`` is ``{"": p}``, the probability of the whole call
    text under the constraint (docs/confidence.md; per-argument confidence is not computed yet)."""
    if not isinstance(prompt_or_messages, str) and not (
            isinstance(prompt_or_messages, (list, tuple)) and all(isinstance(m, dict) for m in prompt_or_messages)):
        raise InvalidRequestError(f"prompt_or_messages must be a string or a list of chat messages (dicts), not "
                                  f"{type(prompt_or_messages).__name__}")
    rt = runtime if runtime is not None else DiffusionRuntime.default()
    c = compile_tool_calls(tools, rt.tokenizer, tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                           stop_token_ids=rt.eos_token_ids, vocab_size=rt.model.config.text_config.vocab_size)
    messages = ([{"role": "user", "content": prompt_or_messages}] if isinstance(prompt_or_messages, str)
                else list(prompt_or_messages))
    prompt = ChatPrompt(messages=messages, tools=[t.to_openai() for t in c.tools.values()])
    opts.pop("return_details", None)
    res = generate(prompt, c, runtime=rt, return_details=True, **opts)
    out: ToolCallResult = res.value
    out.stats = res.stats
    out.confidence = res.confidence
    if out.calls:
        out.stats.finish_reason = "tool_calls"
    return out
