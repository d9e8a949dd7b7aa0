"""Sharded (DCP) checkpoints in one process: round trip, conversion to one file,
the fall-back when a save died between its renames, and refusing files whose
loading would run code. The multi-rank behaviour is in test_fsdp.py."""

import json
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

import convert

from gptkit.ops.checkpoint import load_checkpoint
from gptkit.ops.errors import UserError
from gptkit.train import sharded
from gptkit.train.distributed import Dist
from gptkit.train.sharded import file_record
from malicious import RunsCode
from model import GPT, GPTConfig

CONFIG = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.0)
SETTINGS = dict(optimizer="adamw", weight_decay=0.1, learning_rate=1e-2, beta1=0.9, beta2=0.95,
                muon_lr=0.02, muon_momentum=0.95, muon_nesterov=True)


def trained(seed=0, optimizer="adamw"):
    from types import SimpleNamespace

    from gptkit.train import optim

    torch.manual_seed(seed)
    model = GPT(GPTConfig(**CONFIG))
    optimizers = optim.make_optimizers(model, SimpleNamespace(**dict(SETTINGS, optimizer=optimizer)), "cpu")
    x = torch.randint(0, 11, (2, 8))
    for _ in range(2):
        _, loss = model(x, x)
        loss.backward()
        for opt in optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return model, optimizers


def save(out_dir, model, optimizers, iter_num=7):
    import dataclasses

    info = {"model_config": dataclasses.asdict(model.config), "tokenizer": {"type": "char", "chars": list("abcdefghijk")},
            "config": dict(SETTINGS, optimizer="muon" if len(optimizers) == 2 else "adamw"), "iter_num": iter_num, "best_val_loss": 2.5, "val_loss": 2.5, "last_eval_iter": iter_num,
            "train_time_s": 1.0, "data_fingerprint": None, "dataset": "tiny", "provenance": None}
    sharded.save("ckpt", out_dir, model, optimizers, info, "cpu", Dist())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_round_trip_and_conversion_to_one_file(tmp_path, optimizer):
    model, optimizers = trained(optimizer=optimizer)
    save(tmp_path, model, optimizers)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # the temporary folder is gone
    fresh, fresh_opts = trained(seed=1, optimizer=optimizer)
    run = sharded.read_run(sharded.find(tmp_path))
    assert run["iter_num"] == 7 and run["rng"]["torch"].dtype == torch.uint8
    sharded.load_into(run["sharded"], fresh, fresh_opts)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    a, b = optimizers[0].state_dict()["state"], fresh_opts[0].state_dict()["state"]
    assert all(torch.equal(a[k]["exp_avg_sq"], b[k]["exp_avg_sq"]) for k in a)

    assert convert.main([str(tmp_path), str(tmp_path / "ckpt.pt"), "--to", "pt"]) == 0  # the command over sharded_to_single
    with pytest.raises(UserError, match="exists: give a new file name"):
        convert.main([str(tmp_path), str(tmp_path / "ckpt.pt"), "--to", "pt"])
    ckpt = load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["iter_num"] == 7 and ckpt["tokenizer"]["type"] == "char"
    for name, tensor in model.state_dict().items():
        assert torch.equal(ckpt["model"][name], tensor), name
    assert len(ckpt["optimizer"]) == len(optimizers)
    for saved, opt in zip(ckpt["optimizer"], optimizers):  # by parameter index again, as ckpt.pt keeps them
        for index, state in opt.state_dict()["state"].items():
            assert all(torch.equal(saved["state"][index][k], v) for k, v in state.items() if torch.is_tensor(v))


def test_a_save_that_died_between_its_renames_leaves_the_previous_one(tmp_path):
    model, optimizers = trained()
    save(tmp_path, model, optimizers, iter_num=5)
    os.replace(tmp_path / "ckpt", tmp_path / ".ckpt.old")  # the first rename happened, the second did not
    (tmp_path / ".ckpt.tmp").mkdir()  # a half-written new one: no run.json
    assert sharded.find(tmp_path) == tmp_path / ".ckpt.old"
    assert sharded.read_run(sharded.find(tmp_path))["iter_num"] == 5
    save(tmp_path, model, optimizers, iter_num=9)  # the next save cleans up both
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert sharded.read_run(sharded.find(tmp_path))["iter_num"] == 9


def repin(folder):
    """What a hostile user does after tampering: record the files' new sizes and hashes in run.json."""
    run = json.loads((folder / "run.json").read_text())
    run["files"] = {p.name: file_record(p) for p in folder.iterdir() if p.name != "run.json"}
    (folder / "run.json").write_text(json.dumps(run))


