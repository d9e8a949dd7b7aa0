"""gptkit/models/params.py (python lab.py params): exact parameter counts from shapes alone, for any config file."""

import pytest

from gptkit.ops.errors import UserError
from model import GPT, GPTConfig
import lab
from gptkit.models import params, shapes
from repo import REPO
from train_helpers import write_char_dataset

GPT2_SMALL = dict(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768)


def test_gpt2_small_table():
    table = dict(params.parameter_table(GPTConfig(**GPT2_SMALL)))
    assert sum(table.values()) == 124_439_808
    assert table["token embedding (wte)"] == 50257 * 768
    assert table["position embedding (wpe)"] == 1024 * 768
    assert table["output layer (lm_head)"] == 0  # tied: counted once, as wte
    assert table["attention (c_attn, c_proj, q/k norms)"] == 12 * (768 * 3 * 768 + 3 * 768 + 768 * 768 + 768)


def test_shipped_gpt2_config_counts_gpt2_small_and_shows_padding_apart(capsys):
    assert lab.main(["params", str(REPO / "configs" / "gpt2.py")]) == 0
    out = capsys.readouterr().out
    assert "total                                        124,439,808" in out
    assert "vocabulary padding (never predicted)            36,096" in out  # 47 rows of 768
    assert "124,475,904 in memory" in out


def test_llama2_7b_config_file(capsys):
    assert lab.main(["params", str(REPO / "configs" / "llama2_7b.py")]) == 0
    out = capsys.readouterr().out
    assert "6,738,415,616" in out
    assert f"{12 * 32 * 4096**2:,}" in out  # the 12·L·d² estimate beside it
    assert "6,476,271,616" in out  # exact without embeddings (blocks + final norm)


def test_config_file_with_training_keys_and_overrides(tmp_path, capsys):
    config = tmp_path / "train_gpt2.py"
    config.write_text(
        "learning_rate = 6e-4\nmax_iters = 5000\nbatch_size = 12\n"
        + "".join(f"{k} = {v}\n" for k, v in GPT2_SMALL.items())
    )
    lab.main(["params", str(config)])
    assert "124,439,808" in capsys.readouterr().out
    lab.main(["params", str(config), "--n_layer=6", "--tie_embeddings", "false"])
    expected = 124_439_808 - 6 * 7_087_872 + 50257 * 768  # six fewer blocks, a separate lm_head
    assert f"{expected:,}" in capsys.readouterr().out


def test_bad_settings_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="did you mean '--n_layer'"):
        params.config_from_argv(["--n_layers=3"])
    with pytest.raises(UserError, match="n_embd=100"):
        params.config_from_argv(["--n_embd=100"])
    bad = tmp_path / "bad.py"
    bad.write_text("n_layer = 'twelve'\n")
    with pytest.raises(UserError, match="n_layer"):
        params.config_from_argv([str(bad)])


def test_llama_config_loads_as_gpt_config():
    # The shipped config holds model settings only, so any script taking GPTConfig accepts it.
    from gptkit.config import read_config_file

    values = read_config_file(REPO / "configs" / "llama2_7b.py")
    config = GPTConfig(**values)
    assert (config.n_layer, config.n_embd, config.hidden_size, config.tie_embeddings) == (32, 4096, 11008, False)


def test_vocabulary_comes_from_the_prepared_dataset_as_in_train(tmp_path, monkeypatch, capsys):
    # configs/shakespeare.py trains with the 65 characters of data/shakespeare_char, not GPT-2's 50,257.
    monkeypatch.chdir(tmp_path)
    write_char_dataset(tmp_path / "data", "shakespeare_char", text="abcdefghij\n" * 500)
    config, note = params.config_from_argv([str(REPO / "configs" / "shakespeare.py")])
    assert config.vocab_size == 11 and "data/shakespeare_char/meta.json" in note
    assert lab.main(["params", str(REPO / "configs" / "shakespeare.py")]) == 0
    out = capsys.readouterr().out
    assert "vocabulary 11," in out and "50257" not in out
    write_char_dataset(tmp_path / "other", "mine", text="xyz\n" * 500)
    config, _ = params.config_from_argv([str(REPO / "configs" / "shakespeare.py"), "--data_dir=other", "--dataset=mine"])
    assert config.vocab_size == 4
    config, note = params.config_from_argv([str(REPO / "configs" / "shakespeare.py"), "--vocab_size=99"])
    assert config.vocab_size == 99 and note is None  # asked for explicitly


