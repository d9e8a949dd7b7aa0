"""Destinations a user gets wrong, for every command that writes: one line naming the
path and the fix (exit 2) before any work, and a full disk during the write is one
line (exit 1) that leaves nothing behind (gptkit/ops/paths.py)."""

import dataclasses
import os
import resource
import subprocess
import sys

import pytest
import torch

import convert

from gptkit.ops.checkpoint import FORMAT_VERSION, load_checkpoint, save_checkpoint, write_text_atomic
from gptkit.ops.errors import UserError
from gptkit.ops.paths import NAME_MAX, claim_output, temp_name
from model import GPT, GPTConfig
from repo import REPO
from train_helpers import subprocess_env

CHARS = sorted(set("First Citizen:\nBefore we proceed any further, hear me speak.\n"))
LONG_NAME = "n" * 300  # a name component over NAME_MAX (255 bytes)


@pytest.fixture
def read_only(tmp_path):
    """A folder no one may create files in, root included: root ignores permission bits,
    so as root it is marked immutable (chattr +i), which the kernel enforces for root too."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("running as root and chattr +i is not available on this file system")
        yield folder
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


def test_the_read_only_folder_really_refuses_new_files(read_only):
    with pytest.raises(OSError):
        (read_only / "x").write_text("x")


def tiny_run(folder):
    """An out_dir holding a 2-layer char model's ckpt.pt."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=len(CHARS), dropout=0.0))
    folder.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"format_version": FORMAT_VERSION, "model": model.state_dict(),
                     "model_config": dataclasses.asdict(model.config),
                     "tokenizer": {"type": "char", "chars": CHARS}, "iter_num": 7}, folder / "ckpt.pt")
    return folder


