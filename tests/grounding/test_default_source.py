"""Grounded extraction's default source is the prompt's document part, not its instruction: with
"Extract the customer, email, order_id ..." on the first line, no value may be copied from it."""
import pytest

from dgemma_struct.errors import GroundingError
from dgemma_struct.grounding import generate_grounded, grounded_sources
from dgemma_struct.testing import embedded_model_available

INSTRUCTION = "Extract the customer, email, order_id and total as JSON."
DOC = "Order ORD-48213 was placed by Maria Keller (maria.keller@shop.net) for 129 EUR."


def test_text_prompt_grounds_in_the_text_after_the_instruction_line():
    assert grounded_sources(f"{INSTRUCTION}\n{DOC}") == (DOC,)
    assert grounded_sources(f"{INSTRUCTION}\n{DOC}\nSecond line.") == (f"{DOC}\nSecond line.",)


def test_document_then_instruction_and_instruction_colon_document():
    # the corpus's other shapes: the instruction closes the prompt, or opens one line before a colon
    assert grounded_sources(f"{DOC}\nReturn a JSON object with customer, email, order_id and total.") == (DOC,)
    assert grounded_sources(f"Convert to JSON with fields customer and total: {DOC}") == (DOC,)
    # neither line reads as an instruction: the whole text is the document
    assert grounded_sources(f"Name: Maria Keller\n{DOC}") == (f"Name: Maria Keller\n{DOC}",)


def test_a_document_label_on_the_instruction_line_starts_the_document():
    """"Fields: a, b. Source: <first line of the document>": the document's first line (with its number)
    is not dropped with the instruction (a required integer of it was a GroundingError), and the
    field names before the label stay out."""
    prompt = "Return only JSON. Fields: customer, total. Source: * Total: 129\n* Customer: Maria Keller"
    assert grounded_sources(prompt) == ("* Total: 129\n* Customer: Maria Keller",)
    assert grounded_sources(f"Read the text and give the total in JSON.\nText: {DOC}") == (DOC,)
    # the document starts at the first label: a label word in its own first line stays in it
    prompt = "Return JSON. Fields: total. Source: Note: 129 paid\nby Maria"
    assert grounded_sources(prompt) == ("Note: 129 paid\nby Maria",)
    # a label word inside the instruction, with nothing after it, is not a document
    assert grounded_sources(f"Extract the total from the message text:\n{DOC}") == (DOC,)


def test_one_line_prompt_is_its_own_document():
    assert grounded_sources(DOC) == (DOC,)
    assert grounded_sources(f"{DOC}\n   ") == (f"{DOC}\n   ",)   # nothing after the first line


def test_chat_prompts():
    user = {"role": "user", "content": f"{INSTRUCTION}\n{DOC}"}
    assert grounded_sources([user]) == (DOC,)
    system = {"role": "system", "content": INSTRUCTION}
    doc_msg = {"role": "user", "content": f"Header line\n{DOC}"}
    assert grounded_sources([system, doc_msg]) == (f"Header line\n{DOC}",)   # instruction lives in system


def test_explicit_source_is_used_as_given():
    assert grounded_sources(f"{INSTRUCTION}\n{DOC}", source=INSTRUCTION) == (INSTRUCTION,)
    with pytest.raises(GroundingError):
        grounded_sources(f"{INSTRUCTION}\n   ", source="  ")


@pytest.mark.skipif(not embedded_model_available(), reason="embedded checkpoint missing")
def test_no_value_comes_from_the_instruction():
    schema = {"type": "object", "properties": {"customer": {"type": "string"}, "email": {"type": "string"},
                                               "order_id": {"type": "string"}},
              "required": ["customer", "email", "order_id"]}
    res = generate_grounded(f"{INSTRUCTION}\n{DOC}", schema, ground="strings", seed=0)
    assert res.sources == (DOC,)
    for span in res.spans:
        assert DOC[span.start:span.end] == span.text and span.text in DOC


@pytest.mark.parametrize("prompt", [
    # an instruction line then a colon: the document starts after it, its first line kept (it was lost)
    "Convert to JSON with fields customer and total: Customer: Maria Keller\nTotal: 129",
    "Record this order: Customer: Maria Keller\nTotal: 129",
    # several instruction lines close the text
    "Customer: Maria Keller\nTotal: 129\nExtract: customer and total\nFormat: JSON",
    # lead-ins before the verb
    "From the text, pull out customer and total.\nCustomer: Maria Keller\nTotal: 129",
    "Can you extract the order data? Fields: customer and total.\nCustomer: Maria Keller\nTotal: 129",
    "Using only the text, fill in customer and total.\nCustomer: Maria Keller\nTotal: 129",
    "Structured output please: customer, total.\nCustomer: Maria Keller\nTotal: 129",
    # what introduces the document: a short line ending in a colon, a label opening it
    "Here is an order record:\nCustomer: Maria Keller\nTotal: 129\nGive me a JSON object with customer and total.",
    "Document:\nCustomer: Maria Keller\nTotal: 129\n\nTask: extract customer, total. Respond with JSON.",
    "Given: Customer: Maria Keller\nTotal: 129\nOutput a JSON object containing customer and total.",
    "Return customer and total as JSON.\n\nInput:\nCustomer: Maria Keller\nTotal: 129",
])
def test_the_document_is_the_record_whatever_the_phrasing(prompt):
    """Phrasings of the held-out evaluation templates (issue #33): the default source is exactly the
    record's lines -- no instruction words, key lists or labels that introduce it, none of its lines lost."""
    assert grounded_sources(prompt) == ("Customer: Maria Keller\nTotal: 129",)

