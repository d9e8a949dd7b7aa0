"""Stopping prepare.py: SIGTERM mid-way leaves no temporary and the previous dataset;
SIGTERM during the commit leaves a whole dataset (the previous one is never lost to a
stop); a dataset of another kind leaves none of its files behind (gptkit/prepare/build.py)."""

import json
import os
import subprocess
import sys

import numpy as np

from gptkit.data.dataset import load_meta
from gptkit.prepare import build
from gptkit.prepare.chat import prepare_chat
from gptkit.data.tokenizer import tokenizer_from_dict
from repo import REPO

PREPARE = "from gptkit.prepare import build; build.prepare_dataset([%r], 'char', 'd', %r, workers=1, progress=False, chunk_chars=4096)"


def prepared_text(folder):
    meta = json.loads((folder / "meta.json").read_text())
    tok = tokenizer_from_dict(meta["tokenizer"])
    return "".join(tok.decode(np.fromfile(folder / f"{s}.bin", dtype=meta["dtype"]).tolist()) for s in ("train", "val"))


def stopped_prepare(tmp_path, fault, text):
    new = tmp_path / "new.txt"
    new.write_text(text)
    env = dict(os.environ, GPT_FAULTS=fault, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", PREPARE % (str(new), str(tmp_path))], env=env, capture_output=True,
                          text=True, timeout=120)


def test_sigterm_midway_leaves_no_temporary_and_the_previous_dataset(tmp_path):
    # A SIGTERM mid-prepare left its temporaries (21 MB) beside the dataset: nothing removed them.
    old = tmp_path / "old.txt"
    old.write_text("the previous dataset\n" * 50)
    folder = build.prepare_dataset([old], "char", "d", tmp_path, progress=False)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != ".lock"}
    result = stopped_prepare(tmp_path, "sigterm_during_prepare", "a new and different text\n" * 4000)
    assert result.returncode == 143, result.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name != ".lock"} == before  # no temporary
    assert prepared_text(folder) == old.read_text()


def test_sigterm_during_the_commit_leaves_a_whole_dataset(tmp_path):
    # A SIGTERM between the renames left no dataset at all where one existed.
    old = tmp_path / "old.txt"
    old.write_text("the previous dataset\n" * 50)
    folder = build.prepare_dataset([old], "char", "d", tmp_path, progress=False)
    result = stopped_prepare(tmp_path, "sigterm_during_commit", "a new and different text\n" * 70)
    assert result.returncode == 143, result.stderr
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "meta.json", "train.bin", "val.bin"]
    load_meta(tmp_path, "d", block_size=8)  # what train.py checks
    assert prepared_text(folder) == "a new and different text\n" * 70  # the new one, complete


def test_a_chat_name_prepared_again_as_text_keeps_no_masks(tmp_path):
    # The old *_mask.bin files stayed beside the new text bins.
    talks = tmp_path / "talks.jsonl"
    talks.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                      {"role": "assistant", "content": "a"}]}) + "\n" for i in range(10)))
    folder = prepare_chat([talks], "char", "d", tmp_path, progress=False)
    assert (folder / "train_mask.bin").exists()
    text = tmp_path / "a.txt"
    text.write_text("plain text now\n" * 50)
    build.prepare_dataset([text], "char", "d", tmp_path, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == [".lock", "meta.json", "train.bin", "val.bin"]
    assert "chat" not in load_meta(tmp_path, "d", block_size=8)
