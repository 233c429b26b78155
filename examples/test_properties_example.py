"""Property-test your own prompts against the embedded model (copy into your test suite).

Run::

    pytest examples/test_properties_example.py

``constrained_values`` draws values from constrained decoding (a prompt from your list, a seed);
the properties hold for every draw: each value validates, and any failure is a typed
``DgemmaStructError`` (``on_error="return"`` hands it to the test to assert on).
"""
from __future__ import annotations

import re
import pytest
from hypothesis import HealthCheck, given, settings
from pydantic import BaseModel, Field

from dgemma_struct import DgemmaStructError, Regex
from dgemma_struct.testing import constrained_values, embedded_model_available
from dgemma_struct.testing import embedded_runtime  # noqa: F401  (a session-scoped pytest fixture)

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="the embedded checkpoint is not installed")


class Contact(BaseModel):
    name: str = Field(max_length=60)
    phone: str = Field(pattern=r"^\d{3}-\d{3}-\d{4}$")
    city: str = Field(max_length=40)


PROMPTS = [
    "Read the text and give name, phone and city in JSON.\nText: Our contact in Toronto is Quinn Silva, "
    "reachable at 707-879-8364.",
    "Read the text and give name, phone and city in JSON.\nText: Call Ada Byron in Lisbon on 555-123-4567.",
]
EXAMPLES = settings(max_examples=6, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@EXAMPLES
@given(constrained_values(Contact, prompts=PROMPTS, max_new_tokens=96, on_error="return"))
def test_contacts_validate_or_fail_typed(contact):
    if isinstance(contact, DgemmaStructError):
        return                                   # typed: the caller can handle it
    assert isinstance(contact, Contact)
    assert re.fullmatch(r"\d{3}-\d{3}-\d{4}", contact.phone)


@EXAMPLES
@given(constrained_values(Regex(r"\d{4}-\d{2}-\d{2}"), prompts=["What date is mentioned? Answer as YYYY-MM-DD.\n"
                                                                "The contract ends on July 20, 2014."],
                          max_new_tokens=24))
def test_dates_match_the_pattern(date):
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)


def test_the_fixture_is_the_embedded_model(embedded_runtime):  # noqa: F811
    assert embedded_runtime.name == "dgemma-struct-embedded"