def run(script, *args, fsize=None, timeout=120, input=None):
    """A command as the user runs it; with `fsize`, files it writes may grow to that many
    bytes only (RLIMIT_FSIZE): a disk that fills up during the write."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, env=subprocess_env(),
                          capture_output=True, timeout=timeout, input=input,
                          preexec_fn=limit if fsize else None)


def one_line(result, code=2):
    err = result.stderr.decode("utf-8", "backslashreplace")
    assert result.returncode == code, err
    assert "Traceback" not in err and err.startswith("error: ") and err.count("\n") == 1, err
    return err


# ---- claim_output itself ------------------------------------------------------------


def test_a_read_only_folder_is_refused_naming_it(read_only):
    for path, kind, overwrite in ((read_only / "ckpt.pt", "file", False), (read_only / "data" / "x", "folder", True),
                                  (read_only, "folder", True)):
        with pytest.raises(UserError, match=f"{read_only}.*choose a folder you can write to"):
            claim_output(path, kind, overwrite)
    assert list(read_only.iterdir()) == []


def test_names_and_paths_the_system_would_refuse(tmp_path):
    with pytest.raises(UserError, match="300 bytes long; file names are at most 255 bytes"):
        claim_output(tmp_path / LONG_NAME, "file")
    with pytest.raises(UserError, match="over the system's limit of 4096"):
        claim_output(tmp_path / "/".join(["d" * 200] * 25), "folder", overwrite=True)
    bad = tmp_path / os.fsdecode(b"run-\xff")  # what Python makes of a non-UTF-8 byte in argv
    with pytest.raises(UserError, match=r"run-\\xff: the name is not valid UTF-8"):
        claim_output(bad, "folder", overwrite=True)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match="notes.txt is not a folder"):
        claim_output(tmp_path / "notes.txt" / "out.pt", "file")
    with pytest.raises(UserError, match="does not exist: create it first"):
        claim_output(tmp_path / "missing" / "out.pt", "file")


def test_the_wrong_kind_of_thing_at_the_destination(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(UserError, match="link is a folder \\(through a symlink\\): give a file name"):
        claim_output(tmp_path / "link", "file")
    with pytest.raises(UserError, match="empty is a folder: give a file name"):
        claim_output(tmp_path / "empty", "file", overwrite=True)
    with pytest.raises(UserError, match="/dev/full is not a regular file"):
        claim_output("/dev/full", "file", overwrite=True)
    (tmp_path / "old.pt").write_text("x")
    with pytest.raises(UserError, match="old.pt already exists: give a new file name"):
        claim_output(tmp_path / "old.pt", "file")
    with pytest.raises(UserError, match="old.pt exists and is not a folder"):
        claim_output(tmp_path / "old.pt", "folder", overwrite=True)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UserError, match="full already exists and is not empty"):
        claim_output(tmp_path / "full", "folder")
    # What may be written: a new file, a replaced one, a symlink to a folder written into (its target).
    assert claim_output(tmp_path / "old.pt", "file", overwrite=True) == tmp_path / "old.pt"
    assert claim_output(tmp_path / "link", "folder", overwrite=True) == tmp_path / "empty"
    assert claim_output(tmp_path / "new" / "deeper", "folder", overwrite=True) == tmp_path / "new" / "deeper"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full", "link", "old.pt"]  # no probe left


def test_a_symlink_of_any_kind_is_an_existing_destination(tmp_path):
    # A symlink to nothing was written through (convert.py RUN out.gguf --to gguf, exit 0):
    # every destination that is not overwritten on purpose refuses a symlink, dangling or not.
    (tmp_path / "empty").mkdir()
    (tmp_path / "to-empty").symlink_to(tmp_path / "empty")
    (tmp_path / "to-nothing.gguf").symlink_to(tmp_path / "nowhere.gguf")
    (tmp_path / "to-nothing").symlink_to(tmp_path / "nowhere")
    for name, kind in [("to-nothing.gguf", "file"), ("to-nothing", "folder"), ("to-empty", "folder")]:
        with pytest.raises(UserError, match=f"{name} already exists \\(a symlink to .*\\): give a new {kind} name"):
            claim_output(tmp_path / name, kind)
    with pytest.raises(UserError, match="which does not exist"):
        claim_output(tmp_path / "to-nothing.gguf", "file")
    result = run("convert.py", str(tmp_path / "no-such-run"), str(tmp_path / "to-nothing.gguf"), "--to", "gguf")
    assert "to-nothing.gguf already exists (a symlink to" in one_line(result)
    for to, dest in [("pt", "to-nothing.gguf"), ("hf", "to-nothing"), ("hf", "to-empty")]:
        with pytest.raises(UserError, match="already exists \\(a symlink to"):
            convert.main([str(tmp_path / "no-such-run"), str(tmp_path / dest), "--to", to])
    assert sorted(os.listdir(tmp_path)) == ["empty", "to-empty", "to-nothing", "to-nothing.gguf"]
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_name_near_the_limit_still_gets_a_temporary_name_that_fits(tmp_path):
    name = "é" * 127  # 254 bytes: allowed, but ".<name>.tmp-<pid>" would not be
    assert len(os.fsencode(temp_name(name, "1234567-abcdef12"))) <= NAME_MAX
    assert temp_name(name, "1") != temp_name("é" * 126 + "e", "1")  # the hash keeps cut names apart
    save_checkpoint({"w": torch.ones(3)}, tmp_path / name)
    assert torch.equal(load_checkpoint(tmp_path / name)["w"], torch.ones(3))
    write_text_atomic(tmp_path / (name[:-1] + "j"), "text")
    assert sorted(os.listdir(tmp_path)) == sorted([name, name[:-1] + "j"])


# ---- the commands ---------------------------------------------------------------------


def test_convert_refuses_bad_destinations_before_loading_anything(tmp_path, read_only):
    # The source does not exist either: the destination is checked first, so its error is the one.
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    cases = [
        (["--to", "pt"], read_only / "ckpt.pt", "choose a folder you can write to"),
        (["--to", "hf"], read_only / "hf", "choose a folder you can write to"),
        (["--to", "pt"], tmp_path / LONG_NAME, "300 bytes long"),
        (["--to", "hf"], tmp_path / LONG_NAME, "300 bytes long"),
        (["--to", "pt"], "/dev/full", "not a regular file"),
        (["--to", "pt"], tmp_path / "link", "is a folder \\(through a symlink\\)"),
        (["--to", "pt"], tmp_path / ("x/" * 2100 + "ckpt.pt"), "over the system's limit"),
    ]
    for to, dest, reason in cases:
        result = run("convert.py", str(tmp_path / "no-such-run"), str(dest), *to)
        assert reason.replace("\\", "") in one_line(result), (to, dest)
    assert list(read_only.iterdir()) == [] and sorted(os.listdir(tmp_path)) == ["empty", "link", "read-only"]


def test_convert_to_hf_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    pytest.importorskip("safetensors")
    tiny_run(tmp_path / "run")
    result = run("convert.py", str(tmp_path / "run"), str(tmp_path / "hf"), "--to", "hf", fsize=4096)
    err = one_line(result, code=1)
    assert "could not write" in err and "hf" in err
    assert sorted(os.listdir(tmp_path)) == ["run"]  # no hf/, no temporary folder


def test_a_name_whose_temporary_name_would_be_too_long_converts(tmp_path):
    pytest.importorskip("safetensors")
    tiny_run(tmp_path / "run")
    dest = tmp_path / ("h" * 250)  # fits NAME_MAX; ".<dest>.tmp-<pid>" alone would not
    result = run("convert.py", str(tmp_path / "run"), str(dest), "--to", "hf")
    assert result.returncode == 0, result.stderr.decode()
    assert (dest / "config.json").is_file() and sorted(os.listdir(tmp_path)) == sorted(["run", dest.name])


def test_eval_plot_out_destinations_and_a_full_disk(tmp_path, read_only):
    pytest.importorskip("matplotlib")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    rows = [f'{{"kind": "train", "iter": {i}, "loss": {4 - i / 10}, "lr": 0.001}}' for i in range(10)]
    (run_dir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    for out, reason in ((read_only / "loss.png", "choose a folder you can write to"), ("/dev/full", "not a regular file"),
                        (tmp_path / LONG_NAME, "300 bytes long"), (run_dir, "is a folder: give a file name")):
        assert reason in one_line(run("eval.py", "plot", str(run_dir), "--out", str(out)))
    (tmp_path / "old.png").write_bytes(b"the previous plot")
    err = one_line(run("eval.py", "plot", str(run_dir), "--out", str(tmp_path / "old.png"), fsize=2000), code=1)
    assert "could not write" in err and "old.png" in err
    assert (tmp_path / "old.png").read_bytes() == b"the previous plot"  # kept whole, no temporary file beside it
    assert sorted(os.listdir(tmp_path)) == ["old.png", "read-only", "run"]


def test_eval_json_destination_is_checked_before_any_model_loads(tmp_path):
    result = run("eval.py", str(tmp_path / "no-such-run"), "--input", str(tmp_path / "none.txt"),
                 "--json", "/dev/full")
    assert "--json /dev/full is not a regular file" in one_line(result)


def test_train_out_dir_mistakes_are_one_line(tmp_path, read_only):
    # No dataset exists: the out_dir is taken first, so its error is the one reported.
    common = ["configs/shakespeare.py", "--device=cpu", f"--data_dir={tmp_path / 'data'}", "--dataset=none"]
    for out_dir, reason in ((read_only / "run", "choose a folder you can write to"),
                            (tmp_path / LONG_NAME, "300 bytes long"),
                            (os.fsencode(tmp_path) + b"/run-\xff", "the name is not valid UTF-8")):
        out = out_dir if isinstance(out_dir, bytes) else str(out_dir).encode()
        result = subprocess.run([sys.executable, str(REPO / "train.py"), *common, b"--out_dir=" + out], cwd=REPO,
                                env=subprocess_env(), capture_output=True, timeout=120)
        assert reason in one_line(result), out_dir
    assert sorted(os.listdir(tmp_path)) == ["read-only"]


def test_prepare_refuses_its_dataset_folder_before_reading_the_input(tmp_path, read_only):
    text = tmp_path / "in.txt"
    text.write_text("a few words of text to prepare\n" * 50)
    for args, reason in ((["--data_dir", str(read_only)], "choose a folder you can write to"),
                         (["--name", LONG_NAME], "300 bytes long"),
                         (["--data_dir", "/dev/full"], "/dev/full is not a folder")):
        argv = ["--input", str(text), "--tokenizer", "bpe", "--vocab_size", "300", "--name", "mine",
                "--data_dir", str(tmp_path / "data"), *args]
        assert reason in one_line(run("prepare.py", *argv)), args
    assert sorted(os.listdir(tmp_path)) == ["in.txt", "read-only"]


def test_prepare_checks_the_folder_before_the_scan(tmp_path, read_only, monkeypatch):
    from gptkit.prepare import build

    def scan_too_early(*args, **kwargs):
        raise AssertionError("the input was scanned before the destination was checked")

    monkeypatch.setattr(build, "scan_inputs", scan_too_early)
    text = tmp_path / "in.txt"
    text.write_text("text\n" * 100)
    with pytest.raises(UserError, match="choose a folder you can write to"):
        build.prepare_dataset([text], "bpe", "mine", read_only, vocab_size=300, progress=False)


def test_inputs_whose_names_the_system_refuses_are_one_line_too(tmp_path):
    from gptkit.evals.evaluation import load_candidate
    from gptkit.models.loading import load_model
    from gptkit.prepare.sources import resolve_inputs

    long = tmp_path / LONG_NAME
    for read in (lambda: load_model(out_dir=long), lambda: load_model(ckpt=long), lambda: load_candidate(str(long)),
                 lambda: resolve_inputs([str(long)])):
        with pytest.raises(UserError, match="cannot read .*: File name too long"):
            read()


def test_one_cache_folder_for_every_download_measurement_and_build(tmp_path, monkeypatch):
    """$GPTKIT_CACHE_DIR, else $XDG_CACHE_HOME/gptkit, else ~/.cache/gptkit (an empty
    variable counts as unset), for the tasks, GSM8K, the CPU peak and the int8 kernel."""
    from gptkit.fast import int8_kernel
    from gptkit.evals import tasks
    from gptkit.ops.paths import cache_dir
    from gptkit.train import mfu

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPTKIT_CACHE_DIR", "")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir("tasks") == tmp_path / "home" / ".cache" / "gptkit" / "tasks"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("tasks") == tmp_path / "xdg" / "gptkit" / "tasks"
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir("gsm8k") == tmp_path / "mine" / "gsm8k"
    for module in (int8_kernel, tasks, mfu):  # none keeps a folder rule of its own (rl.py's GSM8K: tasks')
        assert "cache_dir" in vars(module) and vars(module)["cache_dir"] is cache_dir
