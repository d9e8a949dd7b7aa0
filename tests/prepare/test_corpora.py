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
from hub_server import ENDLESS, FakeHub, fineweb_edu_table, openwebtext_table, random_texts
from repo import REPO

pytestmark = pytest.mark.usefixtures("tiktoken_available")

FW_REPO, FW_REV, FW_FOLDER = "HuggingFaceFW/fineweb-edu", "main", "sample/10BT"
OWT_REPO, OWT_REV, OWT_FOLDER = "Skylion007/openwebtext", "refs/convert/parquet", "plain_text/train"
SHARD_ROWS = 300


@pytest.fixture(scope="module")
def hub_files(tmp_path_factory):
    """The stand-in Hub's repositories, written once: each test serves a copy it may change."""
    hub = FakeHub(tmp_path_factory.mktemp("hub"))
    for shard in range(3):
        texts = random_texts(SHARD_ROWS, seed=shard)
        hub.add(FW_REPO, FW_REV, f"{FW_FOLDER}/{shard:03d}_00000.parquet", fineweb_edu_table(texts, shard))
    for shard in range(2):
        texts = random_texts(SHARD_ROWS, seed=10 + shard)
        hub.add(OWT_REPO, OWT_REV, f"{OWT_FOLDER}/{shard:04d}.parquet", openwebtext_table(texts, shard))
    return hub.root


@pytest.fixture
def hub(tmp_path, monkeypatch, hub_files):
    import shutil

    monkeypatch.setattr(download, "RETRIES", 0)  # a stopped download ends the run (tests of the next run)
    hub = FakeHub(shutil.copytree(hub_files, tmp_path / "hub"))
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
    ({"type": "file", "path": "sample/10BT/x.parquet", "size": "many"}, "size of .many.: not a whole number"),
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


# --- A server that lies: every refusal is one line, exit 2, with nothing half-written -------------

TREE = f"/api/datasets/{FW_REPO}/tree/{FW_REV}/{FW_FOLDER}"


def refused(hub, tmp_path, message, *args, data=None):
    """Run prepare.py against the hub; assert one line matching `message`; the listing requests made."""
    data = data or tmp_path / "data"
    hub.requests.clear()
    with pytest.raises(UserError, match=message) as e:
        run(hub, data, "fineweb_edu", *args)
    assert "\n" not in str(e.value) and len(str(e.value)) < 600, str(e.value)
    assert not (data / "fineweb_edu" / "meta.json").exists()
    return [p for p, _ in hub.requests if p.startswith("/api/")]


@pytest.mark.parametrize("link, message", [
    (lambda c: f'<{TREE}>; rel="next"', "leads back to a page it has listed"),  # to the first page
    (lambda c: '<>; rel="next"', "leads back"),  # an empty reference: this very page
    (lambda c: f'<{TREE}?cursor=2>; rel="next"', "leads back"),  # to the 2nd page, from then on
    (lambda c: f'<?cursor={2 - c}>; rel=next', "leads back|twice"),  # alternating, relative, unquoted
    (lambda c: f'<{TREE}?cursor=0&n={c}>; rel="next"', "twice"),  # a new address for the same page
    (lambda c: f'<?cursor={c + 100}>; rel="next"', "empty page .* points to a next one"),  # empty, forever
])
def test_a_listing_that_loops_is_refused(hub, tmp_path, link, message):
    hub.page_size, hub.link = 2, link
    assert len(refused(hub, tmp_path, message)) <= 3
    assert not (tmp_path / "data").exists()


def test_a_listing_past_the_page_limit_is_refused(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "MAX_PAGES", 2)
    hub.page_size = 1  # three honest pages
    assert len(refused(hub, tmp_path, "goes on past 2 pages")) == 2


