"""A 2-rank FSDP run's sharded checkpoint, damaged and tampered with as a hostile
user would: every case is refused in one line (a UserError naming the file, exit 2
from the command), runs no code, writes nothing, and never loads weights that
differ from the saved ones. One run's checkpoint serves every case (copied first)."""

import json
import os
import pickle
import random
import shutil
import subprocess
import sys
import time

import pytest
import torch

import convert
import train
from gptkit.ops.checkpoint import load_checkpoint
from gptkit.ops.errors import UserError
from gptkit.train import sharded
from gptkit.train.sharded import file_record
from malicious import RunsCode
from train_helpers import REPO, run_torchrun, subprocess_env, tiny_args, write_char_dataset


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(data_dir, out_dir) of a finished 2-rank FSDP run: out_dir/ckpt/ holds two shards."""
    root = tmp_path_factory.mktemp("fsdp")
    data = write_char_dataset(root / "data").parent
    result = run_torchrun(tiny_args(data, root / "out", parallel="fsdp", max_iters=4, eval_interval=4), cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(os.listdir(root / "out" / "ckpt")) == [".metadata", "__0_0.distcp", "__1_0.distcp", "run.json"]
    return data, root / "out"


@pytest.fixture
def copy(saved, tmp_path):
    """A fresh copy of the saved out_dir for one case to damage."""
    shutil.copytree(saved[1], tmp_path / "out", symlinks=True)
    return tmp_path / "out"


def repin(folder):
    """Record the tampered files' sizes and hashes in run.json, as a careful attacker would."""
    run = json.loads((folder / "run.json").read_text())
    run["files"] = {p.name: file_record(p) for p in folder.iterdir() if p.name != "run.json" and p.is_file()}
    (folder / "run.json").write_text(json.dumps(run))


def refused(out, match):
    """convert.py --to pt refuses the checkpoint with one line matching `match`, writing nothing."""
    dest = out.parent / "converted.pt"
    start = time.monotonic()
    with pytest.raises(UserError, match=match) as e:
        convert.main([str(out), str(dest), "--to", "pt"])
    assert "\n" not in str(e.value) and len(str(e.value)) < 600, str(e.value)
    assert time.monotonic() - start < 20
    assert not dest.exists() and not any(p.name.startswith(".converted") for p in out.parent.iterdir())
    return str(e.value)


def metadata(folder):
    with open(folder / ".metadata", "rb") as f:
        return pickle.load(f)  # our own test file, not an attacker's


def write_metadata(folder, md):
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    repin(folder)


def sharded_entry(md):
    """(name, entry) of a tensor cut into two chunks (one per rank)."""
    return next((k, v) for k, v in md.state_dict_metadata.items() if len(getattr(v, "chunks", [])) == 2)


def test_the_intact_checkpoint_converts_to_the_saved_weights(copy):
    out = copy.parent / "converted.pt"
    assert convert.main([str(copy), str(out), "--to", "pt"]) == 0
    best = load_checkpoint(copy / "best.pt")  # written from the same weights at iteration 4
    converted = load_checkpoint(out)
    assert converted["iter_num"] == best["iter_num"] == 4
    for name, tensor in best["model"].items():
        assert torch.equal(converted["model"][name], tensor), name


def test_a_flipped_mantissa_bit_in_a_shard_is_refused(copy):
    shard = copy / "ckpt" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # the low bit of some float's mantissa
    shard.write_bytes(bytes(data))
    refused(copy, r"__1_0.distcp fails its checksum")


def test_a_metadata_from_another_save_is_refused(copy, saved):
    other = copy.parent / "other"
    shutil.copytree(copy, other)
    md = metadata(other / "ckpt")
    md.planner_data = {"another": ("save",)}  # a different but valid index
    (copy / "ckpt" / ".metadata").write_bytes(pickle.dumps(md))
    refused(copy, r"\.metadata (fails its checksum|is [\d,]+ bytes but was saved)")


def test_a_chunk_removed_from_a_self_consistent_metadata_is_refused(copy):
    folder = copy / "ckpt"
    md = metadata(folder)
    name, entry = sharded_entry(md)
    chunk = entry.chunks.pop()
    del md.storage_data[next(k for k in md.storage_data if k.fqn == name and k.offset == chunk.offsets)]
    write_metadata(folder, md)
    refused(copy, rf"the chunks of {name} .* hold [\d,]+ elements, not")


