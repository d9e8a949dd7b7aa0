"""prepare.py: exact Tiny Shakespeare counts, round trips, every input kind, every
user error (message + nothing written), and interruption safety."""

import functools
import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from gptkit.ops.errors import UserError
from gptkit.prepare import build
from gptkit.prepare import shakespeare as prepare_shakespeare
from gptkit.prepare import sources as prepare_sources
from gptkit.prepare.encode import build_tasks, gpt2_cut
from gptkit.data.tokenizer import tokenizer_from_dict
import prepare
from repo import REPO, reset_sigint



def load(folder):
    """(meta, train ids, val ids) read the way train.py will: np.memmap with meta's dtype."""
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    splits = [np.memmap(folder / f"{s}.bin", dtype=meta["dtype"], mode="r") for s in ("train", "val")]
    assert [len(a) for a in splits] == [meta["num_tokens"]["train"], meta["num_tokens"]["val"]]
    return meta, *splits


def decode_both(folder):
    meta, train, val = load(folder)
    tok = tokenizer_from_dict(meta["tokenizer"])
    return tok.decode(train.tolist()), tok.decode(val.tolist())


def run_cli(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, str(REPO / "prepare.py"), *args], capture_output=True, text=True, env=env, cwd=REPO
    )


# ---------------------------------------------------------------- Tiny Shakespeare


def test_shakespeare_char_matches_nanogpt(shakespeare_path, tmp_path):
    folder = build.prepare_named_dataset("shakespeare_char", tmp_path, shakespeare_path, progress=False)
    assert folder == tmp_path / "shakespeare_char"
    meta, train, val = load(folder)
    assert meta["num_tokens"] == {"train": 1003854, "val": 111540}
    assert meta["vocab_size"] == 65 and len(meta["tokenizer"]["chars"]) == 65
    assert meta["dtype"] == "uint16" and meta["eot_id"] is None and meta["format_version"] == 1
    assert meta["sources"][0]["bytes"] == 1115394
    assert meta["sources"][0]["sha256"] == prepare_shakespeare.SHAKESPEARE_SHA256
    assert len(meta["fingerprint"]) == 64
    train_text, val_text = decode_both(folder)
    assert train_text + val_text == shakespeare_path.read_text()
    assert sorted(os.listdir(folder)) == [".lock", "meta.json", "train.bin", "val.bin"]  # no temp files left


def test_shakespeare_gpt2_matches_nanogpt_in_parallel_chunks(shakespeare_path, tiktoken_available, tmp_path):
    # Small chunks and two workers: ~40 cuts, so the counts only come out exact if every
    # cut is safe for BPE (nanoGPT encodes each split whole: 301,966 / 36,059).
    folder = build.prepare_dataset(
        [shakespeare_path], "gpt2", "sp", tmp_path, workers=2, progress=False, chunk_chars=1 << 15
    )
    meta, train, val = load(folder)
    assert meta["num_tokens"] == {"train": 301966, "val": 36059}
    assert meta["tokenizer"] == {"type": "gpt2"} and meta["vocab_size"] == 50257 and meta["eot_id"] == 50256
    text = shakespeare_path.read_text()
    tok = tokenizer_from_dict(meta["tokenizer"])
    n_train = int(len(text) * 0.9)
    assert train.tolist() == tok.encode(text[:n_train])
    assert val.tolist() == tok.encode(text[n_train:])


def test_gpt2_cut_rule_keeps_bpe_exact(tiktoken_available):
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    # The guard matters: a piece ending "a\n\n" would end in the single token "\n\n".
    assert enc.encode_ordinary("a\n\nb") == [64, 198, 198, 65]
    assert gpt2_cut("a\n\nb", 1) == 1
    rng = random.Random(0)
    alphabet = ["a", "b", "Z", " ", "  ", "\n", "\n\n", "\t", "\r\n", "'s", "'", "1", "23", ",", "."]
    alphabet += ["é", "中文", "。", "\u00a0", "\u3000", "😀"]  # no-space text takes the letter/punctuation cut
    for trial in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 200)))
        tasks = build_tasks([("train", iter([text]), False)], gpt2_cut, chunk_chars=rng.randint(2, 20))
        pieces = [t for task in tasks for _, t, _ in task]
        assert "".join(pieces) == text
        assert [i for p in pieces for i in enc.encode_ordinary(p)] == enc.encode_ordinary(text), (trial, pieces)


