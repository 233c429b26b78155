"""Apply the docs/tools.md wiring (tool calls on the chat endpoint): `python tests/server_tools/apply_wiring.py src`."""
import sys
root = sys.argv[1] + "/dgemma_struct/server/"
def edit(name, pairs):
    p = root + name
    s = open(p).read()
    for a, b in pairs:
        assert a in s, (name, a[:80])
        s = s.replace(a, b, 1)
    open(p, "w").write(s)

edit("app.py", [
('''from .errors import APIError, api_error_for, error_body, safe_json_bytes
''', '''from .errors import APIError, api_error_for, error_body, safe_json_bytes
from .tool_calls import (chat_prompt, check_context, compile_for, completion_body, prepare_tokenizer, row_tokens,
                         sse_events, tool_request_of)
'''),
('''        if getattr(req, "tools", None):
            raise APIError(400, "tools are not supported; use response_format or structured_outputs",
                           param="tools", code="unsupported_parameter")
''', ''),
('''    async def run(self, req: Any, prompts: list[Any], *, chat: bool, request: Request | None = None) -> Any:''',
'''    async def run(self, req: Any, prompts: list[Any], *, chat: bool, request: Request | None = None,
                  tool_req: Any = None) -> Any:'''),
('''        thinking, think_param = thinking_of(req)
''', '''        thinking, think_param = thinking_of(req)
        use_tools = tool_req is not None and (tool_req.calls_possible or spec is None)
        if use_tools and thinking is not False:
            raise APIError(400, "thinking together with tool calls is not supported yet", param=think_param,
                           code="unsupported_parameter")
'''),
('''        grounded = self.grounding_of(req, spec, param)
        if grounded is not None:''', '''        grounded = None if use_tools else self.grounding_of(req, spec, param)
        if use_tools:
            stops = []
            loop = asyncio.get_running_loop()
            # the tokenizer set-up (once per process, seconds for 262k pieces) is not timed as a compile
            await loop.run_in_executor(self.compile_executor, prepare_tokenizer, self.runtime)
            try:
                constraint = await asyncio.wait_for(loop.run_in_executor(
                    self.compile_executor, compile_for, tool_req, self.runtime), self.config.compile_timeout_s)
            except asyncio.TimeoutError:
                raise APIError(400, "compiling the tool declarations took too long", param="tools",
                               code="constraint_too_complex") from None
            specs = [constraint] * len(prompts)
        elif grounded is not None:'''),
('''        n_prompt = await asyncio.to_thread(lambda: [self.prompt_tokens(p) for p in prompts])
''', '''        n_prompt = await asyncio.to_thread(lambda: [self.prompt_tokens(p) for p in prompts])
        if tool_req is not None:
            try:
                check_context(n_prompt[0], max_tokens, self.runtime.max_context, tool_req)
            except DgemmaStructError as err:
                raise api_error_for(err) from None
'''),
('''self.config.stream_live and ''', '''self.config.stream_live and not use_tools and '''),
('''        rows = [self._choice(r, stops) for r in results]
''', '''        if use_tools:
            rid = "chatcmpl-" + uuid.uuid4().hex[:24]
            prompt_total = sum(n_prompt) * n
            completion = sum(row_tokens(r, self.count_tokens) for r in results)
            created = int(time.time())
            if req.stream:
                include_usage = bool((req.stream_options or {}).get("include_usage"))
                usage = ({"prompt_tokens": prompt_total, "completion_tokens": completion,
                          "total_tokens": prompt_total + completion} if include_usage else None)
                return StreamingResponse(sse_events(results, tool_req, rid=rid, model=self.model_id, created=created,
                                                    usage=usage), media_type="text/event-stream")
            return _json(completion_body(results, tool_req, rid=rid, model=self.model_id, created=created,
                                         prompt_tokens=prompt_total, completion_tokens=completion))
        rows = [self._choice(r, stops) for r in results]
'''),
('''        return await state().run(body, [prompt_of_messages(body.messages)], chat=True, request=request)''', '''        _, param = spec_of(body)
        tool_req = tool_request_of(body, output_constraint=param)
        toolish = any(m.role in ("tool", "function") or (m.model_extra or {}).get("tool_calls")
                      or (m.model_extra or {}).get("function_call") for m in body.messages)
        prompt = chat_prompt(body.messages, tool_req) if (tool_req or toolish) else prompt_of_messages(body.messages)
        return await state().run(body, [prompt], chat=True, request=request, tool_req=tool_req)'''),
])
edit("errors.py", [('''    if isinstance(err, APIError):
        return err
''', '''    if isinstance(err, APIError):
        return err
    from .tool_calls import ToolRequestError

    if isinstance(err, ToolRequestError):
        return APIError(400, str(err), param=err.param, code=err.code)
''')])
edit("protocol.py", [('''    role: Literal["system", "developer", "user", "assistant", "tool"]''',
                      '''    role: Literal["system", "developer", "user", "assistant", "tool", "function"]''')])
print("wired")