def test_overlapping_chunks_are_refused(copy):
    folder = copy / "ckpt"
    md = metadata(folder)
    name, entry = sharded_entry(md)
    _, second = entry.chunks
    key = next(k for k in md.storage_data if k.fqn == name and k.offset == second.offsets)
    info = md.storage_data.pop(key)
    # one row earlier: it overlaps the first chunk by a row and leaves the last uncovered (the same volume)
    entry.chunks[1] = type(second)(offsets=torch.Size([second.offsets[0] - 1, *second.offsets[1:]]), sizes=second.sizes)
    md.storage_data[type(key)(name, entry.chunks[1].offsets)] = info
    write_metadata(folder, md)
    refused(copy, rf"two chunks of {name} .* overlap")


@pytest.mark.parametrize("path", ["../__0_0.distcp", "/etc/passwd", "sub/__0_0.distcp"])
def test_metadata_naming_files_outside_the_folder_is_refused(copy, path):
    folder = copy / "ckpt"
    md = metadata(folder)
    info = next(iter(md.storage_data.values()))
    info.relative_path = path
    write_metadata(folder, md)
    refused(copy, r"is not a shard file of this folder")


def test_storage_past_the_end_of_a_shard_is_refused(copy):
    folder = copy / "ckpt"
    md = metadata(folder)
    info = next(iter(md.storage_data.values()))
    info.length = (folder / info.relative_path).stat().st_size + 1
    write_metadata(folder, md)
    refused(copy, r"is stored past the end of")


def global_pickle(module, name, args=("true",)):
    """A pickle (protocol 0) that calls module.name(*args) when loaded."""
    return f"c{module}\n{name}\n(".encode() + b"".join(f"V{a}\n".encode() for a in args) + b"tR."


@pytest.mark.parametrize("payload,match", [
    (global_pickle("os", "system", ("touch RAN",)), r"global 'os.system' is not allowed"),
    (global_pickle("builtins", "exec", ("open('RAN', 'w')",)), r"global 'builtins.exec' is not allowed"),
    (global_pickle("torch", "load", ("RAN",)), r"global 'torch.load' is not allowed"),
    (b"ctorch\n_C\n.", r"global 'torch._C' is not allowed"),
    (pickle.dumps({"state_dict_metadata": {}}), r"does not hold DCP metadata \(found a dict\)"),
    (b"", r"\.metadata is damaged \(not DCP metadata\): EOFError"),
    # Random bytes (seeded: one draw in ~10,000 unpickles to a set or dict, also refused)
    (random.Random(0).randbytes(4096), r"\.metadata (is damaged|: global|.*not allowed|does not hold DCP)"),
    (None, r"\.metadata is damaged \(not DCP metadata\)"),  # truncated: filled in below
])
def test_hostile_metadata_is_refused_and_runs_no_code(copy, payload, match, monkeypatch):
    folder = copy / "ckpt"
    if payload is None:
        payload = (folder / ".metadata").read_bytes()[:200]
    (folder / ".metadata").write_bytes(payload)
    repin(folder)
    monkeypatch.chdir(copy.parent)
    refused(copy, match)
    assert not (copy.parent / "RAN").exists()


def test_the_unpickler_refuses_pickled_code_wherever_it_hides(copy):
    """A Metadata whose storage holds a RunsCode object: refused at unpickling."""
    folder = copy / "ckpt"
    md = metadata(folder)
    marker = copy.parent / "ran"
    md.planner_data = RunsCode(marker)
    write_metadata(folder, md)
    refused(copy, r"global '(os|posix)\.system' is not allowed")
    assert not marker.exists()


