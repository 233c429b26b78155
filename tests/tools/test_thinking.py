"""Thinking before a constrained answer (Gemma 4's thought channel) on the Gemma 4 tokenizer."""
import pytest

from dgemma_struct.constraints import Choice, Grammar, Regex, compile_constraint
from dgemma_struct.constraints.thinking import with_thinking
from dgemma_struct.errors import ConstraintError, InvalidRequestError

STOPS = [1, 106, 50]
T = "<|channel>thought\n{}<channel|>"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]}


@pytest.mark.parametrize("spec, answer, bad", [
    (SCHEMA, '{"a":1}', '{"a":-1}'),
    (Regex(r"\d{3}-\d{4}"), "555-1234", "55-1234"),
    (Choice(["yes", "no"]), "no", "maybe"),
    (Grammar('start: "x" NUM\nNUM: /[0-9]+/'), "x42", "y42"),
])
def test_optional_thought_then_the_constrained_answer(gemma4_tokenizer, spec, answer, bad):
    c = with_thinking(compile_constraint(spec, gemma4_tokenizer, stop_token_ids=STOPS), gemma4_tokenizer)
    with_thought = T.format("Let me think: 2 + 2 = 4.\nOK") + answer
    assert c.matches(with_thought) and c.matches(answer)
    assert not c.matches(T.format("hmm") + bad)
    reasoning, rest = c.split_reasoning(with_thought)
    assert reasoning == "Let me think: 2 + 2 = 4.\nOK" and rest == answer
    assert c.validate_text(with_thought).ok


def test_required_thought_and_the_token_cap(gemma4_tokenizer):
    inner = compile_constraint(SCHEMA, gemma4_tokenizer, stop_token_ids=STOPS)
    c = with_thinking(inner, gemma4_tokenizer, required=True, max_thinking_tokens=3)  # <= 12 characters
    assert c.matches(T.format("short") + '{"a":1}')
    assert not c.matches('{"a":1}')
    assert not c.matches(T.format("a thought far longer than six tokens, word after word after word") + '{"a":1}')


def test_plain_constraint_never_opens_a_thought(gemma4_tokenizer):
    inner = compile_constraint(SCHEMA, gemma4_tokenizer, stop_token_ids=STOPS)
    assert not inner.grammar_accepts(T.format("x") + '{"a":1}')
    w = inner.canvas_walker()
    assert w.walk([100]).n_valid == 0  # <|channel> is masked out


def test_bad_options_and_tokenizers(gemma4_tokenizer):
    from dgemma_struct.testing import gemma3_style_tokenizer

    inner = compile_constraint(SCHEMA, gemma4_tokenizer, stop_token_ids=STOPS)
    with pytest.raises(InvalidRequestError):
        with_thinking(inner, gemma4_tokenizer, max_thinking_tokens=0)
    toy = gemma3_style_tokenizer()
    with pytest.raises(ConstraintError, match="thought-channel"):
        with_thinking(compile_constraint(SCHEMA, toy), toy)