@pytest.mark.parametrize("address", [
    "file:///dev/zero", "FILE:///etc/passwd", "ftp://127.0.0.1:9/x", "data:application/json,[]",
    "gopher://127.0.0.1:9/", "javascript:alert(1)", "https://", "http://[::1/x", "http://127.0.0.1:9/a b",
])
def test_only_http_addresses_are_followed(hub, tmp_path, address):
    listing = tmp_path / "listing.json"  # a local file that would pass for a listing
    listing.write_text(json.dumps([{"type": "file", "path": f"{FW_FOLDER}/x.parquet", "size": 5}]))
    address = address.replace("/etc/passwd", str(listing))
    hub.page_size, hub.link = 2, lambda c: f'<{address}>; rel="next"'
    assert len(refused(hub, tmp_path, "not an http\\(s\\) address|control characters")) == 1
    hub.link, hub.redirect_to = None, ("/api/", address)  # a redirect, of the listing, then of a file
    refused(hub, tmp_path, "not an http\\(s\\) address|Redirection to url .* is not allowed|Invalid IPv6|refused\\)")
    hub.redirect_to = ("/datasets/", address)
    refused(hub, tmp_path, "not an http\\(s\\) address|Redirection to url .* is not allowed|Invalid IPv6|refused\\)")
    assert not any((tmp_path / "data").rglob("*.parquet*"))
    with pytest.raises(UserError, match="--base_url is .*not an http\\(s\\) address|--base_url .*control"):
        prepare.main(["fineweb_edu", "--data_dir", str(tmp_path / "b"), "--base_url", "ftp://127.0.0.1:9"])


def test_a_redirect_loop_ends_in_one_line(hub, tmp_path):
    own = f"{hub.url}/datasets/{FW_REPO}/resolve/{FW_REV}/{FW_FOLDER}/000_00000.parquet"
    hub.redirect_to = ("/datasets/", own)  # back to itself, forever
    refused(hub, tmp_path, "could not download .*HTTP 30[0-9].*loop", "--shards", "1")
    hub.redirect_to = ("/api/", f"{hub.url}/api/elsewhere")  # a chain that never ends
    refused(hub, tmp_path, "could not list .*HTTP 30[0-9].*(loop|maximum)", "--shards", "1")


@pytest.mark.parametrize("body, message", [
    (b"<html>busy</html>", "did not answer with the Hub's file listing"),
    (b'{"error": "no"}', "did not answer with the Hub's file listing"),
    (b"[" * 100_000, "did not answer with the Hub's file listing"),  # nested past Python's stack
    (b"\xff\xfe[]", "did not answer with the Hub's file listing"),
    (b"", "did not answer with the Hub's file listing"),
    (b'[{"type": "file", "path": "sample/10BT/x.parquet", "size": ' + b"9" * 5000 + b"}]", "did not answer"),
    (ENDLESS, "takes the listing past 1,048,576 bytes"),
])
def test_a_listing_that_is_not_json_or_never_ends_is_refused(hub, tmp_path, monkeypatch, body, message):
    monkeypatch.setattr(download, "LISTING_BYTES", 1 << 20)
    hub.listing_body = body
    refused(hub, tmp_path, message)
    assert not (tmp_path / "data").exists()


def test_a_listing_is_bounded_over_all_its_pages(hub, tmp_path, monkeypatch):
    hub.page_size = 1  # three pages of ~250 bytes each: more than 600 in all
    monkeypatch.setattr(download, "LISTING_BYTES", 600)
    assert len(refused(hub, tmp_path, "takes the listing past 600 bytes \\(all pages together\\)")) == 3


def test_a_416_keeps_the_part_already_downloaded(hub, tmp_path):
    target, size, part, data = cut_first(hub, tmp_path)
    hub.range_shift = size  # "past the end" of a file the listing says is longer
    refused(hub, tmp_path, "answered 416 to a request from byte .* listed at .*remove .*part", "--shards", "1")
    assert part.stat().st_size == size // 3


def entry(**fields):
    return {"type": "file", "path": f"{FW_FOLDER}/x.parquet", "size": 5, **fields}