@pytest.mark.parametrize("damage,match", [
    ("missing", r"__1_0.distcp is missing"),
    ("empty", r"__1_0.distcp is 0 bytes but was saved with"),
    ("truncated", r"__1_0.distcp is [\d,]+ bytes but was saved with"),
    ("extra", r"__2_0.distcp is not part of the checkpoint"),
    ("extra, listed", r"no tensor is stored in __2_0.distcp"),
    ("fifo", r"__1_0.distcp is a FIFO"),
    ("symlink out", r"__1_0.distcp is a symbolic link"),
    ("folder", r"__1_0.distcp is a folder"),
])
def test_missing_short_extra_and_odd_shard_files_are_refused(copy, damage, match):
    folder = copy / "ckpt"
    shard = folder / "__1_0.distcp"
    if damage == "missing":
        shard.unlink()
    elif damage in ("empty", "truncated"):
        shard.write_bytes(shard.read_bytes()[: 0 if damage == "empty" else 1000])
    elif damage.startswith("extra"):
        shutil.copy(shard, folder / "__2_0.distcp")
        if damage == "extra, listed":
            repin(folder)
    elif damage == "fifo":  # as a tar archive can hold: opening it would block forever
        shard.unlink()
        os.mkfifo(shard)
    elif damage == "symlink out":
        outside = copy.parent / "elsewhere.distcp"
        shutil.move(shard, outside)
        shard.symlink_to(outside)
    elif damage == "folder":
        shard.unlink()
        shard.mkdir()
    refused(copy, match)


def test_a_device_in_place_of_a_shard_is_refused(copy):
    shard = copy / "ckpt" / "__1_0.distcp"
    shard.unlink()
    try:
        os.mknod(shard, 0o600 | __import__("stat").S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    except PermissionError:
        pytest.skip("making a device file needs CAP_MKNOD")
    refused(copy, r"__1_0.distcp is a character device")


def edit_run(folder, edit):
    run = json.loads((folder / "run.json").read_text())
    edit(run)
    (folder / "run.json").write_text(json.dumps(run))


@pytest.mark.parametrize("edit,match", [
    (lambda r: r.pop("rng"), r"'rng' must hold the RNG states"),
    (lambda r: r.update(rng=[1, 2]), r"'rng' must hold the RNG states"),
    (lambda r: r["rng"].update(torch=[1, 2, 3]), r"RNG states are malformed"),
    (lambda r: r["rng"]["per_rank"][1]["numpy"].pop("keys"), r"'rng' is malformed \(KeyError"),
    (lambda r: r.update(model_config="big"), r"model_config is a str, not a dict"),
    (lambda r: r["model_config"].update(n_layer="2"), r"model_config has values of the wrong type: n_layer='2'"),
    (lambda r: r.pop("config"), r"'config' is a NoneType, not the run's settings"),
    (lambda r: r["config"].update(learning_rate="fast"), r"setting learning_rate is 'fast', not a number"),
    (lambda r: r.update(iter_num="4"), r"'iter_num' is str 4, not int"),
    (lambda r: r.update(best_val_loss=None), r"'best_val_loss' is NoneType None, not float"),
    (lambda r: r.update(tokenizer={"type": "char", "chars": ["a", "a"]}), r"lists some character twice"),
    (lambda r: r.update(tokenizer={"type": "char", "chars": "abc"}), r"must be a non-empty list of single characters"),
    (lambda r: r.update(tokenizer={"type": "bpe", "json": "{}", "sha256": "0"}), r"does not match its sha256"),
    (lambda r: r.update(tokenizer="char"), r"unknown tokenizer description"),
    (lambda r: r.update(world_size=0), r"world_size is 0"),
    (lambda r: r.update(format_version=3), r"format_version 3; this code reads versions 1 and 2"),
    (lambda r: r["files"].update({"__1_0.distcp": {"bytes": "many", "sha256": "x"}}), r"'files' must map each file name"),
    (lambda r: r["files"].update({"../x": r["files"][".metadata"]}), r"'files' must map each file name"),
])
def test_malformed_run_json_is_refused(copy, edit, match):
    edit_run(copy / "ckpt", edit)
    refused(copy, match)


@pytest.mark.parametrize("text,match", [
    ("{", r"run.json is not valid JSON"),
    ("[1, 2]", r"run.json holds a list, not the object a save writes"),
    ("", r"run.json is not valid JSON"),
    ("\udcff", r"run.json is not valid JSON"),
])
def test_run_json_that_is_not_a_run_is_refused(copy, text, match):
    (copy / "ckpt" / "run.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    refused(copy, match)


def test_a_huge_or_odd_run_json_is_refused_before_it_is_read(copy):
    path = copy / "ckpt" / "run.json"
    with open(path, "r+b") as f:
        f.truncate(300 << 20)  # sparse: costs no disk, but reading it would take 300 MB
    refused(copy, r"run.json is 314,572,800 bytes, more than")
    path.unlink()
    os.mkfifo(path)
    refused(copy, r"run.json is a FIFO")


def test_an_oversized_metadata_is_refused_before_it_is_read(copy):
    path = copy / "ckpt" / ".metadata"
    with open(path, "r+b") as f:
        f.truncate((1 << 30) + 1)  # sparse, one byte over the cap; run.json re-pinned to match
    repin(copy / "ckpt")
    refused(copy, r"\.metadata is 1,073,741,825 bytes, more than the 1,073,741,824")


def test_convert_and_resume_refuse_in_one_line_with_exit_2(copy, saved):
    """As users run them: convert.py and train.py --init_from=resume in their own processes."""
    shard = copy / "ckpt" / "__0_0.distcp"
    shard.unlink()
    os.mkfifo(shard)  # a FIFO: without the lstat first, both would hang here forever
    env = subprocess_env()
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "convert.py"), str(copy), str(copy.parent / "x.pt"), "--to", "pt"],
                            cwd=copy.parent, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: ") and "__0_0.distcp is a FIFO" in result.stderr
    assert not (copy.parent / "x.pt").exists()
    shard.unlink()
    shutil.copy(saved[1] / "ckpt" / "__0_0.distcp", shard)
    edit_run(copy / "ckpt", lambda r: r.update(iter_num="4"))
    metrics = (copy / "metrics.jsonl").read_bytes()
    result = subprocess.run([sys.executable, str(REPO / "train.py"), *tiny_args(saved[0], copy, parallel="ddp", init_from="resume", max_iters=8)],
                            cwd=copy.parent, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ") and "'iter_num' is str" in result.stderr
    assert (copy / "metrics.jsonl").read_bytes() == metrics  # nothing trained, nothing written
    assert time.monotonic() - start < 120


def test_resume_in_one_process_from_the_two_rank_checkpoint_refuses_a_flipped_bit(copy, saved):
    shard = copy / "ckpt" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x04
    shard.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"__0_0.distcp fails its checksum"):
        train.main(tiny_args(saved[0], copy, init_from="resume", max_iters=8))


