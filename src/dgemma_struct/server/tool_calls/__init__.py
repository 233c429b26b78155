"""Tool calling for the chat endpoint: OpenAI ``tools`` / ``tool_choice`` / ``parallel_tool_calls``
(and the legacy ``functions`` / ``function_call``) in, ``message.tool_calls`` (or the legacy
``message.function_call``) and streaming tool-call deltas out.

Pure functions, no server state, in three parts: :mod:`.request` (:func:`tool_request_of` on the
request body, :func:`compile_for` for the constraint), :mod:`.messages` (:func:`template_messages`
/ :func:`chat_prompt` on its messages) and :mod:`.answers` (:func:`chat_message` /
:func:`stream_chunks` on each result). Every bad input raises :class:`ToolRequestError` (a
:class:`~dgemma_struct.tools.ToolCallError`) carrying the OpenAI error ``param`` and ``code``;
:func:`api_error` turns it into the server's 400. See ``docs/tools.md``.
"""
from __future__ import annotations

from .answers import (FRAGMENT_CHARS, chat_choice, chat_message, completion_body, row_tokens, sse_events,
                      stream_chunks, tool_result_of)
from .messages import chat_prompt, new_call_id, template_messages
from .request import (TOOL_FIELDS, ToolRequest, ToolRequestError, api_error, check_context, compile_for,
                      prepare_tokenizer, tool_request_of)

__all__ = ["ToolRequest", "ToolRequestError", "tool_request_of", "template_messages", "chat_prompt", "compile_for",
           "check_context", "prepare_tokenizer", "chat_message", "chat_choice", "stream_chunks", "api_error",
           "new_call_id", "tool_result_of", "row_tokens", "completion_body", "sse_events", "TOOL_FIELDS",
           "FRAGMENT_CHARS"]