def test_unprepared_dataset_says_what_vocabulary_it_assumed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config, note = params.config_from_argv([str(REPO / "configs" / "shakespeare_char.py")])
    assert config.vocab_size == 50257
    assert "50,257 assumed" in note and "python prepare.py shakespeare_char" in note and "--vocab_size" in note
    config, note = params.config_from_argv([str(REPO / "configs" / "llama2_7b.py")])
    assert config.vocab_size == 32000 and note is None  # the config sets it and names no dataset


def test_lab_params_help(capsys):
    assert lab.main(["params", "--help"]) == 0
    assert "lab.py params configs/gpt2.py" in capsys.readouterr().out


VARIANTS = [
    dict(),  # GPT-2's block: learned positions, LayerNorm, GELU, tied embeddings, biases
    dict(pos_encoding="rope", norm="rmsnorm", mlp="relu2", qk_norm=True, tie_embeddings=False, logit_softcap=15.0),
    dict(pos_encoding="sinusoidal", bias=False, mlp="swiglu", n_kv_head=2),
    dict(pos_encoding="none", norm_placement="post", mlp="gelu_exact"),
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_meta_model_has_the_built_models_shapes_and_allocates_no_matrix(variant):
    import torch
    from model import GPT

    config = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=50, **variant)
    meta, real = shapes.meta_model(config), GPT(config)
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}
    matrices = [p for p in meta.parameters() if p.dim() == 2]
    assert matrices and all(p.is_meta for p in matrices)
    assert sum(p.numel() for p in meta.parameters()) == sum(p.numel() for p in real.parameters())
    assert not any(p.is_meta for p in GPT(config).parameters())  # the mode ends with meta_model


def test_loading_a_checkpoint_leaves_torch_compile_unimported(tmp_path):
    """The shape check before allocating (gptkit/models/loading.py) builds on meta tensors without
    PyTorch's reference implementations, whose first use imports torch._dynamo: about a
    second of every sample.py, serve.py and eval.py start (measured)."""
    import dataclasses
    import subprocess
    import sys

    from gptkit.ops.checkpoint import save_checkpoint
    from model import GPT

    config = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=20, pos_encoding="rope")
    save_checkpoint({"format_version": 1, "model": GPT(config).state_dict(),
                     "model_config": dataclasses.asdict(config),
                     "tokenizer": {"type": "char", "chars": [chr(97 + i) for i in range(20)]}}, tmp_path / "ckpt.pt")
    code = ("import sys; from gptkit.models import loading; from gptkit.ops.checkpoint import load_checkpoint; "
            f"p = {str(tmp_path / 'ckpt.pt')!r}; loading.model_from_checkpoint(load_checkpoint(p), p); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_parts_found_by_what_they_are_are_model_pys_own():
    """blocks, vocabulary_matrices and blocks_held name what model.py's names say (the
    renamed-module tests run them on other names): a position table with as many rows as
    the padded vocabulary is not taken for the token embedding, tied or not."""
    from gptkit.models.shapes import blocks, blocks_held, vocabulary_matrices

    for tied in (True, False):
        model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=128, vocab_size=100, pad_vocab_multiple=64,
                              tie_embeddings=tied))
        assert model.config.padded_vocab_size == model.config.block_size == 128
        assert blocks(model) == ("transformer.h", model.transformer.h)
        assert vocabulary_matrices(model) == ["transformer.wte.weight", "lm_head.weight"]
        assert blocks_held(model.state_dict()) == 3
