"""gptkit/generation/generate.py: the cached generation equals recomputation (and model.py's plain
generate), the cache policies past block_size, stop tokens, and TextStream's text."""

import pytest
import torch

from gptkit.generation import generate
from gptkit.data.tokenizer import CharTokenizer, tokenizer_from_dict
from model import GPT, GPTConfig

POS_ENCODINGS = ("learned", "sinusoidal", "rope", "none")
CHARS = sorted(set("\n !,.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))


def tiny_model(seed=0, **overrides):
    settings = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32)
    settings.update(overrides)
    torch.manual_seed(seed)
    return GPT(GPTConfig(**settings)).eval()


def generated(model, idx, max_new_tokens, **options):
    """idx (B, T) followed by every token generate_stream yields: (B, T + n)."""
    new = [t[:, None] for t in generate.generate_stream(model, idx, max_new_tokens, **options)]
    return torch.cat([idx] + new, dim=1)


@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_cached_greedy_equals_recomputation_past_block_size(pos_encoding):
    model = tiny_model(pos_encoding=pos_encoding, n_kv_head=2, qk_norm=pos_encoding == "rope")
    prompt = torch.randint(0, 37, (2, 5))
    cached = generated(model, prompt, 40, temperature=0)  # 45 tokens, block_size 16
    recomputed = generated(model, prompt, 40, temperature=0, use_cache=False)
    assert cached.shape == (2, 45)
    assert torch.equal(cached, recomputed)
    assert torch.equal(cached, model.generate(prompt, 40, temperature=0))  # nanoGPT's loop, in model.py


def test_prompt_longer_than_block_size_is_cropped():
    model = tiny_model(pos_encoding="rope")
    prompt = torch.randint(0, 37, (1, 30))
    out = generated(model, prompt, 5, temperature=0)
    assert torch.equal(out[:, :30], prompt)
    assert torch.equal(out, generated(model, prompt, 5, temperature=0, use_cache=False))
    assert torch.equal(out[:, 30], model(prompt[:, -16:])[0][:, -1].argmax(-1))


def test_shift_context_matches_until_the_window_fills():
    model = tiny_model(pos_encoding="rope")
    prompt = torch.randint(0, 37, (2, 3))
    exact = generated(model, prompt, 30, temperature=0)
    shifted = generated(model, prompt, 30, temperature=0, shift_context=True)
    assert shifted.shape == exact.shape
    assert torch.equal(shifted[:, :17], exact[:, :17])  # up to block_size tokens of context


def test_sampled_generation_is_reproducible_and_streams():
    model = tiny_model()
    prompt = torch.randint(0, 37, (3, 4))
    a = generated(model, prompt, 20, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(1))
    b = generated(model, prompt, 20, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(1))
    streamed = list(generate.generate_stream(model, prompt, 20, temperature=1.0, top_k=10,
                                             generator=torch.Generator().manual_seed(1)))
    assert torch.equal(a, b)
    assert all(t.shape == (3,) and t.dtype == torch.long for t in streamed)
    assert torch.equal(torch.stack(streamed, dim=1), a[:, 4:])
    c = generated(model, prompt, 20, temperature=1.0, top_k=10, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(a, c)


def test_stop_tokens_finish_rows():
    model = tiny_model()
    prompt = torch.randint(0, 37, (2, 4))
    free = generated(model, prompt, 12, temperature=0)
    stop = int(free[0, 6])  # row 0 emits it at its third new token (or earlier)
    out = generated(model, prompt, 12, temperature=0, stop_tokens=[stop])
    for row in range(2):
        new = free[row, 4:]
        hits = (new == stop).nonzero()
        if len(hits):
            first = int(hits[0])
            assert torch.equal(out[row, 4 : 4 + first + 1], new[: first + 1])
            assert (out[row, 4 + first + 1 :] == stop).all()  # later positions repeat the stop token
        else:
            assert torch.equal(out[row, 4:], new[: out.size(1) - 4])
    single = generated(model, prompt[:1], 12, temperature=0, stop_tokens=[int(free[0, 4])])
    assert single.shape == (1, 5)  # ended as soon as every row was finished


def test_an_empty_prompt_and_bad_options_are_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="idx must be"):
        list(generate.generate_stream(model, torch.zeros(1, 0, dtype=torch.long), 3))
    with pytest.raises(ValueError, match="top_p"):
        list(generate.generate_stream(model, torch.zeros(1, 2, dtype=torch.long), 3, top_p=1.5))


def test_text_stream_holds_back_a_possible_stop_string():
    tok = CharTokenizer(CHARS)
    stream = generate.TextStream(tok, stop="ab")
    shown = ""
    for ch in "xya":
        stream.push(tok.encode(ch)[0])
        shown += stream.take_new()
    assert shown == "xy"  # the 'a' may begin "ab": it waits
    stream.push(tok.encode("c")[0])
    shown += stream.take_new()
    assert shown == "xyac"
    for ch in "zab":
        stream.push(tok.encode(ch)[0])
        shown += stream.take_new()
    assert stream.stopped and shown == "xyacz" and stream.text == "xyacz"
    stream.push(tok.encode("q")[0])  # after the stop nothing is added
    stream.close()
    assert stream.take_new() == "" and stream.text == "xyacz"


def test_end_of_text_ends_a_bpe_sample(tiktoken_available):
    tok = tokenizer_from_dict({"type": "gpt2"})
    stream = generate.TextStream(tok)
    for i in tok.encode("Hello") + [tok.eot_id] + tok.encode(" world") + [tok.eot_id]:
        stream.push(i)
    stream.close()
    assert stream.stopped and stream.take_new() == "Hello"


def test_text_stream_never_splits_a_utf8_character(tiktoken_available):
    tok = tokenizer_from_dict({"type": "gpt2"})
    text = "héllo 世界, naïve café 🙂!"
    ids = tok.encode(text)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # some character spans two tokens
    stream = generate.TextStream(tok)
    pieces = []
    for i in ids:
        stream.push(i)
        pieces.append(stream.take_new())
    stream.close()
    pieces.append(stream.take_new())
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


@pytest.mark.parametrize("kind", ["char", "gpt2"])
def test_a_chat_models_turn_tokens_are_written_as_their_markers_without_chat(kind, request):
    # sample.py without --chat on a chat model was a traceback once the model wrote a turn
    # token (IndexError in the char tokenizer, KeyError in tiktoken for GPT-2's ids past 50256).
    if kind == "gpt2":
        request.getfixturevalue("tiktoken_available")
    tok = CharTokenizer(CHARS) if kind == "char" else tokenizer_from_dict({"type": "gpt2"})
    v = tok.vocab_size
    stream = generate.TextStream(tok, stop_tokens=[])
    for i in [*tok.encode("ab"), v + 3, v + 1, *tok.encode("c"), v + 2, v + 3]:
        stream.push(i)
    stream.close()
    assert stream.text == "ab<|end|><|user|>c<|assistant|><|end|>"
    stop = generate.TextStream(tok, stop="<|user|>", stop_tokens=[])  # a --stop string can name a marker
    for i in [*tok.encode("ab"), v + 3, v + 1, *tok.encode("c")]:
        stop.push(i)
    assert stop.stopped and stop.text == "ab<|end|>"


def test_text_stream_ends_before_the_earliest_of_several_stop_strings():
    tok = CharTokenizer(CHARS)
    stream = generate.TextStream(tok, stop=("cd", "ab", "zz"))
    shown = ""
    for ch in "xyzcab":
        stream.push(tok.encode(ch)[0])
        shown += stream.take_new()
        if ch == "z":
            assert shown == "xy"  # "z" may begin "zz": held back
        if ch == "c":
            assert shown == "xyz"  # "c" may begin "cd": held back; "z" no longer can
    assert stream.stopped and stream.text == "xyzc" and shown == "xyzc"
    stream = generate.TextStream(tok, stop=["b", "a"])
    stream._append("xab")  # one piece holding both (a BPE token may): the first in the text wins
    assert stream.stopped and stream.text == "x"


@pytest.mark.parametrize("variant", [{}, {"pos_encoding": "sinusoidal"}, {"attention": "reference", "dropout": 0.3},
                                     {"attention": "matmul", "n_kv_head": 1},
                                     {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 2}])
def test_the_cache_check_passes_model_py_as_written_and_catches_a_cache_it_ignores(variant, monkeypatch):
    """generate_stream asks once per model whether its forward through a KVCache is its
    forward over the whole context (cache_differs): model.py as written passes (in train
    mode too, which the check leaves as it was); a cache that stores keys and values but
    hands back only the new ones fails it, and generation then recomputes the context:
    the tokens of use_cache=False."""
    import model as model_py

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=30, **variant)).train()
    assert generate.cache_differs(model, note=None) is None and model.training
    update = model_py.KVCache.update

    def forgetful(self, layer, k, v):  # each new token sees itself alone
        update(self, layer, k, v)
        return k, v

    monkeypatch.setattr(model_py.KVCache, "update", forgetful)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=30, **variant)).eval()
    said = []
    assert "differ" in generate.cache_differs(model, note=said.append) and len(said) == 1
    assert "each token recomputes its context" in said[0]
    idx = torch.tensor([[1, 2, 3]])
    cached = torch.stack(list(generate.generate_stream(model, idx, 20, temperature=0)), 1)
    recomputed = torch.stack(list(generate.generate_stream(model, idx, 20, temperature=0, use_cache=False)), 1)
    assert torch.equal(cached, recomputed) and len(said) == 1  # found once