@pytest.mark.slow
def test_a_two_rank_resume_stops_every_rank_on_the_shard_one_rank_found_damaged(copy, saved):
    """Under torchrun each rank hashes its share of the shards: rank 1 checks __1_0.distcp,
    and its finding stops both ranks before a step, in rank 0's one line."""
    shard = copy / "ckpt" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x10
    shard.write_bytes(bytes(data))
    metrics = (copy / "metrics.jsonl").read_bytes()
    result = run_torchrun(tiny_args(saved[0], copy, parallel="fsdp", init_from="resume", max_iters=8), cwd=copy.parent)
    assert result.returncode != 0
    assert "error: on rank 1: " in result.stderr and "__1_0.distcp fails its checksum" in result.stderr, result.stderr[-2000:]
    assert (copy / "metrics.jsonl").read_bytes() == metrics


def test_a_sharded_run_folder_or_its_ckpt_folder_is_a_base_to_fine_tune_from(copy, saved, tmp_path):
    from gptkit.models.loading import checkpoint_of

    data = saved[0]
    assert checkpoint_of(copy) == copy / "best.pt"  # a run folder: what sample.py would load
    (copy / "best.pt").unlink()
    assert checkpoint_of(copy) == checkpoint_of(copy / "ckpt") == copy / "ckpt"  # the sharded checkpoint itself
    weights = sharded.read_as_single(copy / "ckpt")["model"]
    for n, base in enumerate((copy, copy / "ckpt")):
        out = tmp_path / f"tuned{n}"
        assert train.main(tiny_args(data, out, init_from=base, learning_rate=0.0, max_iters=1, eval_interval=1)) == 0
        tuned = load_checkpoint(out / "ckpt.pt")["model"]
        assert all(torch.equal(tuned[k], v) for k, v in weights.items())  # learning rate 0: the base's weights
