"""init_from=auto, what a job that torchrun restarts runs with: scratch into an empty
out_dir, resume of its own run, and another run's folder refused (docs/distributed.md)."""

import pytest

import train
from gptkit.ops.errors import UserError
from gptkit.ops.checkpoint import load_checkpoint
from train_helpers import losses_by_iter, read_metrics, tiny_args, write_char_dataset

ARGS = dict(n_layer=1, n_embd=16, block_size=16, max_iters=6, eval_interval=3, lr_decay_iters=6)


def test_auto_trains_from_scratch_then_resumes_its_own_run_and_refuses_another(tmp_path, capsys):
    data = write_char_dataset(tmp_path / "data").parent
    out = tmp_path / "out"
    assert train.main(tiny_args(data, tmp_path / "ref", **ARGS)) == 0  # uninterrupted, init_from=scratch
    assert train.main(tiny_args(data, out, init_from="auto", **{**ARGS, "max_iters": 3})) == 0
    assert "init_from=auto: no checkpoint in" in capsys.readouterr().out
    assert load_checkpoint(out / "ckpt.pt")["config"]["init_from"] == "scratch"  # what it did
    # The same command again, as a restart runs it (with more steps): resumes, exactly.
    assert train.main(tiny_args(data, out, init_from="auto", **ARGS)) == 0
    assert "resumed from" in capsys.readouterr().out
    assert losses_by_iter(out) == losses_by_iter(tmp_path / "ref")  # one process: bit for bit
    assert [r["iter"] for r in read_metrics(out, "train")] == list(range(6))  # metrics.jsonl: one run
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 6
    before = (out / "ckpt.pt").read_bytes()
    # Another run's folder (another model shape, another optimizer) is refused, untouched.
    with pytest.raises(UserError, match=r"holds another run \(n_layer=1 there, 2 here; optimizer=adamw there, "
                                        r"muon here\): init_from=auto resumes only its own run; continue that one "
                                        r"with --init_from=resume.*--overwrite=true"):
        train.main(tiny_args(data, out, init_from="auto", optimizer="muon", **{**ARGS, "n_layer": 2}))
    assert (out / "ckpt.pt").read_bytes() == before
    # --overwrite replaces it, as it does for init_from=scratch.
    assert train.main(tiny_args(data, out, init_from="auto", overwrite="true", **{**ARGS, "n_layer": 2, "max_iters": 1})) == 0
    assert "replacing it (--overwrite)" in capsys.readouterr().out
    assert load_checkpoint(out / "ckpt.pt")["model_config"]["n_layer"] == 2


def test_a_second_job_on_a_live_out_dir_is_still_refused(tmp_path):
    from gptkit.ops.lock import FolderLock

    data = write_char_dataset(tmp_path / "data").parent
    with FolderLock(tmp_path / "out", "training run"):  # another job's claim, held
        with pytest.raises(UserError, match="is in use by another training run"):
            train.main(tiny_args(data, tmp_path / "out", init_from="auto", **ARGS))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".lock"]


def test_auto_with_lora_and_no_checkpoint_says_how_to_start(tmp_path):
    data = write_char_dataset(tmp_path / "data").parent
    with pytest.raises(UserError, match="init_from=auto found no checkpoint in .* lora_rank > 0 adapts a trained model"):
        train.main(tiny_args(data, tmp_path / "out", init_from="auto", lora_rank=2, **ARGS))
    assert not (tmp_path / "out").exists()


def test_auto_refuses_a_run_on_other_data_under_the_same_name_and_resumes_a_copy(tmp_path):
    """The run's identity holds the data (meta.json's fingerprint), not only the dataset's
    name: another --data_dir whose 'tiny' holds another text is refused in one line naming
    both folders, untouched; the same data copied to another folder resumes."""
    import shutil

    data = write_char_dataset(tmp_path / "data").parent
    other = write_char_dataset(tmp_path / "other", text="a different text, same name. " * 400).parent
    out = tmp_path / "out"
    assert train.main(tiny_args(data, out, init_from="auto", **{**ARGS, "max_iters": 3})) == 0
    before = (out / "ckpt.pt").read_bytes()
    with pytest.raises(UserError, match=rf"holds another run \(dataset tiny's data: fingerprint \w{{12}} there "
                                        rf"\(data_dir={data}\), \w{{12}} here \(data_dir={other}\)\): init_from=auto "
                                        r"resumes only its own run") as refused:
        train.main(tiny_args(other, out, init_from="auto", **ARGS))
    assert "\n" not in str(refused.value)
    assert (out / "ckpt.pt").read_bytes() == before and len(read_metrics(out, "train")) == 3
    shutil.copytree(data, tmp_path / "copy")
    assert train.main(tiny_args(tmp_path / "copy", out, init_from="auto", **ARGS)) == 0
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 6


@pytest.mark.parametrize("left", ["best.pt", "ckpt"])
def test_auto_on_a_folder_with_nothing_to_resume_says_so_once_and_its_advice_runs(tmp_path, capsys, left):
    """A folder whose ckpt.pt is gone (best.pt alone: weights, no optimizer) or whose sharded
    ckpt/ never finished holds a run that cannot be resumed: one line, nothing printed before
    it, the folder untouched; the command it suggests trains; --overwrite replaces it."""
    import shlex

    data = write_char_dataset(tmp_path / "data").parent
    out = tmp_path / "out"
    assert train.main(tiny_args(data, out, **{**ARGS, "max_iters": 3})) == 0
    (out / "ckpt.pt").unlink()
    if left == "ckpt":
        (out / "best.pt").unlink()
        (out / "ckpt").mkdir()  # a sharded save that died before its first file
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".lock"}
    capsys.readouterr()
    with pytest.raises(UserError, match=rf"out_dir {out} holds {left} but nothing to resume") as refused:
        train.main(tiny_args(data, out, init_from="auto", **ARGS))
    assert "\n" not in str(refused.value) and capsys.readouterr().out == ""
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".lock"} == before and left in before
    advice = str(refused.value).split(": ")[-1].split(", or")[0]  # "start a new run ... --out_dir=OTHER"
    advice = [word for word in shlex.split(advice) if word.startswith("--")]
    assert ("--init_from=" + str(out / "best.pt") in advice) == (left == "best.pt")
    settings = dict(word[2:].split("=", 1) for word in tiny_args(data, out, init_from="auto", **ARGS) + advice)
    settings["out_dir"] = tmp_path / "other"  # the line's OTHER
    assert train.main([f"--{k}={v}" for k, v in settings.items()]) == 0  # what the line says to run, runs
    assert train.main(tiny_args(data, out, init_from="auto", overwrite="true", **ARGS)) == 0
    assert "starting from scratch (replacing" in capsys.readouterr().out and (out / "ckpt.pt").is_file()
