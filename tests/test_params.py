"""params.py: exact parameter counts from shapes alone, for any config file."""


import pytest

from gptkit.errors import UserError
from model import GPTConfig
import params
from repo import REPO

GPT2_SMALL = dict(block_size=1024, vocab_size=50257, n_layer=12, n_head=12, n_embd=768)


def test_gpt2_small_table():
    table = dict(params.parameter_table(GPTConfig(**GPT2_SMALL)))
    assert sum(table.values()) == 124_439_808
    assert table["token embedding (wte)"] == 50257 * 768
    assert table["position embedding (wpe)"] == 1024 * 768
    assert table["output layer (lm_head)"] == 0  # tied: counted once, as wte
    assert table["attention (c_attn, c_proj, q/k norms)"] == 12 * (768 * 3 * 768 + 3 * 768 + 768 * 768 + 768)


def test_shipped_gpt2_config_counts_gpt2_small_and_shows_padding_apart(capsys):
    assert params.main([str(REPO / "configs" / "gpt2.py")]) == 0
    out = capsys.readouterr().out
    assert "total                                        124,439,808" in out
    assert "vocabulary padding (never predicted)            36,096" in out  # 47 rows of 768
    assert "124,475,904 in memory" in out


def test_llama2_7b_config_file(capsys):
    assert params.main([str(REPO / "configs" / "llama2_7b.py")]) == 0
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
    params.main([str(config)])
    assert "124,439,808" in capsys.readouterr().out
    params.main([str(config), "--n_layer=6", "--tie_embeddings", "false"])
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
