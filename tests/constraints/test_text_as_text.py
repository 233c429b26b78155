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


def _with_ordinary_table(tokenizer):
    """A copy of ``tokenizer`` with ``<table>`` as an ordinary (non-special) added token."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.add_tokens(["<table>"])   # special=False: split_special_tokens does not split it
    table_id = tok.get_added_vocab()["<table>"]
    assert table_id in tok.encode("<table>", add_special_tokens=False, split_special_tokens=True)
    return tok, table_id


def test_ordinary_added_token_typed_as_text_matches(gemma4_tokenizer):
    tok, table_id = _with_ordinary_table(gemma4_tokenizer)
    c = compile_constraint(SCHEMA, tok)
    assert c.matches(TEXT)
    ids = c.tokenize(TEXT)
    assert table_id not in ids and not set(ids) & set(tok.all_special_ids)
    assert tok.decode(ids) == TEXT
    assert c.grammar_accepts(TEXT)


def test_ordinary_added_token_embedded_tokenizer():
    from pathlib import Path

    from transformers import AutoTokenizer

    import dgemma_struct.embedded as embedded

    tok, table_id = _with_ordinary_table(AutoTokenizer.from_pretrained(str(Path(embedded.__file__).parent)))
    c = compile_constraint(SCHEMA, tok)
    assert c.matches(TEXT)
    ids = c.tokenize(TEXT)
    assert table_id not in ids and tok.decode(ids) == TEXT
    # text without any added token's spelling is encoded exactly as the tokenizer encodes it
    plain = '{"h":"plain words 123"}'
    assert c.tokenize(plain) == tok.encode(plain, add_special_tokens=False)
