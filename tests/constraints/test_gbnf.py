"""``Grammar(text)`` accepts GBNF/EBNF as well as Lark (issue #12), errors with line/column for both."""
from __future__ import annotations

import pytest

from dgemma_struct.constraints import Grammar, compile_constraint
from dgemma_struct.errors import GrammarError

# vLLM's EBNF sample (tests/conftest.py ``sample_sql_ebnf``-style, Apache-2.0)
SQL_GBNF = '''
root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
'''

CALC_GBNF = r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= [0-9]+ | "(" expr ")"
'''


def test_gbnf_compiles_and_matches(hf_tok):
    c = compile_constraint(Grammar(SQL_GBNF), tokenizer=hf_tok)
    assert c.kind == "grammar" and "gbnf" in c.description
    assert c.matches("SELECT col_1  from table_2  where col_2 = 1 ")
    assert not c.matches("SELECT col_3  from table_2  where col_2 = 1 ")
    calc = compile_constraint(Grammar(CALC_GBNF), tokenizer=hf_tok)
    assert calc.matches("1+(23-4)") and not calc.matches("1+") and not calc.matches("(1")
    w = calc.canvas_walker()
    assert w.walk(calc.tokenize("12+3")).n_valid == len(calc.tokenize("12+3"))


def test_gbnf_file(hf_tok, tmp_path):
    p = tmp_path / "calc.gbnf"
    p.write_text(CALC_GBNF)
    assert compile_constraint(Grammar(str(p)), tokenizer=hf_tok).matches("7-(1)")


def test_lark_still_lark(hf_tok):
    c = compile_constraint(Grammar('start: "a" B\nB: /[0-9]+/\n'), tokenizer=hf_tok)
    assert c.description == "lark grammar" and c.matches("a12")


def test_gbnf_errors_have_line_and_column(hf_tok):
    with pytest.raises(GrammarError, match=r"line 4, column 1\): Expected .\)."):
        compile_constraint(Grammar('root ::= a\na ::= "x"\nb ::= "y" ( "z"\n'), tokenizer=hf_tok)
    with pytest.raises(GrammarError, match="not found"):
        compile_constraint(Grammar('root ::= missing\n'), tokenizer=hf_tok)
    with pytest.raises(GrammarError, match="root"):
        compile_constraint(Grammar('start ::= "x"\n'), tokenizer=hf_tok)


def test_lark_errors_have_line_and_column(hf_tok):
    with pytest.raises(GrammarError, match=r"line 2"):
        compile_constraint(Grammar('start: "a"\nfoo: ( "b"\n'), tokenizer=hf_tok)