def test_metadata_that_would_run_code_is_refused(tmp_path):
    model, optimizers = trained()
    save(tmp_path, model, optimizers)
    marker = tmp_path / "ran"
    (tmp_path / "ckpt" / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    fresh, fresh_opts = trained(seed=1)
    with pytest.raises(UserError, match="fails its checksum|bytes but was saved with"):
        sharded.load_into(tmp_path / "ckpt", fresh, fresh_opts)
    repin(tmp_path / "ckpt")  # checksums that match: the allow-list still refuses it
    with pytest.raises(UserError, match="posix.system|os.system|not allowed"):
        sharded.load_into(tmp_path / "ckpt", fresh, fresh_opts)
    assert not marker.exists()


def test_a_pickled_object_inside_the_shards_is_refused(tmp_path):
    model, optimizers = trained()
    save(tmp_path, model, optimizers)
    marker, evil = tmp_path / "ran", tmp_path / "ckpt"
    for name in os.listdir(evil):
        if name != "run.json":
            os.remove(evil / name)
    dcp.save({"settings": RunsCode(marker), "w": torch.zeros(3)}, checkpoint_id=evil)
    repin(evil)
    assert not marker.exists()
    state = {"settings": None, "w": torch.ones(3)}
    with pytest.raises(UserError, match="could run code"):
        sharded.load_state(evil, state)
    assert not marker.exists()
    # the unguarded DCP loader would have run it: the test's attack is real
    dcp.load(state, checkpoint_id=evil)
    assert marker.exists()


WRITER = """
import sys, time, torch
sys.path[:0] = [{repo!r}, {tests!r}, {tests!r} + "/train"]
from test_sharded import save, trained
model, optimizers = trained()
for i in range(1, {saves} + 1):
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float(i))  # every weight of save i is i, and its run.json says iter_num i
    save({out!r}, model, optimizers, iter_num=i)
    time.sleep(0.05)  # a reader retrying a read the saves kept changing gets a window on 2 busy cores
"""


def test_a_reader_during_repeated_saves_gets_one_whole_save(tmp_path):
    """convert.py's path (open, read run.json, load the shards) looping while another
    process saves again and again: every read is one save, whole, or a clear message."""
    import subprocess
    import sys

    from repo import REPO

    model, optimizers = trained()
    save(tmp_path, model, optimizers, iter_num=0)
    saves = 20
    code = WRITER.format(repo=str(REPO), tests=str(REPO / "tests"), saves=saves, out=str(tmp_path))
    writer = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    seen, messages = [], []
    fresh, fresh_opts = trained(seed=1)
    while writer.poll() is None:
        try:
            run = sharded.read_run(tmp_path)
            sharded.load_into(run["sharded"], fresh, fresh_opts)
        except UserError as e:
            messages.append(str(e))
            continue
        values = {p.unique().tolist()[0] if p.unique().numel() == 1 else None for p in fresh.parameters()}
        assert values == {float(run["iter_num"])} or run["iter_num"] == 0, (run["iter_num"], values)
        seen.append(run["iter_num"])
    assert writer.returncode == 0, writer.stderr.read()[-2000:]
    assert all("kept changing while it was read" in m for m in messages), messages[:3]
    print(f"{len(seen)} whole reads of {len(set(seen))} different saves, {len(messages)} retried out")
    assert len(set(seen)) >= 3 and len(seen) >= 5


def test_a_checkpoint_saved_before_checksums_loads_with_a_note_and_its_structure_checked(tmp_path, capsys):
    model, optimizers = trained()
    save(tmp_path, model, optimizers)
    folder = tmp_path / "ckpt"
    run = json.loads((folder / "run.json").read_text())
    del run["files"]
    (folder / "run.json").write_text(json.dumps({**run, "format_version": 1}))
    fresh, fresh_opts = trained(seed=1)
    sharded.load_into(folder, fresh, fresh_opts)
    assert "recorded no checksums: only its structure is checked" in capsys.readouterr().err
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    (folder / "__9_0.distcp").write_bytes(b"x")  # without a list of files, .metadata decides what belongs
    with pytest.raises(UserError, match=r"no tensor is stored in __9_0.distcp"):
        sharded.load_into(folder, fresh, fresh_opts)


def test_weights_alone_load_through_the_verified_loader(tmp_path):
    """What sampling needs: open_checkpoint, a model from its run.json, load_into without optimizers."""
    model, optimizers = trained()
    save(tmp_path, model, optimizers)
    snapshot = sharded.open_checkpoint(tmp_path)
    fresh = GPT(GPTConfig(**snapshot.run["model_config"]))
    sharded.load_into(snapshot, fresh, [])
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
