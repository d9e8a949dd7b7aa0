"""model.py: invariants of attention and the GPT, checked on tiny CPU models."""

import math

import pytest
import torch

from model import (
    GPT,
    CausalSelfAttention,
    GPTConfig,
    KVCache,
    apply_rope,
    reference_attention,
    rope_angles,
)

POS_ENCODINGS = ("learned", "sinusoidal", "rope", "none")


def tiny(**overrides):
    settings = dict(block_size=16, vocab_size=37, n_layer=2, n_head=4, n_embd=32)
    settings.update(overrides)
    return GPTConfig(**settings)


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return GPT(tiny(**overrides)).eval()


VARIANTS = {
    "gpt2": {},
    "gqa": dict(n_kv_head=2),
    "mqa": dict(n_kv_head=1),
    "qk_norm_rope": dict(qk_norm=True, pos_encoding="rope"),
    "llama_like": dict(pos_encoding="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False, n_kv_head=2),
    "post_norm_relu2": dict(norm_placement="post", mlp="relu2"),
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "none": dict(pos_encoding="none"),
    "softcap_padded": dict(logit_softcap=5.0, pad_vocab_multiple=64),
}


def test_defaults_are_gpt2_small():
    c = GPTConfig()
    assert (c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_embd) == (1024, 50257, 12, 12, 768)
    assert (c.pos_encoding, c.norm, c.norm_placement, c.mlp, c.bias, c.tie_embeddings) == (
        "learned", "layernorm", "pre", "gelu", True, True,
    )
    assert c.hidden_size == 4 * 768 and c.kv_heads == 12


def test_parameter_counts_without_allocating():
    with torch.device("meta"):
        gpt2 = GPT(GPTConfig())
        llama = GPT(GPTConfig(
            block_size=4096, vocab_size=32000, n_layer=32, n_head=32, n_embd=4096, bias=False,
            pos_encoding="rope", norm="rmsnorm", mlp="swiglu", mlp_hidden=11008, tie_embeddings=False,
        ))
    assert gpt2.num_params() == 124_439_808
    assert gpt2.num_params(non_embedding=True) == 124_439_808 - 50257 * 768 - 1024 * 768
    assert llama.num_params() == 6_738_415_616


def test_swiglu_hidden_matches_gelu_parameters():
    gelu, swiglu = tiny(n_embd=48, n_head=4), tiny(n_embd=48, n_head=4, mlp="swiglu")
    assert swiglu.hidden_size == 128  # 8 * 48 / 3
    count = lambda c: sum(p.numel() for p in GPT(c).transformer.h[0].mlp.parameters() if p.dim() == 2)
    assert count(gelu) == count(swiglu)


@pytest.mark.parametrize(
    "overrides, names",
    [
        (dict(n_embd=30, n_head=4), ["n_embd=30", "n_head=4"]),
        (dict(n_kv_head=3), ["n_head=4", "n_kv_head=3"]),
        (dict(n_kv_head=8), ["n_kv_head=8"]),
        (dict(n_embd=12, n_head=4, pos_encoding="rope"), ["rope", "head size", "n_embd/n_head"]),
        (dict(pos_encoding="alibi"), ["pos_encoding='alibi'", "learned"]),
        (dict(norm="batchnorm"), ["norm='batchnorm'"]),
        (dict(mlp="geglu"), ["mlp='geglu'", "swiglu"]),
        (dict(norm_placement="sandwich"), ["norm_placement"]),
        (dict(dropout=1.0), ["dropout=1.0"]),
        (dict(n_layer=0), ["n_layer=0"]),
        (dict(logit_softcap=-1.0), ["logit_softcap"]),
        (dict(pad_vocab_multiple=0), ["pad_vocab_multiple"]),
    ],
)
def test_invalid_configs_name_the_fields(overrides, names):
    with pytest.raises(ValueError) as info:
        tiny(**overrides)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("variant", VARIANTS)
def test_causality(variant):
    model = tiny_model(**VARIANTS[variant])
    idx = torch.randint(0, 37, (2, 12))
    j = 7
    changed = idx.clone()
    changed[:, j] = (changed[:, j] + 1) % 37
    before, after = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(before[:, :j], after[:, :j], rtol=0, atol=1e-6)
    assert (before[:, j:] - after[:, j:]).abs().max() > 1e-4  # position j and later do see it


def test_attention_without_mask_is_permutation_equivariant():
    q, k, v = torch.randn(3, 1, 2, 6, 8).unbind(0)  # (B, H, T, D) each
    perm = torch.randperm(6)
    out = reference_attention(q, k, v, causal=False)
    permuted = reference_attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], causal=False)
    torch.testing.assert_close(permuted, out[:, :, perm])


