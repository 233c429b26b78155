"""A bounded Hypothesis fuzz of adversarial schemas against a real server subprocess: every
answer is a 200 with a valid value (or finish_reason "length") or a typed 4xx, within a time
bound, and the server stays up."""
from __future__ import annotations

import json
import time

import httpx
import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EDGE_INTS = st.sampled_from([0, -1, 1, 2 ** 31, -(2 ** 63), -(2 ** 63) + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64,
                             -(2 ** 64), 10 ** 30])
NUMBERS = st.one_of(EDGE_INTS, st.integers(-10 ** 6, 10 ** 6),
                    st.floats(allow_nan=False, allow_infinity=False, width=64))
LEAF = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "number"])},
                          optional={"minimum": NUMBERS, "maximum": NUMBERS, "multipleOf": st.sampled_from(
                              [0.1, 1, 3, 1e-308, 2 ** 63]), "const": NUMBERS}),
    st.fixed_dictionaries({"type": st.just("string")},
                          optional={"minLength": st.integers(0, 5), "maxLength": st.integers(0, 8),
                                    "pattern": st.sampled_from(["^a+$", "^(a|b)*c$", "[", "^\\d{3}$"]),
                                    "format": st.sampled_from(["email", "date", "uuid", "nonsense"])}),
    st.fixed_dictionaries({"enum": st.lists(NUMBERS | st.text(max_size=4), min_size=0, max_size=4)}),
    st.fixed_dictionaries({"const": NUMBERS | st.text(max_size=4) | st.booleans()}),
    st.just({"$ref": "#"}), st.just({"$ref": "#/$defs/missing"}), st.just({"type": "boolean"}),
    st.just({"not": {"$ref": "#"}}), st.just({}),
)
SCHEMAS = st.recursive(LEAF, lambda inner: st.one_of(
    st.fixed_dictionaries({"type": st.just("object"),
                           "properties": st.dictionaries(st.sampled_from("abcde"), inner, max_size=3)},
                          optional={"required": st.lists(st.sampled_from("abcde"), max_size=3, unique=True),
                                    "additionalProperties": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                          optional={"minItems": st.integers(0, 3), "maxItems": st.integers(0, 3),
                                    "uniqueItems": st.booleans()}),
    st.fixed_dictionaries({k: st.lists(inner, min_size=1, max_size=3)
                           for k in ["anyOf"]}),
    st.fixed_dictionaries({"allOf": st.lists(inner, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"if": inner, "then": inner}),
), max_leaves=6)


def test_fuzzed_schemas_get_valid_values_or_typed_4xx(real_server):
    url, proc = real_server
    seen = {"ok": 0, "length": 0, "4xx": 0}

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(schema=SCHEMAS)
    def one(schema):
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/chat/completions", timeout=120,
                       json={"messages": [{"role": "user", "content": "JSON please."}], "max_tokens": 24,
                             "guided_json": schema})
        assert time.monotonic() - t0 < 90
        assert proc.poll() is None, f"the server died on {schema}"
        assert r.status_code in (200, 400, 422), (schema, r.status_code, r.text[:300])
        if r.status_code == 200:
            choice = r.json()["choices"][0]
            if choice["finish_reason"] == "stop":
                value = json.loads(choice["message"]["content"])
                try:
                    jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
                except jsonschema.exceptions.RefResolutionError:
                    pass
                except RecursionError:   # our validator must have stopped this; jsonschema's own cannot
                    pass
                seen["ok"] += 1
            else:
                assert choice["finish_reason"] == "length"
                seen["length"] += 1
        else:
            err = r.json()["error"]
            assert err["code"] and err["message"] and len(r.content) < 4096, r.text
            seen["4xx"] += 1

    one()
    assert sum(seen.values()) >= 30
    assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
