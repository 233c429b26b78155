"""Tool calls on the embedded model, which speaks Gemma 4's dialect and was trained on native calls:
through the Python API every call is valid, and on requests like its training data it picks the right
tool and copies the arguments (held-out values)."""
import jsonschema
import pytest

from dgemma_struct import generate_tool_calls
from dgemma_struct.testing import embedded_runtime  # noqa: F401  (a session-scoped fixture)
from dgemma_struct.training.dialect_corpus import TOOLS

REQUESTS = [
    ("What is the weather in Lisbon for the next 4 days?", "get_weather", {"city": "Lisbon", "days": 4}),
    ("Track ORD-31337 please.", "track_order", {"order_id": "ORD-31337"}),
    ("Convert 250 EUR to JPY.", "convert_currency", {"amount": 250, "source": "EUR", "target": "JPY"}),
    ("Save Nina Ricci with number 415-555-0199.", "add_contact", {"name": "Nina Ricci", "phone": "415-555-0199"}),
]


@pytest.mark.parametrize("mode", ["ar", "diffusion"])
def test_embedded_model_calls_the_right_tool_with_valid_arguments(embedded_runtime, mode):
    tools = [TOOLS[n] for n in ("get_weather", "track_order", "convert_currency", "add_contact")]
    right = names = 0
    for i, (prompt, name, args) in enumerate(REQUESTS):
        res = generate_tool_calls(prompt, tools, tool_choice="required", runtime=embedded_runtime, mode=mode,
                                  seed=i, max_new_tokens=64)
        assert res.calls and res.finish_reason == "tool_calls"
        for call in res.calls:
            jsonschema.validate(call.arguments, TOOLS[call.name]["function"]["parameters"])
        right += [(c.name, c.arguments) for c in res.calls] == [(name, args)]
        names += [c.name for c in res.calls] == [name]
    # measured on the held-out tool prompts (docs/tools.md): AR copies ~99% of arguments, diffusion ~52%
    assert names >= 3 and right >= (3 if mode == "ar" else 1), (names, right)