@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_order_blindness_without_positions(pos_encoding):
    # The last token attends to a *set* of tokens: without position information, one
    # layer cannot tell any order of the earlier tokens apart. (Deeper causal models can:
    # the mask itself leaks order, Haviv et al. 2022.)
    model = tiny_model(n_layer=1, pos_encoding=pos_encoding)
    with torch.no_grad():  # sharper attention than at init, so that order would show
        model.transformer.h[0].attn.c_attn.weight.mul_(20)
    idx = torch.arange(10)[None] % 37 + 3
    shuffled = torch.cat([idx[:, :-1][:, torch.tensor([3, 0, 8, 1, 5, 2, 7, 4, 6])], idx[:, -1:]], dim=1)
    last, last_shuffled = model(idx)[0][:, -1], model(shuffled)[0][:, -1]
    if pos_encoding == "none":
        torch.testing.assert_close(last, last_shuffled, rtol=0, atol=1e-5)
    else:
        assert (last - last_shuffled).abs().max() > 1e-3


def test_rope_scores_depend_only_on_relative_position():
    D = 16
    cos, sin = rope_angles(64, D, theta=10000.0, dtype=torch.float64)

    def rotate(x, m):  # R_m x; R_-m is the inverse rotation (same cosine, sine negated)
        c, s = cos[abs(m)][None], sin[abs(m)][None] * (1 if m >= 0 else -1)
        return apply_rope(x[None], c, s)[0]

    q, k = torch.randn(2, D, dtype=torch.float64).unbind(0)
    for m, n in [(0, 0), (3, 10), (10, 3), (20, 50), (63, 1)]:
        torch.testing.assert_close(torch.dot(rotate(q, m), rotate(k, n)), torch.dot(q, rotate(k, n - m)))
    assert not torch.allclose(rotate(q, 5), q)  # it does rotate
    torch.testing.assert_close(rotate(q, 5).norm(), q.norm())  # and keeps lengths


