"""gptkit/interop/hf_gpt2.py against an independent implementation: Hugging Face transformers' GPT-2.

A small randomly initialised GPT2LMHeadModel is saved in tmp_path: nothing is downloaded.
"""

import json

import pytest
import torch

from gptkit.ops.errors import UserError
from gptkit.interop import hf_gpt2
from model import GPT, GPTConfig

transformers = pytest.importorskip("transformers")  # a test-only dependency


def small_hf_model(seed=0, **overrides):
    settings = dict(n_embd=48, n_layer=3, n_head=4, n_positions=32, vocab_size=101)
    settings.update(overrides)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**settings, bos_token_id=None, eos_token_id=None))
    with torch.no_grad():  # random biases and norm gains, so a mix-up of any of them shows
        for name, p in model.named_parameters():
            if name.endswith(("bias", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def hf_logits(model, idx):
    with torch.no_grad():
        return model(idx).logits


def test_transformers_weights_load_with_the_same_logits(tmp_path):
    hf = small_hf_model()
    hf.save_pretrained(tmp_path)
    ours = hf_gpt2.load_gpt2(tmp_path).eval()
    assert (ours.config.n_layer, ours.config.n_embd, ours.config.block_size, ours.config.vocab_size) == (3, 48, 32, 101)
    idx = torch.randint(0, 101, (2, 32))
    with torch.no_grad():
        diff = (ours(idx)[0] - hf_logits(hf, idx)).abs().max().item()
    assert diff < 1e-4


def test_pytorch_model_bin_and_unprefixed_keys(tmp_path):
    # Older folders hold pytorch_model.bin; OpenAI's hub checkpoints have no "transformer." prefix.
    hf = small_hf_model(seed=1, n_inner=64)
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    state["h.0.attn.bias"] = torch.ones(1, 1, 32, 32)  # the old causal-mask buffer is skipped
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    ours = hf_gpt2.load_gpt2(tmp_path).eval()
    assert ours.config.hidden_size == 64
    idx = torch.randint(0, 101, (1, 20))
    with torch.no_grad():
        assert (ours(idx)[0] - hf_logits(hf, idx)).abs().max().item() < 1e-4


def test_export_opens_in_transformers_with_the_same_logits(tmp_path):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(block_size=32, vocab_size=101, n_layer=2, n_head=4, n_embd=48, pad_vocab_multiple=64)).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith(("bias", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.add_(0.1 * torch.randn_like(p))
    hf_gpt2.export_gpt2(ours, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 101, (2, 32))
    with torch.no_grad():
        assert (ours(idx)[0] - hf_logits(hf, idx)).abs().max().item() < 1e-4
    again = hf_gpt2.load_gpt2(tmp_path)  # and round-trips into our model
    for (name, a), b in zip(again.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b[: a.shape[0]]), name


def test_export_refuses_non_gpt2_shapes(tmp_path):
    model = GPT(GPTConfig(block_size=8, vocab_size=20, n_layer=1, n_head=2, n_embd=8, pos_encoding="rope", mlp="swiglu"))
    with pytest.raises(UserError) as info:
        hf_gpt2.export_gpt2(model, tmp_path)
    assert "pos_encoding='rope'" in str(info.value) and "mlp='swiglu'" in str(info.value)
    assert not (tmp_path / "model.safetensors").exists()


def test_offline_hub_name_says_to_pass_a_local_folder(tmp_path, monkeypatch):
    # Nothing listens on the discard port: the download runs as it is, and fails as offline.
    monkeypatch.setattr(hf_gpt2, "HUB_URL", "http://127.0.0.1:9/openai-community/{name}/resolve/main/{file}")
    with pytest.raises(UserError) as info:
        hf_gpt2.load_gpt2("gpt2", cache_dir=tmp_path)
    message = str(info.value)
    assert message.startswith("could not download gpt2 from http://127.0.0.1:9/openai-community/gpt2/")
    assert "local folder" in message and "config.json" in message and "\n" not in message
    assert not any((tmp_path / "gpt2").iterdir())  # nothing half-written


def test_unknown_name_and_broken_folders(tmp_path):
    with pytest.raises(UserError, match="neither a folder nor one of"):
        hf_gpt2.load_gpt2("gpt3")
    with pytest.raises(UserError, match="no config.json"):
        hf_gpt2.load_gpt2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="model_type='llama'"):
        hf_gpt2.load_gpt2(tmp_path)


def test_mismatched_weights_are_named(tmp_path):
    hf = small_hf_model()
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["n_embd"] = 64
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="shape"):
        hf_gpt2.load_gpt2(tmp_path)
