"""gptkit/data/dataset.py: dataset checks, the batch sampler as a pure function, window reads."""

import json

import numpy as np
import pytest
import torch

from gptkit.data import dataset as data
from gptkit.ops.errors import UserError
from train_helpers import write_char_dataset


def test_global_batch_offsets_is_a_pure_function_of_seed_and_step():
    a = data.global_batch_offsets(1337, 5, 10_000, 32, 64)
    assert a.dtype == np.int64 and a.shape == (64,)
    assert np.array_equal(a, data.global_batch_offsets(1337, 5, 10_000, 32, 64))
    assert not np.array_equal(a, data.global_batch_offsets(1337, 6, 10_000, 32, 64))
    assert not np.array_equal(a, data.global_batch_offsets(1338, 5, 10_000, 32, 64))
    many = data.global_batch_offsets(0, 0, 100, 32, 100_000)
    assert many.min() == 0 and many.max() == 100 - 32 - 1  # every window fits, both ends reachable


def test_ranks_share_exactly_the_windows_of_one_process():
    B, G = 4, 8  # global: 8 micro-batches of 4 windows
    offsets = data.global_batch_offsets(1, 3, 50_000, 16, B * G)
    one_process = [data.micro_batch_offsets(offsets, B, m) for m in range(G)]
    for world in (2, 4, 8):
        local = G // world
        shares = [data.micro_batch_offsets(offsets, B, r * local + m) for r in range(world) for m in range(local)]
        assert np.array_equal(np.concatenate(shares), np.concatenate(one_process))


@pytest.mark.parametrize("dtype, top", [("uint16", 65_535), ("uint32", 70_000)])
def test_token_bin_reads_windows_exactly(tmp_path, dtype, top):
    ids = np.arange(1000, dtype=np.int64) * (top // 999)
    ids[-1] = top  # 70000 must survive (a uint16 would wrap it to 4464)
    path = tmp_path / "x.bin"
    ids.astype(dtype).tofile(path)
    bin_ = data.TokenBin(path, dtype)
    assert bin_.n_tokens == 1000
    got = bin_.read_windows(np.array([0, 500, 989]), 11)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.stack([ids[0:11], ids[500:511], ids[989:1000]]))
    bin_.close()


def test_batches_give_inputs_and_next_token_targets(tmp_path):
    folder = write_char_dataset(tmp_path)
    meta = data.load_meta(tmp_path, "tiny", block_size=8)
    batches = data.Batches(tmp_path, "tiny", meta, 8, "cpu")
    x, y = batches.get("train", np.array([0, 100]))
    raw = np.fromfile(folder / "train.bin", dtype=np.uint16).astype(np.int64)
    assert x.shape == y.shape == (2, 8) and x.dtype == torch.int64
    assert torch.equal(x[1], torch.from_numpy(raw[100:108])) and torch.equal(y[1], torch.from_numpy(raw[101:109]))
    batches.close()


def test_eval_windows_whole_split_and_fixed_sample():
    whole = data.eval_offsets(0, "val", 1000, 32, 8, eval_iters=0)
    starts = np.concatenate(whole)
    assert np.array_equal(starts, np.arange(0, 1000 - 32, 32))  # consecutive, non-overlapping
    assert starts[-1] + 33 <= 1000 and starts[-1] + 32 + 33 > 1000  # nothing left that fits
    assert all(len(b) == 8 for b in whole[:-1]) and 1 <= len(whole[-1]) <= 8
    sample = data.eval_offsets(0, "val", 10_000, 32, 8, eval_iters=5)
    assert len(sample) == 5 and all(len(b) == 8 for b in sample)
    assert all(np.array_equal(a, b) for a, b in zip(sample, data.eval_offsets(0, "val", 10_000, 32, 8, 5)))
    other = data.eval_offsets(0, "train", 10_000, 32, 8, eval_iters=5)
    assert not np.array_equal(sample[0], other[0])


def test_load_meta_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(UserError, match=r"dataset folder .*shakespeare_char does not exist: run python prepare.py shakespeare_char"):
        data.load_meta(tmp_path, "shakespeare_char")
    folder = write_char_dataset(tmp_path)
    with open(folder / "val.bin", "r+b") as f:
        f.truncate(101)
    with pytest.raises(UserError, match="val.bin holds 101 bytes but meta.json says .* truncated or stale"):
        data.load_meta(tmp_path, "tiny")
    folder = write_char_dataset(tmp_path, name="big")
    meta = json.loads((folder / "meta.json").read_text())
    meta["vocab_size"] = 70_000
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="vocab_size 70000 does not fit dtype uint16"):
        data.load_meta(tmp_path, "big")
    folder = write_char_dataset(tmp_path, name="short", text="abc" * 50)
    with pytest.raises(UserError, match="val.bin has 15 tokens, fewer than one window"):
        data.load_meta(tmp_path, "short", block_size=32)
    (folder / "meta.json").unlink()
    with pytest.raises(UserError, match="has no meta.json"):
        data.load_meta(tmp_path, "short")


