"""Lark grammars using llguidance-only syntax (issue 23): accepted where llguidance supports the
construct soundly (``&`` on terminals, ``{m,n}`` on rules and terminals); otherwise a GrammarError that
names the construct, never the generic "invalid Lark grammar" of stock lark."""
from __future__ import annotations

import pytest

from dgemma_struct import Grammar
from dgemma_struct.constraints import compile_constraint
from dgemma_struct.constraints.grammars import llg_only_syntax
from dgemma_struct.errors import GrammarError

ACCEPTED = [
    # (grammar, accepted texts, refused texts)
    ('start: A\nA: /[a-z]+/ & /[a-c]+/\n', ["a", "abc", "cab"], ["x", "abx", "", "1"]),
    ('start: item{2,3}\nitem: "a"\n', ["aa", "aaa"], ["a", "aaaa", ""]),
    ('start: A\nA: "ab"{2}\n', ["abab"], ["ab", "ababab"]),
    ('start: "x" item{1,} "y"\nitem: "a" | "b"\n', ["xay", "xabbay"], ["xy", "xcy"]),
]


@pytest.mark.parametrize("grammar, good, bad", ACCEPTED)
def test_llguidance_only_constructs_are_accepted_and_decide_strings(hf_tok, grammar, good, bad):
    c = compile_constraint(Grammar(grammar), hf_tok, use_cache=False)  # stock lark rejects every one
    for text in good:
        assert c.matches(text), (grammar, text)
    for text in bad:
        assert not c.matches(text), (grammar, text)


@pytest.mark.parametrize("grammar, construct", [
    ('start: A\nA: ~/a+/\n', "~ (negation)"),       # llguidance would accept "aa" (+ the EOS token's bytes)
    ('start: A\nA: ~"ab"\n', "~ (negation)"),
    ('start: a & b\na: "x"\nb: "x"\n', "& (intersection)"),  # llguidance: & is for terminals only
])
def test_unsupported_uses_name_the_construct(hf_tok, grammar, construct):
    with pytest.raises(GrammarError) as e:
        compile_constraint(Grammar(grammar), hf_tok, use_cache=False)
    msg = str(e.value)
    assert construct in msg and "llguidance-only syntax" in msg and "invalid Lark grammar" not in msg, msg


def test_plain_lark_errors_keep_line_and_column(hf_tok):
    with pytest.raises(GrammarError, match=r"invalid Lark grammar: .*line 2"):
        compile_constraint(Grammar('start: a\na: "x" )\n'), hf_tok, use_cache=False)
    # Lark's own repeat operator is not llguidance-only syntax
    c = compile_constraint(Grammar('start: "a" ~ 2..3\n'), hf_tok, use_cache=False)
    assert c.matches("aa") and c.matches("aaa") and not c.matches("a")


def test_constructs_inside_literals_and_comments_do_not_count():
    assert llg_only_syntax('start: "a&b" /x{2,3}/ "~" // & ~x {1,2}\n') == []
    assert llg_only_syntax('start: "a" ~ 2..3\n') == []
    assert llg_only_syntax('start: A{1,2}\nA: "a" & /b/\n') == ["{m,n} (bounded repeat)", "& (intersection)"]
