"""Fixtures for the constraint tests: a small byte-level BPE trained on the fly (no downloads)."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"   # the full sets, when present
BUNDLED = Path(__file__).resolve().parents[1] / "data"                    # small copies (tests/data/README.md)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<unk>"]


def make_tokenizer(vocab_size: int = 1200):
    from dgemma_struct.testing import gemma3_style_tokenizer

    rnd = random.Random(0)
    words = ["name", "age", "id", "items", "value", "true", "false", "null", "type", "email", "date", "city",
             "tags", "price", "count", "hello", "world", "foo", "bar", "a", "b", "x", "y", "description"]
    texts = []
    for _ in range(400):
        d = {rnd.choice(words): rnd.choice([rnd.randint(-1000, 10 ** 6), round(rnd.random() * 100, 3),
                                            rnd.choice(words), [rnd.choice(words) for _ in range(3)], None, True,
                                            {"a": rnd.choice(words)}]) for _ in range(rnd.randint(1, 4))}
        texts.append(json.dumps(d))
        texts.append(json.dumps(d, separators=(",", ":")))
    texts += ["a = 1, b = 2", "x+y*(3-4)/5", "The quick brown fox jumps over the lazy dog.", "yes no maybe",
              "2024-01-31T12:00:00Z", "user@example.com"]
    return gemma3_style_tokenizer(vocab_size, texts)


@pytest.fixture(scope="session")
def hf_tok():
    return make_tokenizer()


@pytest.fixture(scope="session")
def data_dir():
    """``../shared/data`` when it sits next to the checkout, else the bundled fixtures: never a skip."""
    shared = SHARED.resolve()
    hidden = os.environ.get("DGEMMA_STRUCT_NO_SHARED", "") not in ("", "0")   # see tests/conftest.py
    return shared if shared.is_dir() and not hidden else BUNDLED
