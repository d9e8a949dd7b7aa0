"""The calculator a chat model calls (gptkit/generation/tools.py): arithmetic answered,
everything else one line "error: ..." given back quickly, never a hang or an exception."""

import time

import pytest

from gptkit.generation import tools
from gptkit.generation.tools import calculate


@pytest.mark.parametrize("expression, value", [
    ("1234*5678", "7006652"), ("7/2", "3.5"), ("-7//2", "-4"), ("7 % -3", "-2"), ("2**10", "1024"),
    ("((1+2))*-(3)", "-9"), ("+5 - -5", "10"), ("2**-1", "0.5"), ("1_000 * 2", "2000"), ("0.1+0.2", "0.30000000000000004"),
    ("2**0.5", "1.4142135623730951"), (" 12 *\t3 ", "36"), ("9" * 30 + "+1", "1" + "0" * 30),
])
def test_arithmetic_is_answered_as_python_computes_it(expression, value):
    assert calculate(expression) == value


HOSTILE = [
    # sizes that would take time or memory if computed: refused from their operands' sizes
    ("9**9**9", "too large"), ("10**10**10", "too large"), ("2**2**2**2**2", "too large"),
    ("(2**1000)**(2**1000)", "too large"), ("99999999999**99", "too large"), ("10**300*10**300", "too large"),
    ("2**1023*2.0", "too large"), ("1e308*10", "too large"), ("0.5**-5000", "too large"), ("1e400", "too large"),
    ("9" * 31, "longer than 30 digits"), ("1" * 201, "longer than 200"), ("-" * 150 + "1", "nested more than"),
    ("(" * 120 + "1" + ")" * 120, "longer than 200"), ("2" + "**2" * 60, "nested more than"),
    # not arithmetic
    ("__import__('os').system('true')", "only numbers"), ("x", "only numbers"), ("a.b", "only numbers"),
    ("(lambda: 1)()", "only numbers"), ("'s' * 3", "only numbers"), ("True + 1", "only numbers"),
    ("1j", "only numbers"), ("[1] * 9", "only numbers"), ("1 if 1 else 2", "only numbers"), ("abs(-1)", "only numbers"),
    ("(1).real", "only numbers"), ("{}", "only numbers"), ("...", "only numbers"), ("not 1", "only numbers"),
    ("1 < 2", "only numbers"), ("1 << 9999", "only numbers"), ("f'{1}'", "only numbers"),
    ("import os", "not an arithmetic expression"), ("1+", "not an arithmetic expression"), ("", "not an arithmetic"),
    ("1\x00", "not an arithmetic expression"), ("1; 2", "not an arithmetic expression"),
    # no real answer
    ("1/0", "division by zero"), ("5 % 0", "division by zero"), ("0**-1", "division by zero"), ("1.0 // 0.0", "division"),
    ("(-8)**(1/3)", "not a real number"),
]


@pytest.mark.parametrize("expression, words", HOSTILE)
def test_a_hostile_expression_is_one_line_error_within_a_bound(expression, words):
    start = time.perf_counter()
    answer = calculate(expression)
    assert time.perf_counter() - start < 0.1  # each is refused before any large work
    assert answer.startswith("error: ") and words in answer and "\n" not in answer, answer


def test_every_integer_on_the_way_stays_within_the_result_bound(monkeypatch):
    seen = []
    real = tools.apply
    monkeypatch.setattr(tools, "apply", lambda op, a, b: seen.append(real(op, a, b)) or seen[-1])
    for expression in ("3**1024", "(2**1000)*(2**30)", "7**360*7**3", "2**1000+2**1000+2**1000"):
        calculate(expression)
    assert seen and all(not isinstance(v, int) or v.bit_length() <= tools.MAX_RESULT_BITS for v in seen)


def test_the_time_limit_covers_the_whole_walk(monkeypatch):
    monkeypatch.setattr(tools, "TIME_LIMIT", -1.0)  # as if the walk had already run out of time
    assert calculate("1+1") == "error: took too long"


def test_a_closed_call_is_run_into_the_tokens_forced_into_the_reply():
    from gptkit.data.chat import special_ids
    from gptkit.data.tokenizer import CharTokenizer

    tokenizer = CharTokenizer(sorted(set("".join(e for e, _ in HOSTILE) + "0123456789 ")))
    special = special_ids(tokenizer.vocab_size, tools=True)
    for expression, _ in HOSTILE + [("1234*5678", None)]:
        reply = [*tokenizer.encode("x"), special["<|call|>"], *tokenizer.encode(expression), special["<|/call|>"]]
        start = time.perf_counter()
        call = tools.run_call(reply, tokenizer, special)
        assert time.perf_counter() - start < 0.1
        assert call["expression"] == expression and call["output"] == calculate(expression)
        forced = call["ids"][1:-1]
        assert call["ids"][0] == special["<|output|>"] and call["ids"][-1] == special["<|/output|>"]
        # the output as far as this character vocabulary can write it (an error's letters it lacks left out)
        assert tokenizer.decode(forced) == "".join(ch for ch in call["output"] if ch in tokenizer.chars)
    assert tools.run_call([special["<|/call|>"]], tokenizer, special)["output"].startswith("error: ")  # no <|call|>
