"""A batched constrained canvas gives each row exactly what it gets alone (embedded model).

Before the fix, a row whose denoising the stopper ended before the batch's last row committed its
unchecked positions (it looked inactive at the canvas end) and was then repaired alone."""
import pytest
from pydantic import BaseModel

from dgemma_struct import generate, generate_batch


class Person(BaseModel):
    name: str
    age: int
    email: str


PROMPTS = ["Extract the name, age and email as JSON.\nMarie Curie is 66 and writes to marie@example.com.",
           "Extract the name, age and email as JSON.\nAda Lovelace, 36, ada@lovelace.org.",
           "Extract the name, age and email as JSON.\nAlan Turing (41) can be reached at alan@turing.uk today.",
           "Extract as JSON.\nBob is 5. bob@x.io"]


@pytest.mark.parametrize("seed", [0, 7])
def test_batched_rows_equal_single_rows(embedded_runtime, seed):
    batch = generate_batch(PROMPTS, Person, runtime=embedded_runtime, seed=seed)
    singles = [generate(p, Person, runtime=embedded_runtime, seed=seed, return_details=True) for p in PROMPTS]
    assert [r.text for r in batch] == [r.text for r in singles]
    assert all(isinstance(r.value, Person) for r in batch)
    assert sum(r.stats.repairs for r in batch) <= sum(r.stats.repairs for r in singles)
    # a row's output does not depend on its neighbours
    pair = generate_batch(PROMPTS[2:], Person, runtime=embedded_runtime, seed=seed)
    assert [r.text for r in pair] == [r.text for r in batch[2:]]
