"""nanoGPT checkpoints load and sample: built here under nanoGPT's key names and
layout (no nanoGPT code), checked against nanoGPT's forward pass written out."""

import math
import pickle

import pytest
from malicious import RunsCode
import torch
import torch.nn.functional as F

from gptkit.models import loading
from gptkit.ops.errors import UserError
from gptkit.interop import nanogpt as nanogpt_compat
import sample

CHARS = sorted(set("\n !',-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
ARGS = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, dropout=0.0)




def nanogpt_weights(n_layer, n_embd, block_size, vocab_size, bias, seed=0, **_):
    """A state dict with nanoGPT's names and shapes (nn.Linear weights are (out, in));
    the output layer is tied to the token embedding, as in nanoGPT."""
    g = torch.Generator().manual_seed(seed)
    C = n_embd

    def rand(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    sd = {"transformer.wte.weight": rand(vocab_size, C, scale=1.0), "transformer.wpe.weight": rand(block_size, C)}
    layers = {"attn.c_attn": (3 * C, C), "attn.c_proj": (C, C), "mlp.c_fc": (4 * C, C), "mlp.c_proj": (C, 4 * C)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        for norm in ("ln_1", "ln_2"):
            sd[p + norm + ".weight"] = 1 + rand(C, scale=0.1)
            if bias:
                sd[p + norm + ".bias"] = rand(C, scale=0.1)
        for name, shape in layers.items():
            sd[p + name + ".weight"] = rand(*shape, scale=1 / math.sqrt(shape[1]))
            if bias:
                sd[p + name + ".bias"] = rand(shape[0], scale=0.1)
    sd["transformer.ln_f.weight"] = 1 + rand(C, scale=0.1)
    if bias:
        sd["transformer.ln_f.bias"] = rand(C, scale=0.1)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # weight tying
    return sd


def nanogpt_logits(sd, idx, n_layer, n_head, n_embd, gelu="none", **_):
    """nanoGPT's GPT.forward, written out: pre-LayerNorm blocks, fused c_attn split
    into q, k, v, causal softmax(QK^T / sqrt(D)) V, a GELU MLP (nanoGPT uses nn.GELU(),
    the exact erf form: gelu="none"), logits for every position."""
    B, T = idx.shape
    C, H = n_embd, n_head
    D = C // H

    def linear(x, name):
        return F.linear(x, sd[name + ".weight"], sd.get(name + ".bias"))

    def norm(x, name):
        return F.layer_norm(x, (C,), sd[name + ".weight"], sd.get(name + ".bias"), 1e-5)

    x = sd["transformer.wte.weight"][idx] + sd["transformer.wpe.weight"][:T]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        q, k, v = linear(norm(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + linear(y, p + "attn.c_proj")
        h = F.gelu(linear(norm(x, p + "ln_2"), p + "mlp.c_fc"), approximate=gelu)
        x = x + linear(h, p + "mlp.c_proj")
    return linear(norm(x, "transformer.ln_f"), "lm_head")


def nanogpt_checkpoint(sd, model_args, dataset="tiny_char", compiled=True, mask_buffers=True):
    """A dict laid out as nanoGPT's train.py saves ckpt.pt."""
    state = dict(sd)
    if mask_buffers:  # older nanoGPT saved its causal mask as a buffer
        T = model_args["block_size"]
        for i in range(model_args["n_layer"]):
            state[f"transformer.h.{i}.attn.bias"] = torch.ones(T, T).tril().view(1, 1, T, T)
    if compiled:  # saved from torch.compile's wrapper
        state = {"_orig_mod." + k: v for k, v in state.items()}
    params = [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2, 2))]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    optimizer.step()
    return {
        "model": state,
        "optimizer": optimizer.state_dict(),
        "model_args": model_args,
        "iter_num": 250,
        "best_val_loss": torch.tensor(1.2345),
        "config": {"dataset": dataset, "batch_size": 12, "learning_rate": 1e-3, "compile": True},
    }


def write_meta(path, chars):
    """data/<dataset>/meta.pkl as nanoGPT's prepare.py writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    with open(path, "wb") as f:
        pickle.dump(meta, f)
    return path


@pytest.mark.parametrize("bias", [False, True])
def test_nanogpt_checkpoint_gives_nanogpt_logits(tmp_path, bias):
    args = dict(ARGS, vocab_size=len(CHARS), bias=bias)
    sd = nanogpt_weights(**args)
    write_meta(tmp_path / "data" / "tiny_char" / "meta.pkl", CHARS)
    ckpt = nanogpt_checkpoint(sd, args)
    model, tok, summary = loading.model_from_checkpoint(ckpt, "ckpt.pt", data_dir=tmp_path / "data")
    assert tok.to_dict() == {"type": "char", "chars": CHARS}
    assert "nanoGPT checkpoint" in summary and "iteration 250" in summary and "val loss 1.2345" in summary
    idx = torch.randint(0, len(CHARS), (2, args["block_size"]), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(idx)
        exact = nanogpt_logits(sd, idx, **args)
        tanh = nanogpt_logits(sd, idx, **args, gelu="tanh")
    assert exact.abs().max() > 1  # logits of a size where a wrong mapping would show
    # Every weight lands where nanoGPT uses it, and the MLP uses nanoGPT's erf GELU
    # (mlp="gelu_exact"): equal to nanoGPT's forward pass written out...
    assert model.config.mlp == "gelu_exact"
    assert torch.allclose(ours, exact, atol=1e-5, rtol=0), (ours - exact).abs().max()
    # ...and measurably not GPT-2's tanh form, so the test would see the wrong GELU.
    assert (ours - tanh).abs().max() > 1e-4


def test_nanogpt_checkpoint_samples_from_out_dir(tmp_path, capsys):
    args = dict(ARGS, vocab_size=len(CHARS), bias=False)
    sd = nanogpt_weights(**args, seed=3)
    write_meta(tmp_path / "data" / "tiny_char" / "meta.pkl", CHARS)
    out = tmp_path / "out-shakespeare-char"
    out.mkdir()
    torch.save(nanogpt_checkpoint(sd, args), out / "ckpt.pt")
    capsys.readouterr()
    assert sample.main(["--out_dir", str(out), "--data_dir", str(tmp_path / "data"), "--start", "ROMEO:",
                        "--temperature", "0", "--max_new_tokens", "40", "--num_samples", "2"]) == 0
    captured = capsys.readouterr()
    assert f"loaded {out / 'ckpt.pt'} (nanoGPT checkpoint, vocabulary from {tmp_path / 'data' / 'tiny_char' / 'meta.pkl'}" in captured.err
    # greedy by hand with the loaded model, recomputing the cropped context each token
    model, tok, _ = loading.model_from_checkpoint(torch.load(out / "ckpt.pt", weights_only=True), "x", tmp_path / "data")
    ids = tok.encode("ROMEO:")
    with torch.no_grad():
        for _ in range(40):
            ids.append(int(model(torch.tensor([ids[-args["block_size"]:]]))[0][0, -1].argmax()))
    text = tok.decode(ids)
    assert captured.out == f"{text}\n{'-' * 15}\n" * 2


def test_meta_path_given_or_missing(tmp_path):
    args = dict(ARGS, vocab_size=len(CHARS), bias=False)
    ckpt = nanogpt_checkpoint(nanogpt_weights(**args), args, dataset="elsewhere")
    with pytest.raises(UserError, match=rf"{len(CHARS)}-token vocabulary but its meta.pkl was not found .*elsewhere.*--meta"):
        loading.model_from_checkpoint(ckpt, "ckpt.pt", data_dir=tmp_path)
    meta = write_meta(tmp_path / "my_meta.pkl", CHARS)
    _, tok, summary = loading.model_from_checkpoint(ckpt, "ckpt.pt", data_dir=tmp_path, meta=meta)
    assert tok.decode(tok.encode("Hello, world!")) == "Hello, world!" and str(meta) in summary
    small = write_meta(tmp_path / "small.pkl", CHARS[:10])
    _, tok, _ = loading.model_from_checkpoint(ckpt, "ckpt.pt", meta=small)  # fewer tokens than rows: padding
    assert tok.vocab_size == 10
    big = write_meta(tmp_path / "big.pkl", CHARS + ["\u00e9", "\u00e8"])
    with pytest.raises(UserError, match=f"{len(CHARS) + 2} tokens but the nanoGPT model only {len(CHARS)}"):
        loading.model_from_checkpoint(ckpt, "ckpt.pt", meta=big)




def test_meta_pkl_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "meta.pkl"
    evil.write_bytes(pickle.dumps({"vocab_size": 2, "itos": {0: "a", 1: RunsCode(marker)}}))
    with pytest.raises(UserError, match=r"refusing to load .*meta.pkl: unpickling it could run code \(it asks for (posix|os).system"):
        nanogpt_compat.read_meta_pkl(evil)
    assert not marker.exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (pickle.dumps([1, 2, 3]), "expected a dict, found list"),
        (pickle.dumps({"vocab_size": 3})[:-4], "not a readable meta.pkl"),
        (pickle.dumps({"vocab_size": 2, "itos": {0: "a", 2: "b"}}), "ids 0..N-1"),
        (pickle.dumps({"vocab_size": 2, "itos": {0: "ab", 1: "c"}}), "single characters"),
        (pickle.dumps({"vocab_size": 2, "stoi": {"a": 0}}), "no 'itos' table"),
    ],
)
def test_bad_meta_pkl_is_named(tmp_path, content, message):
    path = tmp_path / "meta.pkl"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        nanogpt_compat.char_tokenizer_from_meta(nanogpt_compat.read_meta_pkl(path))
    with pytest.raises(UserError, match="does not exist"):
        nanogpt_compat.read_meta_pkl(tmp_path / "nope.pkl")


def test_gpt2_vocab_without_meta_uses_bpe_and_never_samples_padding(tiktoken_available):
    args = dict(ARGS, n_embd=8, vocab_size=50304, bias=True)  # nanoGPT's train_gpt2 pads 50257 -> 50304
    sd = nanogpt_weights(**args, seed=5)
    sd["transformer.wte.weight"][50257:] *= 100  # padding rows that would win every argmax if used
    ckpt = nanogpt_checkpoint(sd, args, dataset="openwebtext", mask_buffers=False)
    model, tok, summary = loading.model_from_checkpoint(ckpt, "ckpt.pt", data_dir="/nonexistent")
    assert tok.to_dict() == {"type": "gpt2"} and "GPT-2 BPE" in summary
    assert (model.config.vocab_size, model.config.padded_vocab_size) == (50257, 50304)
    idx = torch.tensor([tok.encode("Hello")])
    with torch.no_grad():
        raw = nanogpt_logits(sd, idx, **args, gelu="tanh")[0, -1]
        assert int(raw.argmax()) >= 50257  # nanoGPT itself would pick a padding id here
        out = model.generate(idx, 8, temperature=0)
    assert int(out.max()) < 50257
    tok.decode(out[0].tolist())  # decodes: every id is a real token


def test_wrapper_prefixes_and_mask_buffers():
    sd = {
        "module._orig_mod.transformer.h.0.attn.bias": 1,
        "_orig_mod.transformer.h.0.attn.c_attn.bias": 2,
        "transformer.h.0.attn.masked_bias": 3,
        "_orig_mod.lm_head.weight": 4,
    }
    assert nanogpt_compat.nanogpt_state_dict({"model": sd}) == {
        "transformer.h.0.attn.c_attn.bias": 2,
        "lm_head.weight": 4,
    }
    assert not nanogpt_compat.is_nanogpt_checkpoint({"model": {}, "model_config": {}})


def test_checkpoint_dataset_name_never_leads_outside_data_dir(tmp_path):
    """A crafted config['dataset'] like '../outside' must not pick a meta.pkl beyond data_dir."""
    args = dict(ARGS, vocab_size=len(CHARS), bias=False)
    write_meta(tmp_path / "outside" / "meta.pkl", CHARS)
    (tmp_path / "data").mkdir()
    ckpt = nanogpt_checkpoint(nanogpt_weights(**args), args, dataset="../outside")
    with pytest.raises(UserError, match="meta.pkl was not found"):
        loading.model_from_checkpoint(ckpt, "ckpt.pt", data_dir=tmp_path / "data")