def test_ensure_dataset_prepares_only_known_names(tmp_path, shakespeare_path, monkeypatch):
    assert data.ensure_dataset(tmp_path, "mine") is False
    monkeypatch.setenv("TINYSHAKESPEARE", str(shakespeare_path))
    assert data.ensure_dataset(tmp_path, "shakespeare_char") is True
    meta = data.load_meta(tmp_path, "shakespeare_char", block_size=256)
    assert meta["vocab_size"] == 65 and meta["tokenizer"]["type"] == "char"
    assert data.ensure_dataset(tmp_path, "shakespeare_char") is False  # already there


# ---- a dataset folder from someone else: untrusted input -----------------------------


def write_bpe_dataset(data_dir, name="b"):
    """A BPE dataset by hand: the 256 bytes and two merges, bins of their ids, meta.json as prepare.py writes it."""
    import hashlib

    from gptkit.data.tokenizer import BPETokenizer

    tok = BPETokenizer([bytes([i]) for i in range(256)] + [b"th", b"the"])
    folder = data_dir / name
    folder.mkdir(parents=True)
    ids = np.array(tok.encode("the theory of the thing " * 40), dtype=np.uint16)
    ids[:-50].tofile(folder / "train.bin")
    ids[-50:].tofile(folder / "val.bin")
    (folder / "tokenizer.json").write_text(tok.to_json())
    meta = {"format_version": 1, "tokenizer": tok.describe(), "vocab_size": tok.vocab_size, "dtype": "uint16",
            "eot_id": tok.eot_id, "num_tokens": {"train": len(ids) - 50, "val": 50},
            "fingerprint": hashlib.sha256(ids.tobytes()).hexdigest()}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def edit_meta(folder, edit):
    meta = json.loads((folder / "meta.json").read_text())
    edit(meta)
    (folder / "meta.json").write_text(json.dumps(meta))


def repin_tokenizer(folder, text):
    """Replace tokenizer.json and update its sha256 in meta.json, as someone careful but hostile would."""
    import hashlib

    (folder / "tokenizer.json").write_bytes(text.encode("utf-8"))
    edit_meta(folder, lambda m: m["tokenizer"].update(sha256=hashlib.sha256(text.encode("utf-8")).hexdigest()))


def test_a_hand_made_bpe_dataset_loads(tmp_path):
    write_bpe_dataset(tmp_path)
    meta = data.load_meta(tmp_path, "b")
    assert meta["vocab_size"] == 259 and meta["tokenizer"]["json"].startswith("{")


@pytest.mark.parametrize("name,match", [
    ("../outside.json", r"meta.json: its tokenizer file '\.\./outside.json' must name a file inside .* \(no absolute path, no '\.\.'\)"),
    ("/etc/passwd", r"must name a file inside"),
    ("sub/../../x.json", r"no absolute path, no '\.\.'"),
    ("link.json", r"is a symbolic link to .*outside.json, outside"),
])
def test_files_named_by_meta_json_stay_inside_the_folder(tmp_path, name, match):
    folder = write_bpe_dataset(tmp_path)
    (tmp_path / "outside.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (folder / "link.json").symlink_to(tmp_path / "outside.json")
    edit_meta(folder, lambda m: m["tokenizer"].update(file=name))
    with pytest.raises(UserError, match=match):
        data.load_meta(tmp_path, "b")


@pytest.mark.parametrize("which", ["tokenizer.json", "train.bin", "meta.json"])
def test_fifos_and_links_out_of_the_folder_are_refused_without_opening_them(tmp_path, which):
    import os

    folder = write_bpe_dataset(tmp_path)
    (folder / which).unlink()
    os.mkfifo(folder / which)  # opening it for reading would block forever
    with pytest.raises(UserError, match=rf"{which} is a FIFO"):
        data.load_meta(tmp_path, "b")
    (folder / which).unlink()
    (tmp_path / "elsewhere").write_bytes(b"x")
    (folder / which).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UserError, match=rf"{which} is a symbolic link to .*elsewhere, outside"):
        data.load_meta(tmp_path, "b")


def test_a_huge_tokenizer_file_is_refused_before_it_is_read(tmp_path):
    folder = write_bpe_dataset(tmp_path)
    with open(folder / "tokenizer.json", "r+b") as f:
        f.truncate(8 << 30)  # sparse: 8 GiB that cost no disk
    with pytest.raises(UserError, match=r"tokenizer.json is 8,589,934,592 bytes, more than the"):
        data.load_meta(tmp_path, "b")