# ---------------------------------------------------------------- the user's own data


def write_docs(folder, docs):
    folder.mkdir()
    (folder / "sub").mkdir()
    paths = [folder / ("sub" if i % 2 else "") / f"doc{i:02d}.txt" for i in range(len(docs))]
    for path, doc in zip(paths, docs):
        path.write_text(doc)
    (folder / "ignored.md").write_text("not a .txt file")
    return sorted(paths, key=lambda p: p.relative_to(folder).as_posix())


DOCS = [f"Document {i}: {'lorem ipsum ' * i}ends.\n" for i in range(1, 11)]


@pytest.mark.parametrize("kind", ["char", "gpt2"])
def test_folder_input_splits_whole_documents(kind, tmp_path, request):
    if kind == "gpt2":
        request.getfixturevalue("tiktoken_available")
    paths = write_docs(tmp_path / "docs", DOCS)
    folder = build.prepare_dataset([tmp_path / "docs"], kind, "mine", tmp_path / "out", progress=False)
    meta, train, val = load(folder)
    texts = [p.read_text() for p in paths]  # sorted order: doc00, doc02, ..., sub/doc01, ...
    assert [s["path"] for s in meta["sources"]] == [str(p) for p in paths]
    # 10 documents at val_fraction 0.1: one val document, i = 9 ((i + 1) * 1 // 10 > i * 1 // 10)
    assert meta["split"]["num_documents"] == 10 and meta["split"]["num_val_documents"] == 1
    tok = tokenizer_from_dict(meta["tokenizer"])
    if kind == "gpt2":
        eot = [meta["eot_id"]]
        assert train.tolist() == [i for t in texts[:9] for i in tok.encode(t) + eot]
        assert val.tolist() == tok.encode(texts[9]) + eot
    else:
        assert tok.decode(train.tolist()) == "".join(texts[:9])
        assert tok.decode(val.tolist()) == texts[9]


def test_jsonl_input_and_evenly_spaced_val_documents(tmp_path):
    docs = [f"line {i} \u00e9\u4e2d\U0001f600" for i in range(10)]
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)]
    lines.insert(3, "   ")  # blank lines are skipped
    path = tmp_path / "web.jsonl"
    path.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    folder = build.prepare_dataset([path], "char", "web", tmp_path, val_fraction=0.3, progress=False)
    meta, _, _ = load(folder)
    train_text, val_text = decode_both(folder)
    # V = 3 of N = 10: i is val when (i + 1) * 3 // 10 > i * 3 // 10, i.e. i = 3, 6, 9
    assert val_text == docs[3] + docs[6] + docs[9]
    assert train_text == "".join(d for i, d in enumerate(docs) if i not in (3, 6, 9))
    assert meta["split"]["num_val_documents"] == 3


def test_uint32_bins_for_more_than_65536_characters(tmp_path):
    code_points = [c for c in range(0x100, 0x100 + 72_548) if not 0xD800 <= c < 0xE000]  # no surrogates
    assert len(code_points) == 70_500
    random.Random(0).shuffle(code_points)
    text = "".join(map(chr, code_points)) * 2
    path = tmp_path / "wide.txt"
    path.write_text(text, encoding="utf-8")
    folder = build.prepare_dataset([path], "char", "wide", tmp_path, progress=False)
    meta, train, val = load(folder)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_500
    assert int(train.max()) >= 65536
    assert "".join(decode_both(folder)) == text


