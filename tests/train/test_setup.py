"""gptkit/train/setup.py: the note for a model that is mostly embedding (a large
vocabulary on a small model), shown by train.py at start."""

import torch

import train
from gptkit.config import read_config_file
from gptkit.train.setup import embedding_heavy_note
from model import GPT, GPTConfig
from repo import REPO
from train_helpers import tiny_args, write_char_dataset


def quick_start_model(vocab_size):
    values = read_config_file(REPO / "configs" / "shakespeare.py")
    fields = {k: v for k, v in values.items() if k in GPTConfig.__dataclass_fields__}
    with torch.device("meta"):  # shapes only
        return GPT(GPTConfig(**{**fields, "vocab_size": vocab_size}))


def test_quick_start_with_gpt2_bpe_is_named_with_its_shares():
    model = quick_start_model(50257)
    note = embedding_heavy_note(model, "scratch")
    embedding = 2 * 50257 * model.config.n_embd  # untied wte and lm_head; RoPE has no position table
    total = sum(p.numel() for p in model.parameters())
    assert f"{embedding / 1e6:.2f}M of the {total / 1e6:.2f}M parameters ({embedding / total:.0%})" in note
    assert f"{(total - embedding) / 1e6:.2f}M the blocks" in note and embedding / total > 0.9
    assert "--tokenizer char" in note and "configs/finetune_shakespeare.py" in note


def test_no_note_for_characters_or_for_gpt2_weights():
    assert embedding_heavy_note(quick_start_model(65), "scratch") is None
    assert embedding_heavy_note(quick_start_model(50257), "gpt2") is None  # its shape is GPT-2's own choice


def test_train_prints_the_note_at_start(tmp_path, capsys):
    text = "".join(chr(0x4E00 + i) for i in range(1500)) * 8  # 1,500 distinct characters
    write_char_dataset(tmp_path / "data", "wide", text=text)
    train.main(tiny_args(tmp_path / "data", tmp_path / "out", dataset="wide", max_iters=1, eval_interval=1, eval_iters=1))
    assert "are the token embedding and output layer (vocabulary 1,500 x width 32)" in capsys.readouterr().out


def test_loop_state_checks_accept_what_runs_save_and_name_what_is_wrong():
    """One check for one-file and sharded checkpoints: counters and every RNG state."""
    import pytest

    from gptkit.ops.errors import UserError
    from gptkit.run_state import check_loop_state, rng_state

    rng = rng_state("cpu")
    good = {"iter_num": 5, "best_val_loss": float("inf"), "val_loss": 2.5, "last_eval_iter": -1, "train_time_s": 3,
            "rng": {**rng, "per_rank": [{"torch": rng["torch"], "cuda": []}] * 2}}  # DDP's per-rank entries
    check_loop_state(good, "ckpt.pt")
    for bad, match in (({"iter_num": True}, "'iter_num' is bool"), ({"val_loss": "2.5"}, "'val_loss' is str"),
                       ({"rng": {**rng, "torch": rng["torch"][:10]}}, "RNG states are malformed"),
                       ({"rng": {**rng, "per_rank": [{"torch": torch.zeros(3)}]}}, "RNG states are malformed"),
                       ({"rng": {**rng, "python": (3, (1, 2), None)}}, "RNG states are malformed")):
        with pytest.raises(UserError, match=rf"ckpt.pt: its {match}|ckpt.pt: {match}"):
            check_loop_state({**good, **bad}, "ckpt.pt")


def test_start_swaps_in_the_hand_written_backward_on_cpu_float32_only(tmp_path):
    """The quick start's speed on CPUs depends on set-up applying gptkit/fast/fused.py: a run
    without it trains the same numbers ~10% slower, so no loss test would notice."""
    from gptkit.fast import fused
    from gptkit.train import distributed, setup

    write_char_dataset(tmp_path / "data")
    model_cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, norm="rmsnorm", mlp="relu2")
    cfg = train.TrainConfig(data_dir=str(tmp_path / "data"), dataset="tiny", out_dir=str(tmp_path / "out"), device="cpu")
    for dtype, swapped in ((torch.float32, True), (torch.bfloat16, False)):
        dev = setup.Device("cpu", dtype, compile=False)
        _, model, _, _ = setup.start(model_cfg, cfg, distributed.Dist(), dev)
        kinds = {type(m) for m in model.modules()}
        assert (fused.FusedRMSNorm in kinds and fused.FusedReLU2 in kinds) == swapped, (dtype, kinds)