@pytest.mark.parametrize("bad, message", [
    (entry(path=f"{FW_FOLDER}/a\x00.parquet"), "control characters"),
    (entry(path=f"{FW_FOLDER}/a\x1b[2J.parquet"), "control characters"),
    (entry(path=f"{FW_FOLDER}/a\x7f.parquet"), "control characters"),
    (entry(path=f"{FW_FOLDER}/a\x85.parquet"), "control characters"),
    (entry(path=f"{FW_FOLDER}/a\ud800.parquet"), "not valid Unicode"),
    (entry(path=f"{FW_FOLDER}/{'a' * 300}.parquet"), "a file name of 308 bytes \\(at most 248\\)"),
    (entry(path=f"{FW_FOLDER}/{'a' * 241}.parquet"), "a file name of 249 bytes"),  # + .sha256: past 255
    (entry(path=f"{FW_FOLDER}/{'é' * 121}.parquet"), "a file name of 250 bytes"),  # bytes, not characters
    (entry(path=f"{FW_FOLDER}/sub/x.parquet"), "outside sample/10BT"),
    (entry(path=f"{FW_FOLDER}/..\\x.parquet"), "outside sample/10BT"),
    (entry(path=f"{FW_FOLDER}/../x.parquet"), "outside sample/10BT"),
    (entry(path=f"{FW_FOLDER}/.parquet/../../x.parquet"), "outside sample/10BT"),
    (entry(path="/etc/x.parquet"), "outside sample/10BT"),
    (entry(path=5), "not the Hub's"),
    ("sample/10BT/x.parquet", "not the Hub's"),
    ([1, 2], "not the Hub's"),
    (None, "not the Hub's"),
    (entry(size=float("inf")), "a size of inf"),
    (entry(size=float("-inf")), "a size of -inf"),
    (entry(size=float("nan")), "a size of nan"),
    (entry(size=-1), "a size of -1"),
    (entry(size=1.5), "a size of 1.5"),
    (entry(size=5.0), "a size of 5.0"),
    (entry(size=True), "a size of True"),
    (entry(size="5"), "a size of '5'"),
    (entry(size=None), "a size of None"),
    (entry(size=[5]), "a size of \\[5\\]"),
    (entry(size=10**30), "a size of 1000000000000000000000000000000"),
    (entry(lfs={"oid": "zz"}), "sha256 that cannot be right"),
    (entry(lfs={"oid": 7}), "sha256 that cannot be right"),
    (entry(lfs="a" * 64), "sha256 that cannot be right"),
    (entry(lfs={"oid": "a" * 64, "size": 6}), "two sizes"),
    (entry(path=f"{FW_FOLDER}/000_00000.parquet"), "lists sample/10BT/000_00000.parquet twice"),
])
def test_each_field_of_a_listing_entry_is_checked(hub, tmp_path, bad, message):
    hub.listing_body = json.dumps([bad]).encode() if bad == entry(size=float("nan")) else None
    hub.extra_entries = [bad]
    refused(hub, tmp_path, message)
    assert not (tmp_path / "data").exists()


def test_the_longest_name_allowed_downloads(hub, tmp_path):
    name = f"{FW_FOLDER}/{'é' * 120}.parquet"  # 248 bytes: with .sha256 beside it, 255
    hub.add(FW_REPO, FW_REV, name, fineweb_edu_table(random_texts(20, seed=9), 9))
    data = tmp_path / "data"
    run(hub, data, "fineweb_edu")
    local = data / "fineweb_edu" / "download" / name
    assert local.read_bytes() == hub.file(FW_REPO, FW_REV, name).read_bytes()
    assert local.with_name(local.name + ".sha256").is_file()


def cut_first(hub, tmp_path, lfs=True):
    """A first run cut a third of the way into the first shard: (its target, size, .part, data)."""
    hub.lfs = lfs
    target = f"{FW_FOLDER}/000_00000.parquet"
    size = hub.file(FW_REPO, FW_REV, target).stat().st_size
    hub.cut_once[target] = size // 3
    data = tmp_path / "data"
    with pytest.raises(UserError, match="stopped"):
        run(hub, data, "fineweb_edu", "--shards", "1")
    part = data / "fineweb_edu" / "download" / (target + ".part")
    assert part.stat().st_size == size // 3
    return target, size, part, data


