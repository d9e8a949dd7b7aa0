"""eval.py's text as a stream (a pipe, process substitution, `-`), scored like the file;
--max_tokens N reads and encodes only as far as N tokens; sample.py and eval.py read
an FSDP run that holds only its sharded ckpt/; a missing GPU under torchrun is one line."""

import dataclasses
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import eval as eval_script
import sample
from gptkit.ops.checkpoint import FORMAT_VERSION, save_checkpoint
from gptkit.evals.evaluation import InputText, encode_texts
from gptkit.data.tokenizer import CharTokenizer
from model import GPT, GPTConfig
from repo import REPO
from train_helpers import sample_text, subprocess_env

TEXT = sample_text(20_000)
CHARS = sorted(set(TEXT))


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=len(CHARS), dropout=0.0))


def write_run(folder, seed=0):
    model = tiny_model(seed)
    folder.mkdir(parents=True)
    save_checkpoint({"format_version": FORMAT_VERSION, "model": model.state_dict(),
                     "model_config": dataclasses.asdict(model.config),
                     "tokenizer": {"type": "char", "chars": CHARS}, "iter_num": 7}, folder / "ckpt.pt")
    return folder


def eval_json(*args, input=None, shell=None):
    """eval.py's --json results as the user runs it (or through `bash -c shell ARGS`)."""
    command = [sys.executable, str(REPO / "eval.py"), *args, "--json", "-", "--device", "cpu", "--no_progress"]
    if shell is not None:
        command = ["bash", "-c", shell.replace("EVAL", " ".join(f"'{a}'" for a in command))]
    result = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, input=input, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    return [{k: m[k] for k in ("loss", "tokens", "bytes")} for m in json.loads(result.stdout)["models"]]


def test_stdin_and_process_substitution_score_like_the_file(tmp_path):
    runs = [str(write_run(tmp_path / "a", 0)), str(write_run(tmp_path / "b", 1))]
    text = tmp_path / "held_out.txt"
    text.write_text(TEXT)
    expected = eval_json(*runs, "--input", str(text))
    assert expected[0]["tokens"] == len(TEXT) - 1 and expected[0]["loss"] != expected[1]["loss"]
    # Two models on one stream: the second reads what the first read, kept in memory.
    assert eval_json(*runs, "--input", "-", input=text.read_bytes()) == expected
    assert eval_json(*runs, shell=f"EVAL --input <(cat '{text}')") == expected


def test_max_tokens_stops_reading_an_endless_pipe(tmp_path):
    run = write_run(tmp_path / "run")
    t0 = time.monotonic()
    scored = eval_json(str(run), shell="yes 'First Citizen: speak, speak.' | EVAL --input - --max_tokens 500")
    assert scored[0]["tokens"] == 499 and time.monotonic() - t0 < 60  # 500 tokens: 499 predicted


def test_max_tokens_encodes_only_the_start_of_a_huge_file(tmp_path, tiktoken_available):
    from types import SimpleNamespace

    from gptkit.data.tokenizer import GPT2Tokenizer

    text = sample_text(200_000) + " x  \n\n\t y123 4567 ünïcødé 日本語 🙂 it's  end   "
    path = tmp_path / "huge.txt"
    with open(path, "w") as f:
        for _ in range(250):  # ~50 MB
            f.write(text)
    tokenizer = GPT2Tokenizer()
    candidate = SimpleNamespace(tokenizer=tokenizer, name="gpt2")
    whole = np.array(tokenizer.encode(text * 2))
    for n in (2, 1000, 7777, 100_000):  # chunk edges fall inside and between words
        ids = encode_texts(candidate, InputText([path]), n)
        assert len(ids) == 1 and np.array_equal(ids[0], whole[:n]), n
    t0 = time.monotonic()
    encode_texts(candidate, InputText([path]), 1000)
    assert time.monotonic() - t0 < 2  # the whole 50 MB take ~10 s to encode
    char = SimpleNamespace(tokenizer=CharTokenizer(sorted(set(text))), name="char")
    ids = encode_texts(char, InputText([path]), 300_000)
    assert np.array_equal(ids[0], char.tokenizer.encode((text * 2)[:300_000]))


def sharded_run(out_dir, model):
    """An FSDP run's out_dir as a one-process save leaves it: ckpt/ only."""
    from types import SimpleNamespace

    from gptkit.train import optim, sharded
    from gptkit.train.distributed import Dist

    settings = dict(optimizer="adamw", weight_decay=0.1, learning_rate=1e-2, beta1=0.9, beta2=0.95,
                    muon_lr=0.02, muon_momentum=0.95, muon_nesterov=True)
    optimizers = optim.make_optimizers(model, SimpleNamespace(**settings), "cpu")
    info = {"model_config": dataclasses.asdict(model.config), "tokenizer": {"type": "char", "chars": CHARS},
            "config": settings, "iter_num": 7, "best_val_loss": 2.5, "val_loss": 2.5, "last_eval_iter": 7,
            "train_time_s": 1.0, "data_fingerprint": None, "dataset": "tiny", "provenance": None}
    sharded.save("ckpt", out_dir, model, optimizers, info, "cpu", Dist())
    assert sorted(p.name for p in out_dir.iterdir()) == ["ckpt"]


def test_sample_and_eval_read_an_fsdp_run_holding_only_its_shards(tmp_path, capsys):
    model = tiny_model(3)
    sharded_run(tmp_path / "fsdp", model)
    write_run(tmp_path / "one-file", 3)  # the same weights as a one-file checkpoint

    argv = ["--device=cpu", "--num_samples=1", "--max_new_tokens=20", "--start=First", "--temperature=0"]
    assert sample.main([f"--out_dir={tmp_path / 'fsdp'}", *argv]) == 0
    from_shards = capsys.readouterr()
    assert f"loaded {tmp_path / 'fsdp' / 'ckpt'} (char tokenizer, iteration 7" in from_shards.err
    assert sample.main([f"--out_dir={tmp_path / 'one-file'}", *argv]) == 0
    assert capsys.readouterr().out == from_shards.out  # greedy: the same weights give the same text

    text = tmp_path / "held_out.txt"
    text.write_text(TEXT[:3000])
    scores = []
    for run in ("fsdp", "one-file"):
        assert eval_script.main([str(tmp_path / run), "--input", str(text), "--json", "-", "--device", "cpu"]) == 0
        scores.append(json.loads(capsys.readouterr().out)["models"][0]["loss"])
    assert scores[0] == scores[1]
    assert eval_script.main([str(tmp_path / "fsdp" / "ckpt"), "--input", str(text), "--device", "cpu"]) == 0
    assert f"loaded {tmp_path / 'fsdp' / 'ckpt'}" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_device_cuda_without_a_gpu_under_torchrun_is_printed_once(tmp_path):
    write_run(tmp_path / "run")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(REPO / "sample.py"),
         f"--out_dir={tmp_path / 'run'}", "--device=cuda"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert ours == ["error: device='cuda' but this PyTorch sees no CUDA GPU: use --device=cpu (or auto)"], result.stderr
