"""model.py's BatchKVCache: rows of different lengths that join and leave a running batch
give every row the logits it gets decoded alone with the plain KVCache, for every position
encoding and attention variant model.py offers."""

import pytest
import torch

from model import GPT, BatchKVCache, GPTConfig, KVCache

VARIANTS = [
    dict(pos_encoding="learned"),
    dict(pos_encoding="rope", n_kv_head=2),  # grouped-query
    dict(pos_encoding="rope", n_kv_head=1, attention="reference"),  # multi-query, the formula
    dict(pos_encoding="sinusoidal", attention="reference"),
    dict(pos_encoding="rope", n_kv_head=2, qk_norm=True, attention="matmul"),  # the products, per-row masks
    dict(pos_encoding="none", qk_norm=True, norm="rmsnorm", mlp="swiglu"),
    dict(pos_encoding="learned", norm_placement="post", n_kv_head=2),
]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
JOIN_AT = [0, 2, 3]  # the step at which each prompt joins the batch
STEPS = 9


def alone(model, prompt, steps):
    """Greedy decoding of one prompt with the plain KVCache: the logits of every step."""
    cache = KVCache(model.config.n_layer, model.config.block_size)
    logits = model.next_token_logits(torch.tensor([prompt]), cache)
    out = [logits[0]]
    for _ in range(steps - 1):
        token = logits.argmax(-1, keepdim=True)  # (1, 1)
        logits = model.next_token_logits(token, cache)
        out.append(logits[0])
    return out


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
@torch.no_grad()
def test_rows_joining_and_leaving_match_decoding_alone(variant):
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=32, vocab_size=40, **variant)
    model = GPT(config).eval()
    lasts = [STEPS, STEPS - 1, 4]  # how many steps each row runs: rows leave at different steps
    expected = [alone(model, p, n) for p, n in zip(PROMPTS, lasts)]
    cache = BatchKVCache(config.n_layer, config.block_size, 0)
    running, got, tokens = [], {i: [] for i in range(len(PROMPTS))}, None
    for step in range(STEPS + 3):
        logits = []
        if running:  # one new token per running row, each at its own position
            logits = list(model.next_token_logits(tokens, cache))
        for i, at in enumerate(JOIN_AT):
            if at == step:  # a new row: its prompt runs alone, then its cache rows join
                row = BatchKVCache(config.n_layer, config.block_size, 1)
                logits.append(model.next_token_logits(torch.tensor([PROMPTS[i]]), row)[0])
                cache.append(row)
                running.append(i)
        for i, row_logits in zip(running, logits):
            got[i].append(row_logits)
        stay = [r for r, i in enumerate(running) if len(got[i]) < lasts[i]]
        cache.keep(stay)
        running = [running[r] for r in stay]
        tokens = torch.stack([logits[r].argmax(-1) for r in stay]).view(-1, 1) if stay else None
    assert cache.length.shape == (0, 1)
    for i, p in enumerate(PROMPTS):
        assert len(got[i]) == lasts[i]
        for a, b in zip(got[i], expected[i]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_padding_columns_are_never_seen():
    """Garbage in the padding columns past a row's length changes nothing."""
    torch.manual_seed(1)
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=20, pos_encoding="rope")
    model = GPT(config).eval()
    with torch.no_grad():
        cache = BatchKVCache(1, 16, 0)
        for prompt in ([1, 2], [3, 4, 5, 6, 7]):
            row = BatchKVCache(1, 16, 1)
            model.next_token_logits(torch.tensor([prompt]), row)
            cache.append(row)
        before = model.next_token_logits(torch.tensor([[8], [9]]), cache)
        cache.length -= 1
        cache.k[0][0, :, 3:].normal_(0, 100)  # row 0 holds 3 tokens: the columns past them are padding
        cache.v[0][0, :, 3:].normal_(0, 100)
        after = model.next_token_logits(torch.tensor([[8], [9]]), cache)
    torch.testing.assert_close(before, after)


def test_each_steps_positions_and_mask_follow_the_rows_and_none_where_all_rows_see_every_key():
    """BatchKVCache works out a step's positions and mask once for all layers: they must
    follow every change of `length` (the step's `+= T`, keep, append), and the mask is None
    only where one new token comes on rows of one length (each then sees every key)."""
    cache = BatchKVCache(2, 16, 2)
    cache.length = torch.tensor([[3], [3]])
    columns, end, mask = cache.step_positions(1, "cpu")
    assert columns.tolist() == [[3], [3]] and end == 4 and mask is None
    assert cache.attention_mask(1, "cpu") is None
    cache.length += 1  # what GPT._hidden does after the last layer: the next step's positions
    columns, end, mask = cache.step_positions(1, "cpu")
    assert columns.tolist() == [[4], [4]] and end == 5 and mask is None
    cache.length[1] = 2  # rows of different lengths: row 1 must not see columns 3 and 4
    cache.length = cache.length.clone()
    mask = cache.attention_mask(1, "cpu")
    assert mask.tolist() == [[[[True] * 5]], [[[True, True, True, False, False]]]]
    _, end, mask = cache.step_positions(2, "cpu")  # two new tokens: the causal part is masked too
    assert end == 6 and mask[0, 0].tolist() == [[True] * 5 + [False], [True] * 6]
    cache.keep([1])
    assert cache.step_positions(1, "cpu")[0].tolist() == [[2]] and cache.attention_mask(1, "cpu") is None
