"""prepare.py openwebtext / fineweb_edu against a stand-in Hub on 127.0.0.1 (tests/hub_server.py):
a full download equals the same texts given as .jsonl, a cut download resumes with a Range
request to the same bins, damaged, short and missing shards are refused in one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import prepare
from gptkit.ops.errors import UserError
from gptkit.prepare import download
from hub_server import FakeHub, fineweb_edu_table, openwebtext_table, random_texts
from repo import REPO

pytestmark = pytest.mark.usefixtures("tiktoken_available")

FW_REPO, FW_REV, FW_FOLDER = "HuggingFaceFW/fineweb-edu", "main", "sample/10BT"
OWT_REPO, OWT_REV, OWT_FOLDER = "Skylion007/openwebtext", "refs/convert/parquet", "plain_text/train"
SHARD_ROWS = 300


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "RETRIES", 0)  # a stopped download ends the run (tests of the next run)
    hub = FakeHub(tmp_path / "hub")
    for shard in range(3):
        texts = random_texts(SHARD_ROWS, seed=shard)
        hub.add(FW_REPO, FW_REV, f"{FW_FOLDER}/{shard:03d}_00000.parquet", fineweb_edu_table(texts, shard))
    for shard in range(2):
        texts = random_texts(SHARD_ROWS, seed=10 + shard)
        hub.add(OWT_REPO, OWT_REV, f"{OWT_FOLDER}/{shard:04d}.parquet", openwebtext_table(texts, shard))
    hub.start()
    yield hub
    hub.stop()


def run(hub, data, *args):
    return prepare.main([*args, "--data_dir", str(data), "--base_url", hub.url, "--quiet", "--workers", "1"])


def bins(folder):
    meta = json.loads((folder / "meta.json").read_text())
    return meta, *(np.fromfile(folder / f"{s}.bin", dtype=meta["dtype"]) for s in ("train", "val"))


def expected_bins(seeds, val_fraction=0.0005):
    """The bins by the documented rule, computed independently: per file of R rows,
    V = min(max(1, round(R * f)), R - 1) evenly spaced rows are val; each document is
    its GPT-2 ids and then end-of-text."""
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    out = {"train": [], "val": []}
    for seed in seeds:
        texts = random_texts(SHARD_ROWS, seed)
        rows = len(texts)
        n_val = min(max(1, round(rows * val_fraction)), rows - 1)
        for r, text in enumerate(texts):
            split = "val" if (r + 1) * n_val // rows > r * n_val // rows else "train"
            out[split] += enc.encode_ordinary(text) + [50256]
    return np.array(out["train"], np.uint16), np.array(out["val"], np.uint16)


def test_fineweb_edu_downloads_and_tokenizes_by_the_rule(hub, tmp_path):
    data = tmp_path / "data"
    run(hub, data, "fineweb_edu", "--shards", "2")
    meta, train, val = bins(data / "fineweb_edu")
    want_train, want_val = expected_bins([0, 1])
    assert np.array_equal(train, want_train) and np.array_equal(val, want_val) and len(val) > 0
    assert meta["num_tokens"] == {"train": len(want_train), "val": len(want_val)}
    assert sum(s["num_tokens"]["train"] for s in meta["sources"]) == len(want_train)
    files = meta["corpus"]["files"]
    assert [f["path"] for f in files] == [f"{FW_FOLDER}/000_00000.parquet", f"{FW_FOLDER}/001_00000.parquet"]
    assert meta["corpus"]["sample"] == "10BT" and meta["corpus"]["url"] == hub.url
    for f in files:  # kept in the dataset's download folder, checked against the published sha256
        local = data / "fineweb_edu" / "download" / f["path"]
        assert local.read_bytes() == hub.file(FW_REPO, FW_REV, f["path"]).read_bytes()
    assert [s["sha256"] for s in meta["sources"]] == [f["sha256"] for f in files]
    assert sorted(p.name for p in (data / "fineweb_edu").iterdir()) == [
        ".lock", "download", "meta.json", "train.bin", "val.bin"]

    # Again: only the listing is asked for; nothing is downloaded or tokenized.
    hub.requests.clear()
    before = (data / "fineweb_edu" / "train.bin").stat().st_mtime_ns
    run(hub, data, "fineweb_edu", "--shards", "2")
    assert [p for p, _ in hub.requests] == [f"/api/datasets/{FW_REPO}/tree/{FW_REV}/{FW_FOLDER}"]
    assert (data / "fineweb_edu" / "train.bin").stat().st_mtime_ns == before


def test_more_files_then_fewer_reuse_what_is_tokenized(hub, tmp_path, capfd):
    data = tmp_path / "data"
    run(hub, data, "fineweb_edu", "--shards", "1")
    hub.requests.clear()
    run(hub, data, "fineweb_edu", "--shards", "3")
    assert [p.rsplit("/", 1)[1] for p, _ in hub.requests if "/resolve/" in p] == [
        "001_00000.parquet", "002_00000.parquet"]
    assert "continuing: 1 of 3 file(s) already tokenized" in capfd.readouterr().err
    _, train, val = bins(data / "fineweb_edu")
    want = expected_bins([0, 1, 2])
    assert np.array_equal(train, want[0]) and np.array_equal(val, want[1])
    run(hub, data, "fineweb_edu", "--shards", "2")
    assert "continuing: 2 of 2 file(s) already tokenized" in capfd.readouterr().err
    meta, train, val = bins(data / "fineweb_edu")
    want = expected_bins([0, 1])
    assert np.array_equal(train, want[0]) and np.array_equal(val, want[1]) and len(meta["sources"]) == 2
def test_openwebtext_layout_and_revision(hub, tmp_path):
    data = tmp_path / "data"
    run(hub, data, "openwebtext")
    meta, train, val = bins(data / "openwebtext")
    assert meta["corpus"]["revision"] == "refs/convert/parquet" and len(meta["corpus"]["files"]) == 2
    assert any(p == f"/datasets/{OWT_REPO}/resolve/refs/convert/parquet/{OWT_FOLDER}/0000.parquet"
               for p, _ in hub.requests)
    want_train, want_val = expected_bins([10, 11])
    assert np.array_equal(train, want_train) and np.array_equal(val, want_val)
    assert (val == 50256).sum() == 2  # one val document per file of 300 rows


def test_cut_download_resumes_with_range_to_the_same_bins(hub, tmp_path):
    whole = tmp_path / "whole"
    run(hub, whole, "fineweb_edu", "--shards", "2")
    target = f"{FW_FOLDER}/001_00000.parquet"
    size = hub.file(FW_REPO, FW_REV, target).stat().st_size
    hub.cut_once[target] = size // 3
    data = tmp_path / "data"
    with pytest.raises(UserError, match="download of .*001_00000.parquet stopped .*run again to continue"):
        run(hub, data, "fineweb_edu", "--shards", "2")
    part = data / "fineweb_edu" / "download" / (target + ".part")
    assert part.stat().st_size == size // 3
    assert (data / "fineweb_edu" / "download" / FW_FOLDER / "000_00000.parquet").is_file()
    assert not (data / "fineweb_edu" / "meta.json").exists()
    hub.requests.clear()
    run(hub, data, "fineweb_edu", "--shards", "2")
    assert [(p.rsplit("/", 1)[1], r) for p, r in hub.requests if "/resolve/" in p] == [
        ("001_00000.parquet", f"bytes={size // 3}-")]  # the finished shard is not fetched again
    for split in ("train.bin", "val.bin"):
        assert (data / "fineweb_edu" / split).read_bytes() == (whole / "fineweb_edu" / split).read_bytes()


def test_killed_tokenizing_continues_after_the_last_finished_file(hub, tmp_path):
    data = tmp_path / "data"
    command = [sys.executable, str(REPO / "prepare.py"), "fineweb_edu", "--data_dir", str(data), "--base_url",
               hub.url, "--workers", "1", "--quiet"]
    killed = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "GPT_FAULTS": "exit_after_first_file"})
    assert killed.returncode == 137
    state = json.loads((data / "fineweb_edu" / "building.json").read_text())
    assert [d["path"] for d in state["done"]] == [f"{FW_FOLDER}/000_00000.parquet"]
    with open(data / "fineweb_edu" / "train.bin.building", "ab") as f:
        f.write(b"\x01\x02" * 999)  # as if the run had died half-way through the next file
    again = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 0, again.stderr
    assert "continuing: 1 of 3 file(s) already tokenized" in again.stderr
    _, train, val = bins(data / "fineweb_edu")
    want_train, want_val = expected_bins([0, 1, 2])
    assert np.array_equal(train, want_train) and np.array_equal(val, want_val)
    assert not (data / "fineweb_edu" / "building.json").exists()


def test_listing_pages_and_a_changed_file(hub, tmp_path):
    hub.page_size = 2  # three files over two pages, as the Hub pages long listings
    data = tmp_path / "data"
    run(hub, data, "fineweb_edu")
    meta, _, _ = bins(data / "fineweb_edu")
    assert len(meta["corpus"]["files"]) == 3
    assert sum(1 for p, _ in hub.requests if p.startswith("/api/")) == 2
    # The publisher replaces a file with one of the same size: it is fetched again.
    target = f"{FW_FOLDER}/002_00000.parquet"
    old = hub.file(FW_REPO, FW_REV, target).read_bytes()
    new = old[:200] + bytes([old[200] ^ 0xFF]) + old[201:]
    hub.file(FW_REPO, FW_REV, target).write_bytes(new)
    hub.requests.clear()
    try:
        run(hub, data, "fineweb_edu")
    except UserError as e:  # the changed bytes may no longer be readable Parquet: that is the tokenizer's to say
        assert "002_00000.parquet" in str(e)
    assert [p.rsplit("/", 1)[1] for p, _ in hub.requests if "/resolve/" in p] == ["002_00000.parquet"]
    assert (data / "fineweb_edu" / "download" / target).read_bytes() == new


def test_kill_9_mid_download_then_resume(hub, tmp_path):
    import signal
    import time

    target = f"{FW_FOLDER}/000_00000.parquet"
    size = hub.file(FW_REPO, FW_REV, target).stat().st_size
    hub.slow = (4096, 0.02)
    data = tmp_path / "data"
    part = data / "fineweb_edu" / "download" / (target + ".part")
    command = [sys.executable, str(REPO / "prepare.py"), "fineweb_edu", "--shards", "1", "--data_dir", str(data),
               "--base_url", hub.url, "--workers", "1", "--quiet"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (part.is_file() and part.stat().st_size > 5 * 4096) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    have = part.stat().st_size
    assert 0 < have < size
    hub.slow = None
    hub.requests.clear()
    run(hub, data, "fineweb_edu", "--shards", "1")
    ranges = [r for p, r in hub.requests if "/resolve/" in p]
    assert len(ranges) == 1 and int(ranges[0].removeprefix("bytes=").rstrip("-")) >= have
    want_train, want_val = expected_bins([0])
    _, train, val = bins(data / "fineweb_edu")
    assert np.array_equal(train, want_train) and np.array_equal(val, want_val)


def test_a_stopped_download_is_continued_in_the_same_run(hub, tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(download, "RETRIES", 2)
    monkeypatch.setattr(download, "RETRY_WAIT_S", 0.01)
    target = f"{FW_FOLDER}/000_00000.parquet"
    hub.cut_once[target] = 5000
    hub.redirect = True  # the Range header follows the redirect to the CDN
    data = tmp_path / "data"
    run(hub, data, "fineweb_edu", "--shards", "1")
    assert [r for p, r in hub.requests if p.startswith("/cdn/")] == [None, "bytes=5000-"]
    assert "stopped at 5,000 of" in capfd.readouterr().err
    hub.status_once[f"{FW_FOLDER}/001_00000.parquet"] = 503  # busy: tried again
    run(hub, data, "fineweb_edu", "--shards", "2")
    assert "HTTP 503" in capfd.readouterr().err
    assert (data / "fineweb_edu" / "download" / target).read_bytes() == hub.file(FW_REPO, FW_REV, target).read_bytes()


def test_server_that_ignores_range_restarts_the_file(hub, tmp_path):
    target = f"{FW_FOLDER}/000_00000.parquet"
    hub.cut_once[target] = 1000
    data = tmp_path / "data"
    with pytest.raises(UserError, match="stopped"):
        run(hub, data, "fineweb_edu", "--shards", "1")
    hub.ignore_range = True
    run(hub, data, "fineweb_edu", "--shards", "1")
    local = data / "fineweb_edu" / "download" / target
    assert local.read_bytes() == hub.file(FW_REPO, FW_REV, target).read_bytes()


def test_damaged_short_and_missing_shards_are_refused(hub, tmp_path):
    data = tmp_path / "data"
    target = f"{FW_FOLDER}/000_00000.parquet"
    local = data / "fineweb_edu" / "download" / target
    hub.corrupt.add(target)
    with pytest.raises(UserError, match=r"000_00000.parquet arrived damaged \(sha256 .*published .*removed"):
        run(hub, data, "fineweb_edu", "--shards", "1")
    assert not local.exists() and not local.with_name(local.name + ".part").exists()
    hub.corrupt.clear()
    size = hub.file(FW_REPO, FW_REV, target).stat().st_size
    hub.lie_size[target] = size + 10
    with pytest.raises(UserError, match=f"has {size:,} bytes, the listing says {size + 10:,}: refused"):
        run(hub, data, "fineweb_edu", "--shards", "1")
    assert not local.exists()
    hub.lie_size.clear()
    hub.missing.add(target)
    with pytest.raises(UserError, match="could not download .*000_00000.parquet \\(HTTP 404"):
        run(hub, data, "fineweb_edu", "--shards", "1")
    assert not (data / "fineweb_edu" / "meta.json").exists()


@pytest.mark.parametrize("entry, message", [
    ({"type": "file", "path": "sample/10BT/../../../evil.parquet", "size": 5}, "lists a file outside sample/10BT"),
    ({"type": "file", "path": "elsewhere/x.parquet", "size": 5}, "lists a file outside sample/10BT"),
    ({"type": "file", "path": "sample/10BT/x.parquet", "size": "many"}, "not the Hub's"),
    ({"type": "file", "path": "sample/10BT/x.parquet", "size": 5, "lfs": {"oid": "zz"}}, "cannot be right"),
])
def test_a_listing_that_is_not_the_hubs_is_refused(hub, tmp_path, entry, message):
    hub.extra_entries = [entry]
    with pytest.raises(UserError, match=message):
        run(hub, tmp_path / "data", "fineweb_edu")
    assert not (tmp_path / "evil.parquet").exists() and not (tmp_path / "data").exists()


def test_command_line_errors_are_one_line(hub, tmp_path):
    hub.missing.add(f"{FW_FOLDER}/000_00000.parquet")
    env_run = subprocess.run(
        [sys.executable, str(REPO / "prepare.py"), "fineweb_edu", "--shards", "1", "--data_dir", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "HF_ENDPOINT": hub.url},
    )
    assert env_run.returncode == 2
    errors = [line for line in env_run.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "HTTP 404" in errors[0] and "Traceback" not in env_run.stderr
    for args, message in [
        (["fineweb_edu", "--sample", "5BT"], "no sample '5BT': choose one of 10BT, 100BT, 350BT"),
        (["fineweb_edu", "--shards", "0"], "--shards must be at least 1"),
        (["fineweb_edu", "--shards", "9"], "has 3 files; --shards 9 asks for more"),
        (["shakespeare_char", "--shards", "1"], "go with a downloaded corpus"),
        (["openwebtext", "--input", "x.parquet"], "openwebtext is downloaded"),
        (["openwebtext", "--errors", "replace"], "--errors goes with --input"),
        (["fineweb_edu", "--tokenizer", "char"], "fixes the tokenizer"),
    ]:
        with pytest.raises(UserError, match=message):
            run(hub, tmp_path / "e", *args)
    with pytest.raises(UserError, match="could not list .*Connection refused|could not list .*refused"):
        prepare.main(["fineweb_edu", "--data_dir", str(tmp_path / "e"), "--base_url", "http://127.0.0.1:9",
                      "--quiet"])


def test_train_reads_the_downloaded_corpus(hub, tmp_path):
    import train
    from train_helpers import losses_by_iter, tiny_args

    data = tmp_path / "data"
    run(hub, data, "fineweb_edu", "--shards", "2")
    out = tmp_path / "out"
    assert train.main(tiny_args(data, out, dataset="fineweb_edu", max_iters=8, eval_interval=8)) == 0
    losses = losses_by_iter(out)
    assert losses[max(losses)] < losses[0] - 1.5, losses  # from ln(50257) = 10.8 towards the corpus's few words
    import eval as eval_script

    # eval.py scores the same val split, and the same documents given as a Parquet file
    split_json, file_json = tmp_path / "split.json", tmp_path / "file.json"
    assert eval_script.main([str(out), "--dataset", "fineweb_edu", "--data_dir", str(data), "--device", "cpu",
                             "--json", str(split_json), "--no_progress"]) == 0
    shard = data / "fineweb_edu" / "download" / FW_FOLDER / "000_00000.parquet"
    assert eval_script.main([str(out), "--input", str(shard), "--device", "cpu", "--max_tokens", "2000",
                             "--json", str(file_json), "--no_progress"]) == 0
    for path in (split_json, file_json):
        assert 0 < json.loads(path.read_text())["models"][0]["loss"] < 9, path.read_text()[:300]


def test_a_local_copy_stands_in(hub, tmp_path):
    copy = hub.root / FW_REPO / FW_REV  # the repository's own layout: sample/10BT/000_00000.parquet, ...
    data = tmp_path / "data"
    prepare.main(["fineweb_edu", "--shards", "2", "--data_dir", str(data), "--base_url", str(copy), "--quiet"])
    meta, train, val = bins(data / "fineweb_edu")
    want_train, want_val = expected_bins([0, 1])
    assert np.array_equal(train, want_train) and np.array_equal(val, want_val)
    assert not (data / "fineweb_edu" / "download").exists() and hub.requests == []
    assert meta["sources"][0]["path"] == str(copy / FW_FOLDER / "000_00000.parquet")
    with pytest.raises(UserError, match="neither a web address .* nor a folder"):
        prepare.main(["fineweb_edu", "--data_dir", str(data), "--base_url", str(tmp_path / "nowhere")])
    with pytest.raises(UserError, match="holds no .parquet files .*layout: plain_text/train"):
        prepare.main(["openwebtext", "--data_dir", str(data), "--base_url", copy.as_uri()])
