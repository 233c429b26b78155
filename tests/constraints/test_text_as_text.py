"""``Constraint.matches`` encodes text as text (issue 23): special-token spellings typed in a string
(``<eos>``, ``<|turn>``, ``<table>``) are never turned into control tokens."""
from __future__ import annotations

from dgemma_struct.constraints import compile_constraint

SCHEMA = {"type": "object", "properties": {"h": {"type": "string"}}}
TEXT = '{"h":"<table> and <eos> and <|turn> as text"}'


def test_special_spellings_typed_as_text_match(gemma4_tokenizer):
    c = compile_constraint(SCHEMA, gemma4_tokenizer)
    assert c.matches(TEXT)
    ids = c.tokenize(TEXT)
    assert not set(ids) & set(gemma4_tokenizer.all_special_ids)
    assert gemma4_tokenizer.decode(ids) == TEXT  # encoded the way the model's output is decoded


def test_special_spellings_as_regex_and_choice(gemma4_tokenizer):
    from dgemma_struct import Choice, Regex
    assert compile_constraint(Regex(r"<eos>[a-z]+"), gemma4_tokenizer).matches("<eos>abc")
    assert compile_constraint(Choice(["<|turn>", "<eos>"]), gemma4_tokenizer).matches("<|turn>")
