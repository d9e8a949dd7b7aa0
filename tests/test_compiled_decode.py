"""gptkit/fast/compiled_decode.py: the static cache gives the dynamic cache's logits, and
compiled decoding compiles once for a whole generation (not per token, not per
layer) and gives eager decoding's tokens; sample.py --compile end to end."""

import pytest
import torch

from gptkit.fast.compiled_decode import CompiledDecoder, StaticKVCache
from gptkit.generation.generate import generate_stream
from model import GPT, GPTConfig, KVCache

VARIANTS = {
    "gpt2": dict(),
    "quick_start": dict(pos_encoding="rope", norm="rmsnorm", mlp="relu2", qk_norm=True, logit_softcap=15.0, bias=False),
    "sinusoidal_gqa": dict(pos_encoding="sinusoidal", n_kv_head=2),
    "reference": dict(attention="reference", n_kv_head=1),
}


def tiny(n_layer=4, block_size=16, **variant):
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=n_layer, n_head=4, n_embd=32, block_size=block_size, vocab_size=40, **variant)).eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_static_cache_gives_the_dynamic_caches_logits(variant):
    model = tiny(**VARIANTS[variant])
    idx = torch.randint(0, 40, (3, 5))
    with torch.no_grad():
        caches = [KVCache(model.config.n_layer, 16), StaticKVCache(model, 3, 16)]
        out = [[model.next_token_logits(idx, c)] for c in caches]
        for step in range(10):
            token = out[0][-1].argmax(-1, keepdim=True)  # (B, 1): both caches get the same tokens
            for logits, cache in zip(out, caches):
                logits.append(model.next_token_logits(token, cache))
    assert int(caches[1].length) == caches[0].length == 15
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.fixture
def eager_backend(monkeypatch):
    """torch.compile with dynamo's own "eager" backend: the same guards and recompiles
    as inductor (dynamo decides them), without minutes of code generation."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **options: real_compile(fn, **{**options, "backend": "eager"}))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()


def greedy(model, idx, n, decoder=None, shift_context=True):
    return torch.stack(list(generate_stream(model, idx, n, temperature=0, shift_context=shift_context, decoder=decoder)), 1)


def test_compiled_decoding_compiles_once_for_40_tokens_of_a_4_layer_model(eager_backend):
    """40 tokens past a block of 16: the cache is rebuilt (shift_context) twice, and
    every one-token step of every layer runs through the one compiled graph."""
    model = tiny(**VARIANTS["quick_start"])
    idx = torch.randint(0, 40, (2, 5))
    decoder = CompiledDecoder(model, batch_size=2)
    assert torch.equal(greedy(model, idx, 40, decoder=decoder), greedy(model, idx, 40))
    # another generation, of another length (the token buffer's strides differ): the same graph
    assert torch.equal(greedy(model, idx, 7, decoder=decoder), greedy(model, idx, 7))
    assert eager_backend["stats"]["unique_graphs"] == 1, dict(eager_backend["stats"])
    assert sum(eager_backend["recompiles"].values()) == 0, dict(eager_backend["recompiles"])


def test_a_failed_compile_decodes_eagerly_with_a_warning(monkeypatch, capsys):
    def broken(fn, **options):
        def call(*args):
            raise RuntimeError("no C compiler")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    model = tiny()
    idx = torch.randint(0, 40, (1, 3))
    assert torch.equal(greedy(model, idx, 20, decoder=CompiledDecoder(model, batch_size=1)), greedy(model, idx, 20))
    assert "torch.compile failed (RuntimeError: no C compiler); decoding without compile" in capsys.readouterr().err


@pytest.mark.slow
def test_inductor_compiled_decoding_gives_eager_tokens():
    """The real compiler (inductor: C++ code on a CPU; tens of seconds to minutes here)."""
    torch._dynamo.reset()
    model = tiny(n_layer=2, **VARIANTS["quick_start"])
    idx = torch.randint(0, 40, (2, 4))
    try:
        got = greedy(model, idx, 12, decoder=CompiledDecoder(model, batch_size=2), shift_context=False)
    finally:
        torch._dynamo.reset()
    assert torch.equal(got, greedy(model, idx, 12, shift_context=False))
