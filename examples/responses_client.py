"""OpenAI's Responses API against ``dgemma-struct serve``, with the stock ``openai`` SDK.

    python examples/responses_client.py                         # starts a server on the embedded model
    python examples/responses_client.py --base-url http://127.0.0.1:8000/v1   # or uses yours

Runs offline: without ``--base-url`` it serves the embedded model itself (uvicorn on 127.0.0.1, a
free port) for the length of the script. It shows ``responses.parse`` with a pydantic model,
``responses.stream`` with the SDK's stream helper, a function tool, and a custom tool whose free-form
input follows a Lark grammar (the decoder cannot write anything else).
"""
from __future__ import annotations

import argparse
import contextlib
import threading
import time
from typing import Iterator

import openai
from pydantic import BaseModel

MODEL = "dgemma-struct-embedded"
PROMPT = "Extract the name, age and email as JSON.\nYou can write to Julia Muller (45) at julia68@mail.org."
ARITHMETIC = 'start: NUM (("+" | "-") NUM)*\nNUM: /[0-9]{1,4}/'


class Person(BaseModel):
    name: str
    age: int
    email: str


@contextlib.contextmanager
def local_server() -> Iterator[str]:
    """The embedded model served on 127.0.0.1 (a free port) for the ``with`` block; yields the base URL."""
    import httpx
    import uvicorn

    from dgemma_struct.server import ServerConfig, create_app

    server = uvicorn.Server(uvicorn.Config(create_app(config=ServerConfig()), host="127.0.0.1", port=0,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    while httpx.get(url + "/health/ready", timeout=30).status_code != 200:   # model loaded, warm-up done
        time.sleep(0.1)
    try:
        yield url + "/v1"
    finally:
        server.should_exit = True
        thread.join(15)


def main(base_url: str, max_output_tokens: int = 96) -> dict:
    """Every call of the tour against ``base_url``; returns what it got (the test checks it)."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    out: dict = {}

    parsed = client.responses.parse(model=MODEL, input=PROMPT, text_format=Person,
                                    max_output_tokens=max_output_tokens)
    out["person"] = parsed.output_parsed                      # a Person, always valid
    print("parse:", out["person"])

    with client.responses.stream(model=MODEL, input=PROMPT, text_format=Person,
                                 max_output_tokens=max_output_tokens) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                print(event.delta, end="", flush=True)
        out["streamed"] = stream.get_final_response().output_parsed
    print()

    tools = [{"type": "function", "name": "get_weather", "strict": True,
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                             "additionalProperties": False}},
             {"type": "custom", "name": "calc", "description": "Adds and subtracts integers.",
              "format": {"type": "grammar", "syntax": "lark", "definition": ARITHMETIC}}]
    weather = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=tools,
                                      tool_choice={"type": "function", "name": "get_weather"},
                                      max_output_tokens=max_output_tokens)
    out["function_call"] = next(o for o in weather.output if o.type == "function_call")
    print("function_call:", out["function_call"].name, out["function_call"].arguments)

    calc = client.responses.create(model=MODEL, input="What is 12 plus 30?", tools=tools,
                                   tool_choice={"type": "custom", "name": "calc"}, max_output_tokens=max_output_tokens)
    out["custom_tool_call"] = next(o for o in calc.output if o.type == "custom_tool_call")
    print("custom_tool_call:", out["custom_tool_call"].name, repr(out["custom_tool_call"].input))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", help="an OpenAI-compatible server (default: serve the embedded model here)")
    args = ap.parse_args()
    if args.base_url:
        main(args.base_url)
    else:
        with local_server() as url:
            main(url)