@pytest.mark.parametrize("attention", ["reference", "matmul"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_sdpa_matches_reference_formula(variant, attention):
    fast = tiny_model(**VARIANTS[variant])
    slow = GPT(tiny(attention=attention, **VARIANTS[variant])).eval()
    slow.load_state_dict(fast.state_dict())
    idx = torch.randint(0, 37, (2, 16))
    torch.testing.assert_close(fast(idx)[0], slow(idx)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["gpt2", "gqa", "qk_norm_rope"])
def test_matmul_attention_trains_as_the_formula_does(variant):
    """attention="matmul" (the scale and the mask folded into one baddbmm): the gradients
    of every parameter are the formula's, and under bfloat16 autocast on the CPU (where it
    is the fastest) the loss is the formula's to bfloat16's rounding."""
    torch.manual_seed(0)
    formula = GPT(tiny(attention="reference", **VARIANTS[variant]))
    matmul = GPT(tiny(attention="matmul", **VARIANTS[variant]))
    matmul.load_state_dict(formula.state_dict())
    idx, targets = torch.randint(0, 37, (2, 3, 16)).unbind(0)
    for model in (formula, matmul):
        model(idx, targets)[1].backward()
    for (name, a), b in zip(formula.named_parameters(), matmul.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        losses = [model(idx, targets)[1].item() for model in (formula, matmul)]
    assert abs(losses[0] - losses[1]) < 0.02, losses


def test_reference_attention_stages():
    q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    out, stages = reference_attention(q, k, v, return_stages=True)
    torch.testing.assert_close(stages["scaled"].tril(), (q @ k.transpose(-2, -1) / 2).tril())
    assert torch.isinf(stages["scaled"].triu(1)[..., 0, 1:]).all()
    torch.testing.assert_close(stages["weights"].sum(-1), torch.ones(1, 2, 5))
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("variant", ["gpt2", "gqa", "qk_norm_rope"])
def test_cache_chunks_match_full_forward(variant):
    model = tiny_model(**VARIANTS[variant])
    idx = torch.randint(0, 37, (2, 12))
    cache = KVCache(model.config.n_layer, model.config.block_size)
    pieces = [model._logits(model._hidden(idx[:, a:b], cache)) for a, b in [(0, 5), (5, 6), (6, 9), (9, 12)]]
    torch.testing.assert_close(torch.cat(pieces, dim=1), model(idx)[0], rtol=1e-5, atol=1e-5)


def test_next_token_logits_with_a_cache_equal_the_full_forward():
    model = tiny_model(pos_encoding="rope", n_kv_head=2)
    idx = torch.randint(0, 37, (2, 10))
    full = model(idx)[0]  # (B, T, vocab_size)
    cache = KVCache(model.config.n_layer, model.config.block_size)
    torch.testing.assert_close(model.next_token_logits(idx[:, :4], cache), full[:, 3], rtol=1e-5, atol=1e-5)
    for t in range(4, 10):  # then one token at a time
        torch.testing.assert_close(model.next_token_logits(idx[:, t : t + 1], cache), full[:, t], rtol=1e-5, atol=1e-5)
    assert cache.length == 10


def test_generate_crops_the_context_to_block_size():
    model = tiny_model(pos_encoding="rope")
    prompt = torch.randint(0, 37, (1, 30))
    out = model.generate(prompt, 5, temperature=0)
    assert out.shape == (1, 35) and torch.equal(out[:, :30], prompt)
    assert torch.equal(out[:, 30], model(prompt[:, -16:])[0][:, -1].argmax(-1))
    assert torch.equal(out[:, 34], model(out[:, -17:-1])[0][:, -1].argmax(-1))


def test_generate_samples_reproducibly_and_top_k_1_is_greedy():
    model = tiny_model()
    prompt = torch.randint(0, 37, (3, 4))
    a = model.generate(prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(1))
    c = model.generate(prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = model.generate(prompt, 20, temperature=0)
    assert torch.equal(model.generate(prompt, 20, top_k=1, generator=torch.Generator().manual_seed(3)), greedy)


def test_padded_vocabulary_is_never_predicted():
    model = tiny_model(pad_vocab_multiple=64)
    assert model.transformer.wte.weight.shape[0] == 64
    with torch.no_grad():
        model.transformer.wte.weight[37:] = 10.0  # padding rows would win every argmax
    idx = torch.randint(0, 37, (2, 6))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 6, 37) and torch.isfinite(loss)
    assert model.generate(idx, 10, temperature=1.0).max() < 37


def test_loss_is_mean_cross_entropy_ignoring_minus_one():
    model = tiny_model()
    idx, targets = torch.randint(0, 37, (2, 8)), torch.randint(0, 37, (2, 8))
    targets[0, :3] = -1
    logits, loss = model(idx, targets)
    keep = targets != -1
    expected = torch.nn.functional.cross_entropy(model(idx)[0][keep], targets[keep])
    torch.testing.assert_close(loss, expected)
    assert loss.dtype == torch.float32
    assert logits.shape == (int(keep.sum()), 37)  # the output layer ran on the targets only


@pytest.mark.parametrize("variant", ["gpt2", "softcap_padded"])
def test_output_layer_on_targets_only_keeps_loss_and_gradients(variant):
    """Chat windows (most positions -1): the output layer runs on the N target
    positions only, and the loss and every gradient equal the whole-window
    computation's (model(idx)'s logits, cross-entropy ignoring -1) to rounding."""
    extra = dict(logit_softcap=15.0, pad_vocab_multiple=64, tie_embeddings=False) if variant != "gpt2" else {}
    model = tiny_model(**extra).train()
    idx, targets = torch.randint(0, 37, (3, 16)), torch.randint(0, 37, (3, 16))
    targets[:, :9] = -1  # a prompt
    targets[1, 12:] = -1  # padding after a short reply
    targets[2] = -1  # a window with no reply at all
    rows = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape))
    _, loss = model(idx, targets)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    whole = model(idx)[0]  # (B, T, vocab_size): the output layer on every position
    expected = torch.nn.functional.cross_entropy(whole.reshape(-1, 37), targets.reshape(-1), ignore_index=-1)
    expected.backward()
    hook.remove()
    assert rows[0] == (int((targets >= 0).sum()), 32) and rows[1] == (3, 16, 32)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_gpt2_initialization():
    model = GPT(tiny(n_layer=4, n_embd=256, n_head=4, vocab_size=500, block_size=64))
    params = dict(model.named_parameters())
    for name in ("transformer.h.0.attn.c_attn.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.wte.weight"):
        assert abs(params[name].std().item() - 0.02) < 0.001, name
    for name in ("transformer.h.0.attn.c_proj.weight", "transformer.h.3.mlp.c_proj.weight"):
        assert abs(params[name].std().item() - 0.02 / math.sqrt(8)) < 0.0005, name
    assert (params["transformer.h.0.attn.c_attn.bias"] == 0).all()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert GPT(tiny(tie_embeddings=False)).lm_head.weight is not GPT(tiny(tie_embeddings=False)).transformer.wte.weight


def test_zero_init_proj():
    model = GPT(tiny(zero_init_proj=True))
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert (p == 0).all(), name
        elif name.endswith("c_fc.weight"):
            assert p.abs().sum() > 0


def test_block_matrices_are_the_only_2d_parameters_in_blocks():
    # The Muon optimizer takes every 2-D parameter under transformer.h.: they must all be matrices.
    model = GPT(tiny(qk_norm=True, norm="rmsnorm", mlp="swiglu", pos_encoding="rope", tie_embeddings=False))
    in_blocks = [n for n, p in model.named_parameters() if n.startswith("transformer.h.") and p.dim() == 2]
    assert in_blocks and all(n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) for n in in_blocks)


