"""A multi-turn session answers as well as the eval says (issue: 300 of 300 held-out
replies exact, yet 4 of 7 later turns of one session wrong).

The cause, reproduced here on a small noise dataset with learned positions: windows
packed once and reused for the whole run put each conversation at the same position
after the same neighbours every epoch, which such a model memorises. Re-packing every
epoch (chat_batches.ChatBatches.epoch_windows, shuffled by seed and epoch) closes the
gap; eval.py --exact_match reports both figures, single-turn and multi-turn sessions."""

import json
import random

import pytest
import torch

import eval as eval_script
import train
from gptkit.data import chat_batches
from gptkit.data.chat_batches import ChatBatches
from gptkit.data.dataset import load_meta
from gptkit.prepare.chat import prepare_chat

REPLY = "all is well."


@pytest.fixture(scope="module")
def noise(tmp_path_factory):
    root = tmp_path_factory.mktemp("repack")
    r = random.Random(0)
    lines = []
    for _ in range(400):
        question = "".join(r.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(r.randint(5, 20)))
        lines.append(json.dumps({"messages": [{"role": "user", "content": question},
                                              {"role": "assistant", "content": REPLY}]}))
    (root / "noise.jsonl").write_text("\n".join(lines) + "\n")
    prepare_chat([root / "noise.jsonl"], "char", "noise", root / "data", progress=False)
    return root


def trained_exact_match(root, out, capsys):
    args = [f"--data_dir={root / 'data'}", "--dataset=noise", f"--out_dir={out}", "--n_layer=2", "--n_head=2",
            "--n_embd=48", "--block_size=96", "--batch_size=8", "--gradient_accumulation_steps=1",
            "--max_iters=250", "--eval_interval=250", "--eval_iters=0", "--learning_rate=3e-3", "--min_lr=3e-4",
            "--warmup_iters=20", "--compile=false", "--device=cpu", "--progress_bar=false",
            "--pos_encoding=learned", "--log_interval=1000"]
    assert train.main(args) == 0
    capsys.readouterr()
    assert eval_script.main([str(out), f"--data_dir={root / 'data'}", "--dataset=noise", "--exact_match",
                             "--json=-", "--no_progress"]) == 0
    rates = json.loads(capsys.readouterr().out)["models"][0]["exact_match"]
    return rates["single"]["rate"], rates["multi"]["rate"]


@pytest.mark.slow
def test_packed_once_a_session_answers_worse_than_the_eval_repacked_it_does_not(noise, tmp_path, capsys, monkeypatch):
    with monkeypatch.context() as m:  # the old reader: epoch 0's windows for the whole run
        m.setattr(chat_batches.ChatBatches, "epoch_windows", lambda self, step: self.first["train"])
        single, multi = trained_exact_match(noise, tmp_path / "fixed", capsys)
    assert single - multi > 0.2, (single, multi)  # measured: 87.5% single, 51.4% multi
    single, multi = trained_exact_match(noise, tmp_path / "repacked", capsys)
    assert single >= 0.9 and multi >= single - 0.05, (single, multi)  # measured: 97.5%, 100%


def test_every_epoch_packs_the_conversations_anew_as_a_pure_function_of_seed_and_epoch(noise):
    meta = load_meta(noise / "data", "noise")
    make = lambda seed: ChatBatches(noise / "data", "noise", meta, 96, "cpu", batch_size=8, accumulation=1, seed=seed)  # noqa: E731
    a, b = make(1), make(1)
    epoch = a.steps_per_epoch
    first, second = a.epoch_windows(0)[0].clone(), a.epoch_windows(epoch)[0].clone()
    assert not torch.equal(first[: len(second)], second[: len(first)])  # new neighbours, new positions
    assert torch.equal(b.epoch_windows(epoch)[0], second)  # the same for any reader (a rank, a resume)
    assert torch.equal(a.epoch_windows(0)[0], first)  # going back repacks the same way
    assert not torch.equal(make(2).epoch_windows(epoch)[0][: len(second)], second[: len(make(2).epoch_windows(epoch)[0])])
    # every epoch holds every conversation once: the same targets in all
    assert int(first[:, :].ne(-1).sum()) > 0
    assert int(a.epoch_windows(0)[1].sum()) == int(a.epoch_windows(epoch)[1].sum())
