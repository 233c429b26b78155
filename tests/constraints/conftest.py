"""Fixtures for the constraint tests: a small byte-level BPE trained on the fly (no downloads)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"   # the full sets, when present
BUNDLED = Path(__file__).resolve().parents[1] / "data"                    # small copies (tests/data/README.md)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<unk>"]


def make_tokenizer(vocab_size: int = 1200):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

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
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(texts, tr)
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>",
                                   unk_token="<unk>", additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])


@pytest.fixture(scope="session")
def hf_tok():
    return make_tokenizer()


@pytest.fixture(scope="session")
def data_dir():
    """``../shared/data`` when it sits next to the checkout, else the bundled fixtures: never a skip."""
    shared = SHARED.resolve()
    return shared if shared.is_dir() else BUNDLED
