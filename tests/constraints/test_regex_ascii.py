"""``\\d \\w \\s`` (and negations) mean their ASCII classes, as in vLLM / xgrammar, Outlines and ECMA-262.

The rewrite (:mod:`dgemma_struct.constraints.regex_ascii`) is checked three ways: its exact output on
tricky spellings, the language of the compiled regex against Python's ``re.fullmatch(p, s, re.ASCII)``
on generated strings full of Unicode digits, letters and spaces, and the values ``generate_regex``
returns on the tiny runtime.
"""
from __future__ import annotations

import itertools
import random
import re

import llguidance as llg
import pytest

from dgemma_struct.constraints import Regex, compile_constraint
from dgemma_struct.constraints.regex_ascii import ascii_classes
from dgemma_struct.errors import RegexError

S = r"\x09-\x0D\x20"


@pytest.mark.parametrize("pattern, expected", [
    (r"\d{3}", "[0-9]{3}"),
    (r"\D\w\W\s\S", rf"[^0-9][0-9A-Za-z_][^0-9A-Za-z_][{S}][^{S}]"),
    (r"[\d.]+", "[[0-9].]+"),
    (r"[^\d]", "[^[0-9]]"),
    (r"[\D]", "[[^0-9]]"),
    (r"[^\D]", "[^[^0-9]]"),
    (r"[\w&&\D]", "[[0-9A-Za-z_]&&[^0-9]]"),
    (r"[a--\d]", "[a--[0-9]]"),          # set difference, not a range
    (r"[\d-]", "[[0-9]-]"),              # trailing '-' is a literal
    (r"[-\d]", "[-[0-9]]"),              # leading '-' is a literal
    (r"[]\d]", "[][0-9]]"),              # leading ']' is a literal
    (r"[^]\d]", "[^][0-9]]"),
    (r"[\]\d]", r"[\][0-9]]"),
    (r"[\d-z]", r"[\d-z]"),              # a class as a range endpoint: Rust's error is kept
    (r"[a-\d]", r"[a-\d]"),
    (r"\\d", r"\\d"),                    # an escaped backslash, then 'd'
    (r"\\\d", r"\\[0-9]"),
    (r"[\\\d]", r"[\\[0-9]]"),
    (r"\p{Nd}\pL\P{L}", r"\p{Nd}\pL\P{L}"),
    (r"[[:digit:]][[:^space:]]", r"[[:digit:]][[:^space:]]"),
    (r"\x{64}\u0064\.\-\n\t", r"\x{64}\u0064\.\-\n\t"),
    (r"\bword\B", r"\bword\B"),
    ("plain [a-z]+ text", "plain [a-z]+ text"),
    ("trailing \\", "trailing \\"),
    (r"(?i)\w\W[\w]", r"(?i)(?-i:[0-9A-Za-z_])(?-i:[^0-9A-Za-z_])[[0-9A-Za-z_]]"),
    (r"(?-i)\w", "(?-i)[0-9A-Za-z_]"),   # turning folding off is no reason to wrap
    (r"(?i)\d\s", rf"(?i)[0-9][{S}]"),     # no case in digits and spaces
])
def test_rewrite_exact(pattern, expected):
    assert ascii_classes(pattern) == expected


# ------------------------------------------------------------------ the language, against re.ASCII
# valid in Python and Rust with the same meaning apart from the shorthand classes
PATTERNS = [
    r"\d{3}", r"\D+", r"\w+", r"\W", r"\s\S", r"\S+\s?", r"[\d.]+", r"[^\d]", r"[\D]", r"[^\D]x?",
    r"[\w-]+", r"[\s\S]", r"[^\s\d]+", r"\\d", r"[\\\d]+", r"a\d?b", r"(\d|\s)+", r"[]\d]+", r"(?i)\w+",
    r"(?i)\W", r"(?x) \d \s", r"[^\W\d]+", r"\w+@\w+\.\w{2,3}",
    r"((25[0-5]|(2[0-4]|1\d|[1-9]|)\d)\.){3}(25[0-5]|(2[0-4]|1\d|[1-9]|)\d)",  # vLLM's sample_regex.txt
]
# ASCII digits / letters / spaces, the neighbours the rewrite must not touch, and non-ASCII look-alikes
ALPHABET = (list("09aZk_s.-\\]@x b") + ["\t", "\n", "\x0b", "\x0c", "\r", "2", "5", "1"]
            + ["\u0663", "\u0661", "\U0001e4f5", "\uff15",           # Arabic-Indic / Nag Mundari / fullwidth digits
               "\u00e9", "\u00df", "\u212a", "\u017f", "\u03b1",     # letters, Kelvin sign, long s
               "\u00a0", "\u2003", "\u3000", "\u2028", "\x1c", "\x85"])  # Unicode spaces