def test_attention_module_qkv_split():
    attn = CausalSelfAttention(GPTConfig(n_embd=4, n_head=1))
    assert attn.c_attn.out_features == 12
    x = torch.randn(2, 3, 4)
    q, k, v = attn.qkv(x)
    assert q.shape == k.shape == v.shape == (2, 1, 3, 4)
    fused = attn.c_attn(x)  # (B, T, 3C)
    torch.testing.assert_close(q[:, 0], fused[..., :4])
    torch.testing.assert_close(v[:, 0], fused[..., 8:])


def test_attention_maps():
    model = tiny_model(pos_encoding="rope", n_kv_head=2)
    idx = torch.randint(0, 37, (2, 9))
    maps = model.attention_maps(idx, layer=1)
    assert maps.shape == (2, 4, 9, 9)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 9))
    assert (maps.triu(1) == 0).all()
    with pytest.raises(ValueError, match="layer=2"):
        model.attention_maps(idx, layer=2)


@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_crop_block_size(pos_encoding):
    model = tiny_model(pos_encoding=pos_encoding)
    idx = torch.randint(0, 37, (1, 8))
    before = model(idx)[0]
    model.crop_block_size(8)
    torch.testing.assert_close(model(idx)[0], before)
    with pytest.raises(ValueError, match="block_size=8"):
        model(torch.randint(0, 37, (1, 9)))
    assert model.generate(idx, 4, temperature=0).shape == (1, 12)


def test_training_steps_lower_the_loss():
    torch.manual_seed(0)
    model = GPT(tiny(pos_encoding="rope", mlp="swiglu", norm="rmsnorm", dropout=0.1)).train()
    data = torch.arange(17).repeat(4, 1) % 37  # a fixed sequence to memorize
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        _, loss = model(data[:, :-1], data[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_attn_dropout_false_drops_out_the_residual_branch_only():
    import torch.nn.functional as F

    config = GPTConfig(block_size=16, vocab_size=32, n_layer=1, n_head=2, n_embd=16, bias=False, dropout=0.5,
                       attn_dropout=False)
    torch.manual_seed(0)
    attn = CausalSelfAttention(config).train()
    x = torch.randn(2, 8, 16)
    q, k, v = attn.qkv(x)
    torch.manual_seed(1)
    y = attn(x)
    torch.manual_seed(1)  # the same draw: the only dropout is the one after c_proj
    expected = F.dropout(attn.c_proj(reference_attention(q, k, v).transpose(1, 2).reshape(2, 8, 16)), 0.5)
    assert torch.allclose(y, expected, atol=1e-6) and (y == 0).float().mean() > 0.3
    both = CausalSelfAttention(GPTConfig(**{**vars(config), "attn_dropout": True})).train()
    both.load_state_dict(attn.state_dict())
    torch.manual_seed(1)
    assert not torch.allclose(both(x), expected, atol=1e-3)  # GPT-2's: the attention weights drop out too
