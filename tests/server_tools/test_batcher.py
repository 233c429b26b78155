"""The server's batcher runs a tool constraint with a ChatPrompt as it is (what the wiring in
docs/tools.md relies on): diffusion mode, the server's default, on the real-shape checkpoint."""
import asyncio
import json

import jsonschema
from openai.types.chat import ChatCompletion

from dgemma_struct.server.batcher import Batcher
from dgemma_struct.server.tool_calls import chat_choice, chat_prompt, compile_for, tool_request_of

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a"]}}}


def test_batcher_runs_a_tool_request(real_shape_runtime):
    rt = real_shape_runtime
    tr = tool_request_of({"tools": [ADD], "tool_choice": "required", "parallel_tool_calls": False})
    prompt = chat_prompt([{"role": "user", "content": "add 1"}], tr)
    constraint = compile_for(tr, rt)
    batcher = Batcher(rt, max_repairs=1).start()
    try:
        row = asyncio.run(batcher.submit(prompt, constraint, max_new_tokens=24, seed=3, timeout_s=300))
    finally:
        batcher.stop()
    c = ChatCompletion.model_validate({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                                       "choices": [chat_choice(0, row, tr)]})
    calls = c.choices[0].message.tool_calls
    assert c.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "add"
    jsonschema.validate(json.loads(calls[0].function.arguments), ADD["function"]["parameters"])
