"""Choosing the next token from the model's logits: temperature and the usual filters.

A pure function of a (B, V) batch of logits, so each rule can be tested without a
model. gptkit/generation/generate.py calls it once per new token. The steps, in order:

    1. repetition penalty on the raw logits (CTRL, Keskar et al. 2019)
    2. temperature 0 (or below MIN_TEMPERATURE): take the argmax, nothing else applies
    3. divide by the temperature
    4. top_k, then top_p (nucleus), then min_p: each removes tokens (logit -> -inf)
    5. sample one token from the softmax of what is left

    python -c "import torch, sampling; print(sampling.choose_next_token(torch.randn(2, 5), top_k=2))"
"""

import math

import torch

from model import filter_top_k  # the one top-k, model.generate's too


# The logits are float32 here. A temperature below MIN_TEMPERATURE is greedy: dividing by it
# would tell apart only logits closer than float32 can resolve, and one below float32's
# smallest number (1e-300) rounds to 0 and divides into NaN. A penalty is kept to a range
# where dividing or multiplying a model's logit by it stays far from float32's overflow to inf.
MIN_TEMPERATURE = 1e-6
PENALTY_RANGE = (0.01, 100.0)


def check_sampling_options(temperature=1.0, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0):
    """Raise ValueError naming the option when a value makes no sense."""
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature={temperature} must be a finite number >= 0 (0 means greedy)")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k={top_k} must be >= 1 (0 or None: no limit)")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (or None)")
    if min_p is not None and not 0 <= min_p <= 1:
        raise ValueError(f"min_p={min_p} must be in [0, 1] (or None)")
    low, high = PENALTY_RANGE
    if not low <= repetition_penalty <= high:
        raise ValueError(f"repetition_penalty={repetition_penalty} must be a finite number between {low:g} and "
                         f"{high:g} (1.0 means none)")


def apply_repetition_penalty(logits, previous_tokens, penalty):
    """CTRL's penalty: a token already present gets its logit divided by `penalty`
    when positive and multiplied by it when negative, so it always becomes less likely
    (Keskar et al. 2019, "CTRL", section 4.1)."""
    seen = torch.gather(logits, 1, previous_tokens)  # (B, T) logits of tokens already present
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, previous_tokens, seen)  # repeats write the same value


def filter_top_p(logits, p):
    """Nucleus sampling (Holtzman et al. 2019): keep the smallest set of most likely
    tokens whose probabilities add up to at least p."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of the tokens ranked above
    drop_sorted = mass_before >= p  # the set already reached p without this token
    drop_sorted[:, 0] = False  # the most likely token always stays, however small p is
    drop = drop_sorted.scatter(1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def filter_min_p(logits, min_p):
    """Keep tokens whose probability is at least min_p times the top token's
    (Nguyen et al. 2024, "min-p sampling")."""
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values  # (B, 1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def choose_next_token(
    logits,
    temperature=1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    repetition_penalty=1.0,
    previous_tokens=None,
    generator=None,
):
    """Pick one token per row of `logits` (B, V); returns a (B,) LongTensor.

    `previous_tokens` (B, T) are the ids the penalty applies to; `generator` is a
    torch.Generator on the logits' device, for reproducible sampling.
    """
    check_sampling_options(temperature, top_k, top_p, min_p, repetition_penalty)
    logits = logits.float()  # filters and softmax in fp32 whatever the model's dtype
    if repetition_penalty != 1.0 and previous_tokens is not None and previous_tokens.numel():
        logits = apply_repetition_penalty(logits, previous_tokens, repetition_penalty)
    if temperature < MIN_TEMPERATURE:  # 0, or too small to differ from it in float32
        return torch.argmax(logits, dim=-1)
    # Shift the best logit to 0 before dividing: a tiny temperature then sends the others
    # to -inf (greedy in the limit) instead of overflowing all of them to inf and NaN.
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if top_k and top_k < logits.size(-1):  # 0 and None are no limit (as Hugging Face); k >= V keeps every token
        logits = filter_top_k(logits, top_k)
    if top_p is not None and top_p < 1:
        logits = filter_top_p(logits, top_p)
    if min_p is not None and min_p > 0:
        logits = filter_min_p(logits, min_p)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)