def tokens_json(tokens, **header):
    from gptkit.data.tokenizer import GPT2_PATTERN

    head = {"format": "gptkit-bpe", "version": 1, "pre_tokenizer": "gpt2", "pattern": GPT2_PATTERN,
            "vocab_size": len(tokens) + 1 if isinstance(tokens, list) else 0,
            "special_tokens": {"<|endoftext|>": len(tokens) if isinstance(tokens, list) else 0}, "tokens": tokens}
    return json.dumps({**head, **header})


BYTES = [chr(i) for i in range(256)]


@pytest.mark.parametrize("text,match", [
    ("{not json", r"is not valid JSON"),
    pytest.param("[" * 100_000, r"is not valid JSON \(nested too deeply|is not valid JSON \(maximum recursion", id="nested"),
    pytest.param('{"format": ' + "9" * 5000 + "}", r"is not valid JSON \(Exceeds the limit \(4300 digits\)", id="digits"),
    (tokens_json(BYTES + ["th", "th"]), r"some token appears twice"),
    (tokens_json(BYTES + ["th", "\u0100x"]), r"a token holds a character above U\+00FF"),
    (tokens_json(BYTES + ["th", ""]), r'"tokens" must be a list of non-empty strings'),
    (tokens_json("abc"), r'"tokens" must be a list of non-empty strings'),
    (tokens_json(BYTES + ["th"], format="other"), r"is not a gptkit-bpe tokenizer file"),
    (tokens_json(BYTES[1:] + ["th"]), r"ids 0-255 must be the 256 single bytes"),
    (tokens_json(BYTES + ["th"], vocab_size=5), r"vocab_size and special_tokens must be len\(tokens\) \+ 1"),
])
def test_a_malformed_tokenizer_is_refused_whatever_its_pin_says(tmp_path, text, match):
    folder = write_bpe_dataset(tmp_path)
    repin_tokenizer(folder, text)
    with pytest.raises(UserError, match=match):
        data.load_meta(tmp_path, "b")


def test_vocab_size_and_eot_id_must_agree_with_the_tokenizer(tmp_path):
    folder = write_bpe_dataset(tmp_path)
    edit_meta(folder, lambda m: m.update(vocab_size=10))
    with pytest.raises(UserError, match=r"vocab_size 10 disagrees with its bpe tokenizer \(259 tokens\)"):
        data.load_meta(tmp_path, "b")
    edit_meta(folder, lambda m: m.update(vocab_size=259, eot_id=400))
    with pytest.raises(UserError, match=r"eot_id 400 is not an id of its 259-token vocabulary"):
        data.load_meta(tmp_path, "b")
    folder = write_char_dataset(tmp_path, name="c", text="abcabc" * 100)
    edit_meta(folder, lambda m: m["tokenizer"].update(chars=["a", "b", "b"]))
    with pytest.raises(UserError, match=r"lists some character twice"):
        data.load_meta(tmp_path, "c")
    edit_meta(folder, lambda m: m["tokenizer"].update(chars=["a", "b", "\ud800"]))
    with pytest.raises(UserError, match=r"U\+D800, a lone surrogate"):
        data.load_meta(tmp_path, "c")


def test_train_refuses_a_re_pinned_malformed_tokenizer_before_the_first_step(tmp_path):
    import train
    from train_helpers import tiny_args

    folder = write_bpe_dataset(tmp_path / "data")
    repin_tokenizer(folder, tokens_json(BYTES + ["th", "th"]))
    with pytest.raises(UserError, match=r"some token appears twice"):
        train.main(tiny_args(tmp_path / "data", tmp_path / "out", dataset="b", block_size=8))
    assert not (tmp_path / "out" / "ckpt.pt").exists() and not (tmp_path / "out" / "metrics.jsonl").exists()


def test_hostile_json_in_meta_json_or_a_hellaswag_file_is_one_line(tmp_path):
    # Deep nesting and a 5,000-digit number were tracebacks (RecursionError, ValueError).
    from gptkit.evals import tasks

    folder = write_char_dataset(tmp_path, name="c", text="abcabc" * 100)
    for text in ("[" * 100_000, '{"vocab_size": ' + "9" * 5000 + "}"):
        (folder / "meta.json").write_text(text)
        with pytest.raises(UserError, match=r"meta.json is not valid JSON \(.+\): "):
            data.load_meta(tmp_path, "c")
    path = tmp_path / "hs.jsonl"
    for text in ("[" * 100_000, '{"ctx": "a", "n": ' + "9" * 5000 + "}"):
        path.write_text(text + "\n")
        with pytest.raises(UserError, match=r"hs.jsonl, line 1: not valid JSON"):
            tasks.read_task(tasks.TASKS["hellaswag"], path)
