"""Property tests of constrained decoding with the strategies in ``dgemma_struct.testing``: every
output validates (jsonschema, and pydantic for models), every failure is a typed error."""
from __future__ import annotations

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgemma_struct import generate
from dgemma_struct.api import constraint_for
from dgemma_struct.errors import DgemmaStructError, GenerationFailed, GenerationTimeout, LengthError
from dgemma_struct.testing import constrained_values, json_schemas, pydantic_models, schema_instances

FAST = settings(max_examples=15, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
PROMPTS = ["Answer as JSON.", "Extract the fields as JSON.\nAda is 36 and likes blue.", "Give JSON now."]


@FAST
@given(json_schemas())
def test_generated_schemas_are_well_formed_and_compile(rt, schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    constraint_for(schema, rt)


@settings(max_examples=10, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_schemas_are_satisfiable(data):
    schema = data.draw(json_schemas(max_depth=1))
    jsonschema.validate(data.draw(schema_instances(schema)), schema)


# A random-weight model can run out of tokens or repairs; that must be a typed *generation* error,
# never a schema error for a schema the strategy produced, and most examples must succeed.
GENERATION_ERRORS = (LengthError, GenerationFailed, GenerationTimeout)


def test_every_output_validates_every_failure_is_typed(rt):
    outcomes = []

    @FAST
    @given(json_schemas(), st.sampled_from(PROMPTS), st.integers(0, 1000))
    def check(schema, prompt, seed):
        try:
            res = generate(prompt, schema, runtime=rt, max_new_tokens=96, seed=seed, return_details=True)
        except GENERATION_ERRORS as err:
            outcomes.append(type(err).__name__)
            return
        jsonschema.validate(res.value, schema)
        assert res.stats.finish_reason == "stop"
        outcomes.append("ok")

    check()
    assert outcomes.count("ok") >= len(outcomes) // 2, outcomes


def test_pydantic_models_roundtrip(rt):
    outcomes = []

    @FAST
    @given(pydantic_models(), st.integers(0, 1000))
    def check(model, seed):
        try:
            value = generate(PROMPTS[0], model, runtime=rt, max_new_tokens=96, seed=seed)
        except GENERATION_ERRORS as err:
            outcomes.append(type(err).__name__)
            return
        assert type(value) is model
        jsonschema.validate(value.model_dump(mode="json"), model.model_json_schema())
        outcomes.append("ok")

    check()
    assert outcomes.count("ok") >= len(outcomes) // 2, outcomes


def test_constrained_values_strategy(rt):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    seen = []

    @settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(constrained_values(schema, runtime=rt, prompts=PROMPTS, max_new_tokens=32, on_error="return"))
    def check(value):
        assert isinstance(value, DgemmaStructError) or isinstance(value["ok"], bool)
        seen.append(value)

    check()
    assert any(not isinstance(v, DgemmaStructError) for v in seen), seen
