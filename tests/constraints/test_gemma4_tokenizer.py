"""The tokenizer bridge on the Gemma 4 tokenizer (../shared/data/gemma4-tokenizer, issue #10)."""
from __future__ import annotations

import json
import time

import pytest

from dgemma_struct.constraints import Choice, Grammar, Regex, compile_constraint, default_stop_token_ids
from dgemma_struct.constraints.tokenizer import get_tokenizer_info

STOPS = [1, 106, 50]  # the published generation config's eos_token_id


@pytest.fixture(scope="module")
def info(gemma4_tokenizer):
    return get_tokenizer_info(gemma4_tokenizer, STOPS)


def test_bridge_equals_llguidance_converter_id_for_id(gemma4_tokenizer, info):
    from llguidance.hf import from_tokenizer
    ref = from_tokenizer(gemma4_tokenizer, eos_token=STOPS)
    assert info.vocab_size == ref.vocab_size == 262_144
    n = ref.vocab_size
    ours, theirs = info.lltok, ref
    assert [i for i in range(n) if ours.decode_bytes([i]) != theirs.decode_bytes([i])] == []
    ref_special = {i for i in range(n) if theirs.is_special_token(i)}
    assert {i for i in range(n) if ours.is_special_token(i)} == ref_special
    assert info.special_token_ids == frozenset(ref_special | set(STOPS))
    flagged = {i for i, t in gemma4_tokenizer.added_tokens_decoder.items() if t.special}
    assert flagged <= ref_special and len(ref_special - flagged) <= 1  # llguidance also flags the 0xFF byte piece
    for i, text in [(107, b"\n"), (108, b"\n\n"), (236743, b" ")]:
        if ours.decode_bytes([i]) == text:
            assert i not in info.special_token_ids


def test_stop_ids(gemma4_tokenizer, info):
    assert default_stop_token_ids(gemma4_tokenizer) == [1, 106]
    assert info.stop_token_ids == tuple(STOPS) and info.forbidden_token_ids.isdisjoint(STOPS)
    assert {105, 100, 101, 98, 52}.issubset(info.forbidden_token_ids)


def test_scan_cached_per_object(gemma4_tokenizer, info):
    t0 = time.perf_counter()
    again = get_tokenizer_info(gemma4_tokenizer, STOPS)
    assert again is info and time.perf_counter() - t0 < 0.05
    t0 = time.perf_counter()
    via_lltok = get_tokenizer_info(info.lltok, STOPS)
    assert get_tokenizer_info(info.lltok, STOPS) is via_lltok  # no re-scan of the vocabulary
    assert time.perf_counter() - t0 < 5.0


def test_newline_specs(info):
    r = compile_constraint(Regex(r"[a-z]+\n[0-9]+\n"), tokenizer=info)
    assert r.matches("abc\n42\n") and not r.matches("abc 42\n")
    ch = compile_constraint(Choice(["line one\nline two", "single"]), tokenizer=info)
    assert ch.matches("line one\nline two") and ch.matches("single") and not ch.matches("line one")
    g = compile_constraint(Grammar('start: line+\nline: /[a-z ]+/ "\\n"\n'), tokenizer=info)
    for text in ["hello\n", "a b\ncd\n", "one\ntwo\nthree\n"]:
        assert g.matches(text), text
    assert not g.matches("no newline")
    # the tokenizer's own newline pieces are ordinary text that masks allow
    lines = compile_constraint(Regex(r"(ab\n*)+"), tokenizer=info)
    ids = lines.tokenize("ab\n\nab\n")
    assert 108 in ids and 107 in ids
    assert lines.canvas_walker().walk(ids).n_valid == len(ids)


def test_special_spellings_are_text(info):
    c = compile_constraint({"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
                           tokenizer=info)
    text = json.dumps({"s": "before <eos> and <turn|> after"}, separators=(",", ":"))
    ids = c.tokenize(text)
    assert not set(ids) & info.special_token_ids
    assert c.matches(text)
    assert c.validate_text(text).value == {"s": "before <eos> and <turn|> after"}
    assert compile_constraint(Regex(r"<eos>"), tokenizer=info).matches("<eos>")


def test_synthetic_tokenizer_has_the_real_control_tokens(real_gemma4_tokenizer):
    """The synthetic Gemma-4-shaped tokenizer (the stand-in on a bare clone) agrees with the rebuilt
    real one on size, every added control token's id and flags, the chat template's output shape and
    the tokenizer_config's special-token names. Needs ../shared: skips, saying so, without it."""
    from transformers import AutoTokenizer

    from dgemma_struct.testing import gemma4_shaped_tokenizer_dir

    real = real_gemma4_tokenizer
    synth = AutoTokenizer.from_pretrained(str(gemma4_shaped_tokenizer_dir()))
    assert len(synth) == len(real) == 262_144
    assert {i: t.content for i, t in synth.added_tokens_decoder.items()} == \
        {i: t.content for i, t in real.added_tokens_decoder.items()}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(synth, name) == getattr(real, name), name
    for i in [107, 108, 138, 236743] + list(range(238, 494, 17)):   # newline / space runs, "▁", byte pieces
        assert synth.convert_ids_to_tokens(i) == real.convert_ids_to_tokens(i), i
    msgs = [{"role": "user", "content": "hi"}]
    rendered = [t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) for t in (synth, real)]
    assert rendered[0] == rendered[1]
    text = "Weather in Oslo: {\"temp\": 3}\n\n"
    assert synth.decode(synth.encode(text, add_special_tokens=False)) == text


def test_real_vocabulary_token_splits(real_gemma4_tokenizer):
    """Exact splits of the real rebuilt vocabulary (what the synthetic one does not reproduce)."""
    tok = real_gemma4_tokenizer
    assert tok.convert_ids_to_tokens(tok.encode("The quick brown fox", add_special_tokens=False)) == \
        ["The", "▁quick", "▁brown", "▁fox"]
    assert tok.encode("12", add_special_tokens=False) == [236770, 236778]   # digits one by one
