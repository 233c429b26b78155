import os
from pathlib import Path

import pytest

GEMMA4_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gemma4-tokenizer"


@pytest.fixture(scope="session")
def gemma4_tokenizer():
    """The rebuilt Gemma 4 tokenizer from ../shared (in CI a missing copy fails; it never skips there)."""
    if not (GEMMA4_DIR / "tokenizer.json").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{GEMMA4_DIR} is missing in CI")
        pytest.skip("../shared/data/gemma4-tokenizer is not next to this clone")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GEMMA4_DIR))