def test_multibyte_characters_across_read_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_sources, "BLOCK_BYTES", 7)  # every character straddles some block edge
    text = "héllo 中文 😀 wörld\n" * 20
    path = tmp_path / "u.txt"
    path.write_text(text, encoding="utf-8")
    # Two workers: the char vocabulary and the encoding both go through the pool here.
    folder = build.prepare_dataset([path], "char", "u", tmp_path, workers=2, progress=False, chunk_chars=16)
    assert "".join(decode_both(folder)) == text


def test_rerun_replaces_dataset_and_cleans_stale_temp_files(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("first version of the text\n" * 20)
    folder = build.prepare_dataset([path], "char", "d", tmp_path, progress=False)
    stale = folder / ".train.bin.tmp-999999999-dead"  # left by a killed run: no such process
    stale.write_bytes(b"junk")
    path.write_text("the second, longer version of the text\n" * 30)
    build.prepare_dataset([path], "char", "d", tmp_path, progress=False)
    assert "".join(decode_both(folder)) == path.read_text()
    assert sorted(os.listdir(folder)) == [".lock", "meta.json", "train.bin", "val.bin"]


# ---------------------------------------------------------------- user errors: message, nothing written


def assert_fails(tmp_path, args, message):
    """prepare.main raises a UserError naming the problem and writes nothing under out."""
    out = tmp_path / "out"
    with pytest.raises(UserError, match=message):
        prepare.main([*args, "--out_dir", str(out), "--quiet"])
    assert not out.exists() or not any(out.rglob("*")), list(out.rglob("*"))


def test_missing_input(tmp_path):
    assert_fails(
        tmp_path,
        ["--input", str(tmp_path / "nope.txt"), "--tokenizer", "char", "--name", "x"],
        "nope.txt does not exist",
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_input(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text("hello world")
    path.chmod(0)
    assert_fails(
        tmp_path, ["--input", str(path), "--tokenizer", "char", "--name", "x"], "cannot read input .*secret.txt"
    )


def test_empty_inputs(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    assert_fails(
        tmp_path, ["--input", str(tmp_path / "empty.txt"), "--tokenizer", "char", "--name", "x"], "input is empty"
    )
    (tmp_path / "blank.jsonl").write_text('\n{"text": ""}\n\n')
    assert_fails(
        tmp_path, ["--input", str(tmp_path / "blank.jsonl"), "--tokenizer", "char", "--name", "x"], "input is empty"
    )
    (tmp_path / "nothing").mkdir()
    assert_fails(
        tmp_path, ["--input", str(tmp_path / "nothing"), "--tokenizer", "char", "--name", "x"], "holds no .txt or .parquet files"
    )


def test_input_too_short_to_split(tmp_path):
    (tmp_path / "tiny.txt").write_text("hi")
    args = ["--input", str(tmp_path / "tiny.txt"), "--tokenizer", "char", "--name", "x"]
    assert_fails(
        tmp_path,
        args + ["--val_fraction", "0.6"],
        r"too short to split: 2 character\(s\) give 0 for train and 2 for val",
    )
    (tmp_path / "one.txt").write_text("h")
    assert_fails(tmp_path, ["--input", str(tmp_path / "one.txt"), "--tokenizer", "char", "--name", "x"], "too short")


def test_invalid_utf8_names_file_and_offset(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_sources, "BLOCK_BYTES", 5)  # the offset must survive block edges
    path = tmp_path / "bad.txt"
    path.write_bytes("héllo wörld ".encode() + b"\xff\xfe tail")
    args = ["--input", str(path), "--tokenizer", "char", "--name", "x"]
    assert_fails(tmp_path, args, r"bad.txt is not valid UTF-8 at byte offset 14 .*--errors replace")
    prepare.main(args + ["--out_dir", str(tmp_path / "ok"), "--quiet", "--errors", "replace"])
    assert "".join(decode_both(tmp_path / "ok" / "x")) == "héllo wörld \ufffd\ufffd tail"


def test_bad_jsonl_lines_are_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "ok too"}\n{"text": broken}\n')
    args = ["--input", str(path), "--tokenizer", "char", "--name", "x"]
    assert_fails(tmp_path, args, r"d.jsonl, line 3: not valid JSON")
    path.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    assert_fails(tmp_path, args, r'd.jsonl, line 2: no "text" field')
    path.write_text('{"text": "ok"}\n{"text": 42}\n')
    assert_fails(tmp_path, args, r'd.jsonl, line 2: "text" is a int, not a string')
    # deep nesting and a 5,000-digit number were tracebacks (RecursionError, ValueError)
    path.write_text('{"text": "ok"}\n{"text": "x", "n": ' + "[" * 100_000 + "\n")
    assert_fails(tmp_path, args, r"d.jsonl, line 2: not JSON this reader takes: nested too deeply")
    path.write_text('{"text": "ok"}\n{"text": "x", "n": ' + "9" * 5000 + "}\n")
    assert_fails(tmp_path, args, r"d.jsonl, line 2: not JSON this reader takes \(a number of over 4,300 digits\)")
    path.write_bytes(b'\xef\xbb\xbf{"text": "a bom first"}\n{"text": "and more text"}\n')  # line 1 was "not valid JSON"
    prepare.main(args + ["--out_dir", str(tmp_path / "bom"), "--quiet"])
    assert "".join(decode_both(tmp_path / "bom" / "x")) == "a bom first" + "and more text"


def test_lone_surrogates_in_jsonl_are_named_or_replaced(tmp_path):
    """JSON can spell a lone surrogate (\\ud800), which is no character: refused with the
    file, line and character, or replaced under --errors replace; never a traceback later."""
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine text here"}\n{"text": "ab\\ud800cd and more words"}\n')
    args = ["--input", str(path), "--tokenizer", "char", "--name", "x"]
    assert_fails(tmp_path, args, r'd.jsonl, line 2: "text" holds a lone surrogate U\+D800 at character 2 .*--errors replace')
    prepare.main(args + ["--out_dir", str(tmp_path / "ok"), "--quiet", "--errors", "replace"])
    assert "".join(decode_both(tmp_path / "ok" / "x")) == "fine text here" + "ab\ufffdcd and more words"
    path.write_text('{"text": "a smile \\ud83d\\ude00 is a pair, and fine"}\n{"text": "more text"}\n')
    prepare.main(args + ["--out_dir", str(tmp_path / "pair"), "--quiet"])
    assert "\U0001F600" in "".join(decode_both(tmp_path / "pair" / "x"))


def test_a_lone_surrogate_is_named_for_gpt2_bpe_too(tmp_path, tiktoken_available):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine text here"}\n{"text": "ab\\ud800cd and more words"}\n')
    args = ["--input", str(path), "--tokenizer", "gpt2", "--name", "x"]
    assert_fails(tmp_path, args, r"d.jsonl, line 2: .* lone surrogate U\+D800")


def test_unknown_tokenizer_and_dataset(tmp_path):
    (tmp_path / "a.txt").write_text("hello world")
    assert_fails(
        tmp_path, ["--input", str(tmp_path / "a.txt"), "--tokenizer", "bpe2", "--name", "x"], "unknown tokenizer 'bpe2'"
    )
    assert_fails(
        tmp_path, ["shakespear"], "unknown dataset 'shakespear': known datasets are shakespeare_char, shakespeare"
    )
    assert_fails(tmp_path, [], "nothing to prepare")
    assert_fails(tmp_path, ["--input", str(tmp_path / "a.txt"), "--tokenizer", "char"], "needs --name")
    with pytest.raises(UserError, match="unknown dataset"):
        build.prepare_named_dataset("wikitext", tmp_path)


@pytest.fixture
def served(tmp_path):
    """(a folder, the http://127.0.0.1 address that serves it): where a test's "download" comes from."""
    folder = tmp_path / "served"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


NOTHING_LISTENS = "http://127.0.0.1:9/input.txt"  # the discard port: a refused connection


def test_failed_download_and_checksum_mismatch(tmp_path, monkeypatch, served):
    monkeypatch.delenv("TINYSHAKESPEARE", raising=False)
    folder, url = served
    monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_URL", f"{url}/missing.txt")
    assert_fails(tmp_path, ["shakespeare_char"], "could not download Tiny Shakespeare .*404.* pass --input PATH")
    (folder / "wrong.txt").write_text("not shakespeare\n" * 100)
    monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_URL", f"{url}/wrong.txt")
    assert_fails(tmp_path, ["shakespeare_char"], "has sha256 [0-9a-f]{64}, expected 86c4e6aa.*pass --input PATH")


def test_download_is_checked_and_cached(shakespeare_path, tmp_path, monkeypatch, served):
    monkeypatch.delenv("TINYSHAKESPEARE", raising=False)
    folder, url = served
    (folder / "input.txt").write_bytes(shakespeare_path.read_bytes())
    monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_URL", f"{url}/input.txt")
    prepare.main(["shakespeare_char", "--out_dir", str(tmp_path), "--quiet"])
    assert (tmp_path / "shakespeare_char" / "input.txt").read_bytes() == shakespeare_path.read_bytes()
    monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_URL", NOTHING_LISTENS)
    prepare.main(["shakespeare_char", "--out_dir", str(tmp_path), "--quiet"])  # the cached copy: no download
    assert load(tmp_path / "shakespeare_char")[0]["num_tokens"]["val"] == 111540


def ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# "ignored": started as `prepare.py ... &` in a script is; prepare.py must take Ctrl-C back.
@pytest.mark.parametrize("inherited", [reset_sigint, ignore_sigint], ids=["default", "ignored"])
def test_ctrl_c_exits_130_and_writes_nothing(tmp_path, tiktoken_available, inherited):
    path = tmp_path / "big.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 200_000)  # ~10 s of BPE
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "prepare.py"),
            "--input",
            str(path),
            "--tokenizer",
            "gpt2",
            "--name",
            "big",
            "--out_dir",
            str(tmp_path / "out"),
            "--workers",
            "2",
            "--quiet",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=inherited,
    )
    deadline = time.monotonic() + 30
    while not list((tmp_path / "out").glob("big/.train.bin.tmp-*")):  # tokenizing has begun
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=30)[1]
    assert proc.returncode == 130 and err.strip().endswith("interrupted")
    assert not (tmp_path / "out" / "big").exists()