def _strings(pattern: str, rnd: random.Random, n: int) -> list[str]:
    out = {"", "123", "1.2.3.4", "192.168.0.1", "\u0661\u0662\u0663", "169.\U0001e4f5.5\u0663.\u0661",
           "a b", "a\u00a0b", "ab", "a5b", "a\u0665b", "x 1", "1 \t", "\u00e9t\u00e9", "a@b.cd", "\\d", "\u212a"}
    out.update("".join(t) for t in itertools.product(ALPHABET[:12], repeat=1))
    while len(out) < n:
        k = rnd.randint(1, 6)
        out.add("".join(rnd.choice(ALPHABET) for _ in range(k)))
    # mutate ASCII matches into Unicode look-alikes, where the two semantics part
    ascii_hits = [s for s in out if re.fullmatch(pattern, s, re.ASCII)]
    swap = {"0": "\u0660", "1": "\u0661", "2": "\u0662", "5": "\u0665", "a": "\u00e0", " ": "\u00a0", "k": "\u212a"}
    for s in ascii_hits[:40]:
        out.add("".join(swap.get(ch, ch) for ch in s))
    return sorted(out)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_language_is_the_ascii_language(hf_tok, pattern):
    c = compile_constraint(Regex(pattern), tokenizer=hf_tok, use_cache=False)
    rnd = random.Random(pattern)
    strings = _strings(pattern, rnd, 250)
    wrong = [s for s in strings if c.grammar_accepts(s) != bool(re.fullmatch(pattern, s, re.ASCII))]
    assert not wrong, [(s, bool(re.fullmatch(pattern, s, re.ASCII))) for s in wrong[:5]]
    # both outcomes occur, so the comparison is not vacuous
    assert any(re.fullmatch(pattern, s, re.ASCII) for s in strings)
    assert not all(re.fullmatch(pattern, s, re.ASCII) for s in strings)


def test_the_strings_tell_unicode_from_ascii(hf_tok):
    """Without the rewrite llguidance accepts Unicode digits: the generated strings catch that."""
    pattern = PATTERNS[-1]
    g = llg.LLMatcher.grammar_from_regex(pattern)
    c = compile_constraint(Regex(r"[0-9]"), tokenizer=hf_tok)   # only for its tokenizer
    m0 = llg.LLMatcher(c.tokenizer_info.lltok, g, log_level=0)
    s = "169.\U0001e4f5.5\u0663.\u0661"
    m = m0.deep_copy()
    assert m.consume_tokens(c.tokenize(s)) and m.consume_token(c.eos_token_id)   # Unicode \d before
    assert not compile_constraint(Regex(pattern), tokenizer=hf_tok).grammar_accepts(s)
    assert compile_constraint(Regex(pattern), tokenizer=hf_tok).grammar_accepts("169.254.5.1")


@pytest.mark.parametrize("pattern", [r"[\d-z]", r"[a-\d]", r"\bx", r"\Qa.b\E", "a(b"])
def test_invalid_patterns_stay_invalid_and_errors_name_the_original(hf_tok, pattern):
    with pytest.raises(RegexError) as ei:
        compile_constraint(Regex(pattern), tokenizer=hf_tok, use_cache=False)
    assert repr(pattern)[:60] in str(ei.value)


# ------------------------------------------------------------------ JSON Schema pattern / patternProperties
# llguidance's JSON-Schema compiler already reads patterns as ECMA-262 (\d, \w ASCII; \s ECMA's
# Unicode spaces), so the grammar copy is not rewritten: these tests hold llguidance to that.
def test_schema_pattern_is_ecma(hf_tok):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": r"^\d{3}$"},
                                               "word": {"type": "string", "pattern": r"^\w+\s\w+$"}},
              "required": ["code", "word"], "additionalProperties": False}
    c = compile_constraint(schema, tokenizer=hf_tok, use_cache=False)
    assert c.grammar_accepts('{"code":"123","word":"ab c_9"}')
    assert not c.grammar_accepts('{"code":"\u0661\u0662\u0663","word":"ab c"}')
    assert not c.grammar_accepts('{"code":"123","word":"\u00e9t\u00e9 x"}')
    assert c.grammar_accepts('{"code":"123","word":"a\u00a0b"}')     # ECMA's \s takes U+00A0
    assert c.matches('{"code":"123","word":"a\u00a0b"}')             # and so does the validator
    assert c.semantic_keywords == []


def test_schema_pattern_properties_keys_are_ecma(hf_tok):
    schema = {"type": "object", "patternProperties": {r"^\d+$": {"type": "integer"}},
              "additionalProperties": False}
    c = compile_constraint(schema, tokenizer=hf_tok, use_cache=False)
    assert c.grammar_accepts('{"12":1}')
    assert not c.grammar_accepts('{"\u0661\u0662":1}')


# ------------------------------------------------------------------ generated values
@pytest.fixture(scope="module")
def tiny():
    from dgemma_struct.testing import tiny_runtime
    return tiny_runtime()


@pytest.mark.parametrize("pattern", [r"\d{3}", r"\w{4}\s\w{2}", r"[\d.]{5}", PATTERNS[-1]])
def test_generate_regex_values_are_ascii(tiny, pattern):
    from dgemma_struct.api import generate_regex
    values = generate_regex("x", pattern, runtime=tiny, seed=0, n=4, max_new_tokens=48)
    for v in values:
        assert re.fullmatch(pattern, v, re.ASCII), v
