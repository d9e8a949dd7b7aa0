"""The checks a job makes of its batch and ranks, at 64 and 512 ranks on a laptop:
WORLD_SIZE and RANK as torchrun sets them, and --dry_run=true, which stops after the
checks (before any process group, data or write). The same one-line errors as on 2."""

import subprocess
import sys

import pytest

import train
from gptkit.ops.errors import UserError
from train_helpers import REPO, subprocess_env, tiny_args


def ranks(monkeypatch, world_size):
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.setenv(name, "0")


def message(world_size, accumulation, batch_size, suggested):
    return (f"gradient_accumulation_steps={accumulation} (the global count) must be divisible by the number of ranks, "
            f"{world_size}: use a multiple of {world_size}, e.g. --gradient_accumulation_steps={suggested[0]} "
            f"--batch_size={suggested[1]} for about the same global batch")


@pytest.mark.parametrize("world_size, accumulation, batch_size, suggested", [
    (2, 3, 4, (6, 2)),  # as before: exactly the same global batch, 12 windows
    (64, 96, 12, (128, 9)),  # 1152 windows: 18 a rank; it was 6144 x 1, five times the batch
    (512, 40, 12, (512, 1)),  # 480 windows: one a rank, the nearest there is
])
def test_accumulation_that_does_not_divide_among_the_ranks_is_one_line_at_any_scale(
        tmp_path, monkeypatch, world_size, accumulation, batch_size, suggested):
    ranks(monkeypatch, world_size)
    args = tiny_args(tmp_path / "nodata", tmp_path / "out", gradient_accumulation_steps=accumulation,
                     batch_size=batch_size, dry_run="true")
    with pytest.raises(UserError) as caught:
        train.main(args)
    assert str(caught.value) == message(world_size, accumulation, batch_size, suggested)
    G, B = suggested  # the suggestion passes the check, and keeps about the same global batch
    assert train.main([*args, f"--gradient_accumulation_steps={G}", f"--batch_size={B}"]) == 0
    assert abs(G * B - accumulation * batch_size) <= max(world_size, accumulation * batch_size) / 2
    assert not (tmp_path / "out").exists()


def test_a_dry_run_at_512_ranks_says_what_each_rank_takes_and_writes_nothing(tmp_path, monkeypatch, capsys):
    ranks(monkeypatch, 512)
    args = tiny_args(tmp_path / "nodata", tmp_path / "out", gradient_accumulation_steps=1024, batch_size=8,
                     block_size=1024, n_embd=64, dry_run="true")
    assert train.main(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "dry run: the settings hold for 512 ranks: each iteration takes 8,192 windows of 1024 tokens "
        "(8,388,608 tokens), each rank 2 micro-batches of 8; nothing was read or written")
    with pytest.raises(UserError, match="tokens in one micro-batch"):  # the other batch checks run too
        train.main([*args, "--batch_size=4000000"])
    assert not (tmp_path / "out").exists() and not (tmp_path / "nodata").exists()


def test_at_64_ranks_the_mistake_is_one_line_exit_2_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"),
         *tiny_args(tmp_path / "nodata", tmp_path / "out", gradient_accumulation_steps=96, batch_size=12, dry_run="true")],
        cwd=tmp_path, env=subprocess_env(WORLD_SIZE="64", RANK="0", LOCAL_RANK="0"), capture_output=True, text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: " + message(64, 96, 12, (128, 9))]
    assert not (tmp_path / "out").exists()