def test_cli_one_line_error_and_help(tmp_path):
    result = run_cli(
        "--input", str(tmp_path / "nope.txt"), "--tokenizer", "char", "--name", "x", "--out_dir", str(tmp_path)
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: input {tmp_path / 'nope.txt'} does not exist"]
    result = run_cli("--help")
    assert result.returncode == 0
    assert (
        "python prepare.py --input" in result.stdout
        and "TINYSHAKESPEARE" in result.stdout
        and ".jsonl" in result.stdout
    )


def test_tinyshakespeare_environment_variable(shakespeare_path, tmp_path):
    result = run_cli(
        "shakespeare_char", "--out_dir", str(tmp_path), "--quiet", env_extra={"TINYSHAKESPEARE": str(shakespeare_path)}
    )
    assert result.returncode == 0, result.stderr
    assert load(tmp_path / "shakespeare_char")[0]["num_tokens"] == {"train": 1003854, "val": 111540}


# ---------------------------------------------------------------- interruption and memory


def test_kill_midway_leaves_previous_dataset(tmp_path):
    old = tmp_path / "old.txt"
    old.write_text("the previous dataset\n" * 50)
    folder = build.prepare_dataset([old], "char", "d", tmp_path, progress=False)
    before = {name: (folder / name).read_bytes() for name in ("meta.json", "train.bin", "val.bin")}
    new = tmp_path / "new.txt"
    new.write_text("a new and different text\n" * 4000)
    code = (
        "from gptkit.prepare import build; build.prepare_dataset([%r], 'char', 'd', %r, workers=1, progress=False, chunk_chars=4096)"
        % (str(new), str(tmp_path))
    )
    env = dict(os.environ, GPT_FAULTS="exit_during_prepare", PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 137, result.stderr
    leftovers = [p.name for p in folder.iterdir() if p.name not in before and p.name != ".lock"]
    assert leftovers and all(".tmp-" in name and name.startswith(".") for name in leftovers)  # died mid-write
    assert {name: (folder / name).read_bytes() for name in before} == before
    assert "".join(decode_both(folder)) == old.read_text()


def test_failure_between_renames_leaves_no_valid_looking_dataset(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    path.write_text("some text to prepare\n" * 50)
    folder = build.prepare_dataset([path], "char", "d", tmp_path, progress=False)
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst).name == "val.bin":
            raise KeyboardInterrupt  # Ctrl-C after train.bin was swapped in
        return real_replace(src, dst)

    monkeypatch.setattr(build.os, "replace", replace)
    path.write_text("a different text\n" * 70)
    with pytest.raises(KeyboardInterrupt):
        build.prepare_dataset([path], "char", "d", tmp_path, progress=False)
    assert not (folder / "meta.json").exists()  # incomplete, and visibly so
    assert not [p for p in folder.iterdir() if ".tmp-" in p.name]


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the forking parent (pytest).
PEAK_RSS = """
import sys
from gptkit.prepare import build
build.prepare_dataset([sys.argv[1]], sys.argv[2], "m", sys.argv[3], workers=1, progress=False)
print([line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0])  # KiB
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from Linux's /proc")
def test_peak_memory_does_not_grow_with_input(tmp_path):
    line = "The quick brown fox jumps over the lazy dog; sphinx of black quartz, judge my vow.\n"
    peaks = {}
    for mb in (4, 32):
        path = tmp_path / f"{mb}.txt"
        path.write_text(line * (mb * 2**20 // len(line)))
        result = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, str(path), "char", str(tmp_path / str(mb))],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr
        peaks[mb] = int(result.stdout.split()[-1]) / 1024
    # Reading 32 MB whole would add ~28 MB of text and ~56 MB of ids; streaming adds ~nothing.
    assert peaks[32] - peaks[4] < 16, peaks


def test_one_prepare_at_a_time_per_dataset_folder(tmp_path):
    from gptkit.ops.lock import FolderLock

    path = tmp_path / "a.txt"
    path.write_text("some text to prepare\n" * 20)
    folder = build.prepare_dataset([path], "char", "d", tmp_path, progress=False)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    with FolderLock(folder, "prepare.py"):  # as another prepare.py writing there now
        with pytest.raises(UserError, match=rf"{folder} is in use by another prepare.py \(pid {os.getpid()} "):
            build.prepare_dataset([path], "char", "d", tmp_path, progress=False)
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.name != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }
    build.prepare_dataset([path], "char", "d", tmp_path, progress=False)  # free again once it is done


def test_a_wrong_tinyshakespeare_file_is_named_with_its_size(tmp_path, monkeypatch, capsys):
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("ROMEO:\nBut soft!\n" * 300)
    monkeypatch.setenv("TINYSHAKESPEARE", str(wrong))
    prepare.main(["shakespeare_char", "--data_dir", str(tmp_path / "data"), "--quiet"])
    err = capsys.readouterr().err
    assert f"TINYSHAKESPEARE={wrong} is not Tiny Shakespeare" in err and "5,100 bytes, expected 1,115,394" in err


def test_the_real_tinyshakespeare_gives_no_warning(shakespeare_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TINYSHAKESPEARE", str(shakespeare_path))
    prepare.main(["shakespeare_char", "--out_dir", str(tmp_path / "data"), "--quiet"])  # the older flag name
    assert "warning" not in capsys.readouterr().err
    assert load(tmp_path / "data" / "shakespeare_char")[0]["num_tokens"]["val"] == 111540


def test_failed_download_leaves_no_empty_folders(tmp_path, monkeypatch):
    monkeypatch.delenv("TINYSHAKESPEARE", raising=False)
    monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_URL", NOTHING_LISTENS)
    with pytest.raises(UserError, match="could not download"):
        prepare.main(["shakespeare_char", "--data_dir", str(tmp_path / "new" / "data"), "--quiet"])
    assert not (tmp_path / "new").exists()
