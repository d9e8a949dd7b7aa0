"""gptkit/evals/scoring.py: sliding windows score every token once; bits per byte; byte lengths."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gptkit.evals import scoring
from gptkit.data.tokenizer import CharTokenizer, GPT2Tokenizer
from model import GPT, GPTConfig


@pytest.mark.parametrize("n", [2, 5, 33, 100])
@pytest.mark.parametrize("block_size,stride", [(1, 1), (4, 1), (4, 3), (8, 8), (16, 5), (32, 32)])
def test_every_target_is_scored_once_with_the_promised_context(n, block_size, stride):
    seen = []
    for doc, start, length, skip in scoring.plan_windows([n], block_size, stride).tolist():
        assert doc == 0 and 1 <= length <= block_size and 0 <= skip < length
        targets = range(start + 1 + skip, start + length + 1)
        seen += targets
        # each target has all the context the window holds before it
        assert all(t - start >= min(t, block_size - stride + 1) for t in targets)
    assert sorted(seen) == seen == list(range(1, n))


def test_documents_are_scored_separately_and_short_ones_skipped():
    windows = scoring.plan_windows([10, 1, 0, 3], 4, 2)
    assert set(windows[:, 0].tolist()) == {0, 3}
    assert sum(int(w[2] - w[3]) for w in windows) == 9 + 2


def tiny_model(vocab_size, block_size, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=block_size, vocab_size=vocab_size, dropout=0.0)).eval()


@pytest.mark.parametrize("block_size,stride,batch_size", [(8, 8, 3), (8, 3, 4), (16, 1, 64), (5, 2, 1)])
def test_scored_count_and_loss_match_a_per_token_loop(block_size, stride, batch_size):
    """The batched windows against scoring each target on its own, with the context
    the plan promises (the last block_size tokens of its window)."""
    rng = np.random.default_rng(block_size * stride)
    ids = rng.integers(0, 11, size=57)
    model = tiny_model(11, block_size)
    total = scoring.score_windows(lambda x, y: model(x, y), lambda _, s, n: ids[s : s + n],
                                  scoring.plan_windows([len(ids)], block_size, stride), block_size=block_size,
                                  batch_size=batch_size, byte_lengths=torch.ones(11, dtype=torch.int64), device="cpu",
                                  autocast=torch.autocast("cpu", enabled=False))
    score = scoring.Score.from_tensor(total)
    assert score.tokens == score.bytes == len(ids) - 1
    expected = 0.0
    with torch.no_grad():
        for doc, start, length, skip in scoring.plan_windows([len(ids)], block_size, stride).tolist():
            for t in range(start + 1 + skip, start + length + 1):
                logits, _ = model(torch.tensor(ids[start:t])[None])
                expected += F.cross_entropy(logits[0, -1:], torch.tensor([ids[t]])).item()
    assert score.nats == pytest.approx(expected, rel=1e-5)


def test_bits_per_byte_of_a_char_model_on_ascii_is_nats_over_ln2():
    text = "To be, or not to be: that is the question.\n" * 3
    tok = CharTokenizer(sorted(set(text)))
    ids = np.array(tok.encode(text))
    model = tiny_model(tok.vocab_size, 16)
    total = scoring.score_windows(lambda x, y: model(x, y), lambda _, s, n: ids[s : s + n],
                                  scoring.plan_windows([len(ids)], 16, 16), block_size=16, batch_size=4,
                                  byte_lengths=scoring.byte_lengths_tensor(tok, "cpu"), device="cpu",
                                  autocast=torch.autocast("cpu", enabled=False))
    s = scoring.Score.from_tensor(total)
    assert s.tokens == s.bytes == len(text) - 1
    assert s.bpb == s.loss / math.log(2) * s.tokens / s.bytes
    assert s.ppl == pytest.approx(math.exp(s.loss))


def test_char_byte_lengths_count_utf8_bytes():
    tok = CharTokenizer(["a", "é", "€", "𝄞", "\n"])
    assert tok.token_byte_lengths().tolist() == [1, 2, 3, 4, 1]
    assert tok.token_byte_lengths().dtype == np.int64


def test_gpt2_byte_lengths_sum_to_the_text_bytes(tiktoken_available):
    tok = GPT2Tokenizer()
    lengths = tok.token_byte_lengths()
    assert lengths.shape == (50257,) and lengths.dtype == np.int64 and lengths[tok.eot_id] == 0
    assert tok.token_byte_lengths() is lengths  # computed once
    text = "Héllo wörld — naïve café 🙂 and 東京\n"
    ids = tok.encode(text)
    assert lengths[ids].sum() == len(text.encode("utf-8"))  # multi-byte characters split across tokens too


def test_bits_per_byte_definition():
    assert scoring.bits_per_byte(math.log(2) * 10, 10) == 1.0
    assert math.isnan(scoring.bits_per_byte(1.0, 0))