@pytest.mark.parametrize("lfs", [True, False])  # False: no published sha256 would catch a splice
@pytest.mark.parametrize("shift, told, message", [
    (7, None, "sent the file from byte .* when asked from byte"),
    (-7, None, "sent the file from byte .* when asked from byte"),
    (0, "", "without a Content-Range that says which"),
    (0, "bytes */99", "without a Content-Range"),
    (0, "bytes 0-10/99", "from byte 0 when asked from byte"),
    (0, "items {start}-{last}/{size}", "without a Content-Range"),
    (0, "bytes {start}-{last}/{size}0", "says the file has .*0 bytes, the listing says"),
    (0, "bytes {start}-{start}/{size}", "sent bytes .* of a file of"),
    (0, "bytes {start}-{last}/{size}, 0-1/{size}", "without a Content-Range"),
])
def test_a_206_that_does_not_start_where_asked_is_not_appended(hub, tmp_path, lfs, shift, told, message):
    target, size, part, data = cut_first(hub, tmp_path, lfs)
    before = part.read_bytes()
    hub.range_shift = shift
    hub.content_range = told and told.format(start=len(before), last=size - 1, size=size)
    refused(hub, tmp_path, message, "--shards", "1")
    assert part.read_bytes() == before  # the good prefix is kept, nothing spliced onto it
    assert not (data / "fineweb_edu" / "download" / target).exists()
    hub.range_shift, hub.content_range = 0, None
    run(hub, data, "fineweb_edu", "--shards", "1")  # an honest server: finished from where it was
    assert (data / "fineweb_edu" / "download" / target).read_bytes() == hub.file(FW_REPO, FW_REV, target).read_bytes()


@pytest.mark.parametrize("lfs", [True, False])
def test_a_body_longer_than_listed_stops_at_one_byte_more(hub, tmp_path, lfs):
    target = f"{FW_FOLDER}/000_00000.parquet"
    hub.lfs = lfs
    hub.overlong.add(target)  # the file, then zeros without end (no Content-Length)
    refused(hub, tmp_path, "sent more than the [0-9,]+ bytes the listing says", "--shards", "1")
    download_dir = tmp_path / "data" / "fineweb_edu" / "download"
    assert not [p for p in download_dir.rglob("*") if p.is_file() and p.name != ".lock"]
    # After a cut: the prefix already here is kept, what the long answer added is dropped.
    hub.overlong.clear()
    target, size, part, data = cut_first(hub, tmp_path / "again", lfs)
    hub.overlong.add(target)
    refused(hub, tmp_path, "sent more than", "--shards", "1", data=data)
    assert part.stat().st_size == size // 3


def test_a_200_to_a_range_request_restarts_the_file(hub, tmp_path):
    target, size, part, data = cut_first(hub, tmp_path, lfs=False)
    part.write_bytes(b"\0" * part.stat().st_size)  # a .part that is not the file's prefix
    hub.ignore_range = True
    run(hub, data, "fineweb_edu", "--shards", "1")
    assert (data / "fineweb_edu" / "download" / target).read_bytes() == hub.file(FW_REPO, FW_REV, target).read_bytes()


def test_a_trickle_that_never_times_out_is_stopped_and_kept(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "READ_TIME_S", 0.5)
    monkeypatch.setattr(download, "SLOWEST_BYTES", 4096)  # the trickle brings ~1,000 bytes in 0.5 s
    hub.slow = (50, 0.025)
    refused(hub, tmp_path, "brought [0-9,]+ bytes in the last 0.5 s: too slow", "--shards", "1")
    part = tmp_path / "data" / "fineweb_edu" / "download" / FW_FOLDER / "000_00000.parquet.part"
    assert 0 < part.stat().st_size < 4096  # kept, to continue from
    hub.listing_body, hub.slow = ENDLESS, None
    monkeypatch.setattr(download, "BLOCK", 1)  # the listing read in bytes: the clock is checked between them
    monkeypatch.setattr(download, "READ_TIME_S", 0.0)
    refused(hub, tmp_path, "took more than 0.0 s to answer")


def test_a_compressed_body_is_refused(hub, tmp_path):
    hub.encoding = "gzip"
    refused(hub, tmp_path, "Content-Encoding 'gzip'", "--shards", "1")


@pytest.mark.parametrize("fault", ["next_to_dev_zero", "infinite_size", "endless_file"])
def test_a_lying_server_ends_prepare_py_in_one_line_exit_2(hub, tmp_path, fault):
    target = f"{FW_FOLDER}/000_00000.parquet"
    if fault == "next_to_dev_zero":
        hub.link = lambda c: '<file:///dev/zero>; rel="next"'
    elif fault == "infinite_size":
        hub.listing_body = json.dumps([entry(size=float("inf"))]).encode()
    else:
        hub.overlong.add(target)
    result = subprocess.run(
        [sys.executable, str(REPO / "prepare.py"), "fineweb_edu", "--shards", "1", "--data_dir", str(tmp_path),
         "--base_url", hub.url, "--quiet"], capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr and "memory" not in result.stderr
