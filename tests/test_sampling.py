"""sampling.py: each filter on hand-made logits, without a model."""

import math

import pytest
import torch

from gptkit.generation.sampling import choose_next_token, filter_min_p, filter_top_k, filter_top_p


def logits_of(*probs):
    return torch.tensor([probs]).log()  # (1, V) logits whose softmax is `probs`


def kept(filtered):
    return torch.isfinite(filtered[0]).nonzero().flatten().tolist()


def test_greedy_and_top_k_1_are_argmax():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    argmax = logits.argmax(-1)
    assert torch.equal(choose_next_token(logits, temperature=0), argmax)
    assert torch.equal(choose_next_token(logits, top_k=1, generator=torch.Generator().manual_seed(1)), argmax)
    assert torch.equal(choose_next_token(logits, top_p=1e-6, generator=torch.Generator().manual_seed(1)), argmax)
    assert choose_next_token(logits, temperature=0).dtype == torch.long


def test_values_below_float32s_range_are_greedy_or_refused():
    """1e-300 is 0 in float32: such a temperature divided the logits into NaN, and such a
    top_p dropped every token (each a 500 from serve.py). Both give the argmax now."""
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))
    argmax = logits.argmax(-1)
    for kwargs in (dict(temperature=1e-300), dict(temperature=5e-324), dict(temperature=1e-7),
                   dict(top_p=1e-300), dict(top_p=5e-324), dict(top_p=1e-300, temperature=2.0)):
        assert torch.equal(choose_next_token(logits, generator=torch.Generator().manual_seed(1), **kwargs), argmax)
    for penalty in (1e-300, 0.009, 101, 1e300):
        with pytest.raises(ValueError, match="repetition_penalty=.* between 0.01 and 100"):
            choose_next_token(logits, repetition_penalty=penalty)
    every_token = torch.arange(50).repeat(8, 1)  # (8, 50): all already present
    for penalty in (0.01, 100):  # the range's ends on large logits: still a distribution to sample
        token = choose_next_token(logits * 1e4, repetition_penalty=penalty, previous_tokens=every_token,
                                  generator=torch.Generator().manual_seed(1))
        assert token.shape == (8,) and bool(((token >= 0) & (token < 50)).all())


def test_top_k_keeps_the_k_largest():
    assert kept(filter_top_k(logits_of(0.1, 0.4, 0.2, 0.3), 2)) == [1, 3]
    assert kept(filter_top_k(logits_of(0.1, 0.4, 0.2, 0.3), 10)) == [0, 1, 2, 3]  # k > V keeps all


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = logits_of(0.05, 0.5, 0.15, 0.3)
    assert kept(filter_top_p(logits, 0.5)) == [1]  # 0.5 alone reaches 0.5
    assert kept(filter_top_p(logits, 0.79)) == [1, 3]  # 0.8 >= 0.79
    assert kept(filter_top_p(logits, 0.81)) == [1, 2, 3]  # 0.8 < 0.81: one more
    assert kept(filter_top_p(logits, 1.0)) == [0, 1, 2, 3]


def test_min_p_keeps_tokens_near_the_top():
    logits = logits_of(0.05, 0.5, 0.15, 0.3)
    assert kept(filter_min_p(logits, 0.5)) == [1, 3]  # threshold 0.25
    assert kept(filter_min_p(logits, 0.2)) == [1, 2, 3]  # threshold 0.1


def test_repetition_penalty_as_in_ctrl():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    previous = torch.tensor([[0, 1, 1]])
    # token 0 (positive) is divided, token 1 (negative) multiplied: greedy moves to token 2
    assert choose_next_token(logits, temperature=0, repetition_penalty=4.0, previous_tokens=previous).item() == 2
    assert choose_next_token(logits, temperature=0, repetition_penalty=1.5, previous_tokens=previous).item() == 0
    from gptkit.generation.sampling import apply_repetition_penalty

    torch.testing.assert_close(apply_repetition_penalty(logits, previous, 2.0), torch.tensor([[1.0, -4.0, 1.0, 0.5]]))


def test_samples_follow_the_distribution():
    probs = (0.7, 0.2, 0.1)
    logits = logits_of(*probs).expand(4000, 3)
    tokens = choose_next_token(logits, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    torch.testing.assert_close(freq, torch.tensor(probs), atol=0.03, rtol=0)
    # temperature 2 flattens: p ∝ p^(1/2)
    flat = torch.tensor([math.sqrt(p) for p in probs])
    tokens = choose_next_token(logits, temperature=2.0, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    torch.testing.assert_close(freq, flat / flat.sum(), atol=0.03, rtol=0)


def test_filtered_tokens_are_never_sampled():
    logits = logits_of(0.4, 0.3, 0.2, 0.1).expand(2000, 4)
    tokens = choose_next_token(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}
    tokens = choose_next_token(logits, min_p=0.6, generator=torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {0, 1}


def test_same_generator_seed_same_tokens():
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(3))
    a = choose_next_token(logits, top_p=0.9, generator=torch.Generator().manual_seed(7))
    b = choose_next_token(logits, top_p=0.9, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(temperature=-1), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p"),
     (dict(top_p=1.5), "top_p"), (dict(min_p=2.0), "min_p"), (dict(repetition_penalty=0), "repetition_penalty")],
)
def test_bad_options_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        choose_next_token(torch.randn(1, 5), **kwargs)


def test_top_k_0_is_no_limit_as_in_hugging_face():
    logits = torch.randn(3, 50)
    draws = [choose_next_token(logits, top_k=k, generator=torch.Generator().manual_seed(5)) for k in (0, None)]
    assert torch.equal(draws[0], draws[1])
