"""Every shipped config loads and validates; the key recipes hold their documented values."""

import dataclasses
from pathlib import Path

import pytest

from gptkit.config import parse_settings
from model import GPTConfig
from train import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "configs").glob("*.py"))


def load(path):
    return parse_settings([str(path)], [GPTConfig, TrainConfig], prog="train.py")


def test_there_are_configs():
    names = {p.name for p in CONFIGS}
    assert {"shakespeare.py", "shakespeare_char.py", "gpt2.py", "finetune_shakespeare.py"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_loads_and_validates(path):
    if path.name.startswith("rl_"):  # rl.py's recipes
        import rl

        (cfg,) = parse_settings([str(path)], [rl.RLConfig], prog="rl.py")
        assert isinstance(cfg, rl.RLConfig)
        return
    model_cfg, train_cfg = load(path)
    assert isinstance(model_cfg, GPTConfig) and isinstance(train_cfg, TrainConfig)


@pytest.mark.parametrize("name", ["shakespeare.py", "shakespeare_char.py", "gpt2.py", "finetune_shakespeare.py"])
def test_training_recipes_are_consistent(name):
    model_cfg, train_cfg = load(CONFIGS[0].parent / name)
    assert train_cfg.out_dir != TrainConfig().out_dir, "each config writes to its own out_dir"
    # the learning-rate schedule must end where the run ends
    if train_cfg.decay_lr:
        assert train_cfg.lr_decay_iters == train_cfg.max_iters
        assert train_cfg.warmup_iters < train_cfg.max_iters


def test_shakespeare_char_is_nanogpts_baby_gpt():
    m, t = load(Path(CONFIGS[0]).parent / "shakespeare_char.py")
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.dropout, m.bias) == (6, 6, 384, 256, 0.2, False)
    assert (t.batch_size, t.learning_rate, t.max_iters, t.warmup_iters, t.min_lr, t.beta2) == (64, 1e-3, 5000, 100, 1e-4, 0.99)
    assert (t.eval_interval, t.eval_iters, t.out_dir, t.dataset) == (250, 200, "out-shakespeare-char", "shakespeare_char")


def test_gpt2_is_124m_on_8_gpus():
    m, t = load(Path(CONFIGS[0]).parent / "gpt2.py")
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.pad_vocab_multiple) == (12, 12, 768, 1024, 64)
    assert (t.batch_size, t.gradient_accumulation_steps, t.max_iters, t.learning_rate, t.weight_decay) == (12, 40, 600000, 6e-4, 0.1)
    assert t.compile == "true" and t.gradient_accumulation_steps % 8 == 0


def test_quick_start_and_finetune():
    m, t = load(Path(CONFIGS[0]).parent / "shakespeare.py")
    assert t.out_dir == "out-shakespeare" and t.dataset == "shakespeare_char"  # sample.py's default
    m, t = load(Path(CONFIGS[0]).parent / "finetune_shakespeare.py")
    assert t.init_from == "gpt2" and t.dataset == "shakespeare" and not t.always_save_checkpoint


def test_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit) as info:
        parse_settings(["--help"], [GPTConfig, TrainConfig], prog="train.py")
    assert info.value.code == 0
    text = capsys.readouterr().out
    for cls in (GPTConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            assert f"--{f.name} (" in text, f.name
            assert f.metadata["help"] in text


def test_the_minute_configs_are_the_1200_cpu_second_recipe_with_budgets_for_two_threads():
    """configs/shakespeare_10min.py imports every setting of shakespeare_1200cpus.py (its dtype
    choice by CPU included) and changes only where it writes and its budget (two threads' CPU
    seconds, with max_iters out of the way); shakespeare_5min.py is the same at half the budget."""
    folder = CONFIGS[0].parent
    (m5, t5), (m10, t10), (m20, t20) = (load(folder / f"shakespeare_{n}.py") for n in ("5min", "10min", "1200cpus"))
    assert m5 == m10 == m20
    changed = {f.name for f in dataclasses.fields(TrainConfig) if getattr(t10, f.name) != getattr(t20, f.name)}
    assert changed == {"out_dir", "time_budget", "max_iters", "lr_decay_iters"}  # lr_decay_iters: max_iters by default
    changed = {f.name for f in dataclasses.fields(TrainConfig) if getattr(t5, f.name) != getattr(t10, f.name)}
    assert changed == {"out_dir", "time_budget"}
    assert (t10.out_dir, t10.time_budget, t5.out_dir, t5.time_budget) == (
        "out-shakespeare-10min", 1170.0, "out-shakespeare-5min", 585.0)
    assert t10.max_iters * 0.09 > t10.time_budget / 2  # steps of ~0.1 s wall: the budget ends the run


def test_every_config_header_is_short_and_points_to_its_figures():
    """A config says what it trains, its command and its current figure in at most 10
    lines; the story of how it was found lives in benchmarks/LOG.md (nanoGPT's configs are
    10-30 lines with no history)."""
    long = {}
    for path in CONFIGS:
        lines = path.read_text(encoding="utf-8").splitlines()
        header = 0
        while header < len(lines) and lines[header].startswith("#"):
            header += 1
        if header > 10:
            long[path.name] = header
    assert long == {}
