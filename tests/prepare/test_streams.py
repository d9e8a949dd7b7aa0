"""prepare.py's input as a stream (a FIFO, process substitution, standard input) gives
the dataset the same file gives; and a tokenizer process that cannot start fails the
whole command in one line instead of being restarted forever."""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from gptkit.ops.errors import UserError
from gptkit.prepare import build
from gptkit.prepare.encode import encode_task, make_pool, ordered_map
from repo import REPO
from train_helpers import sample_text, subprocess_env


def prepare(*args, input=None, timeout=120, **env):
    return subprocess.run([sys.executable, str(REPO / "prepare.py"), *args, "--quiet"], cwd=REPO, input=input,
                          env=subprocess_env(**env), capture_output=True, timeout=timeout)


def dataset(folder):
    """meta.json (without the input's name) and the two bins' bytes."""
    meta = json.loads((folder / "meta.json").read_text())
    names = [s.pop("path") for s in meta["sources"]]
    return meta, names, (folder / "train.bin").read_bytes(), (folder / "val.bin").read_bytes()


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text(sample_text(40_000))
    return path


@pytest.mark.parametrize("tokenizer", [["char"], ["bpe", "--vocab_size", "300"]])
def test_a_pipe_stdin_and_a_fifo_give_the_dataset_the_file_gives(tmp_path, text_file, tokenizer):
    data = str(tmp_path / "data")
    common = ["--tokenizer", *tokenizer, "--data_dir", data]
    assert prepare("--input", str(text_file), "--name", "file", *common).returncode == 0
    expected_meta, names, *expected_bins = dataset(tmp_path / "data" / "file")
    assert names == [str(text_file)]

    # Process substitution, as the user types it in bash: the input is /dev/fd/63, a pipe.
    quoted = " ".join(f"'{a}'" for a in [sys.executable, str(REPO / "prepare.py"), "--input"])
    result = subprocess.run(["bash", "-c", f"{quoted} <(cat '{text_file}') --name subst {' '.join(common)} --quiet"],
                            cwd=REPO, env=subprocess_env(), capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    # Standard input.
    result = prepare("--input", "-", "--name", "stdin", *common, input=text_file.read_bytes())
    assert result.returncode == 0, result.stderr.decode()
    # A named pipe, written by another process while prepare.py reads it.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(text_file.read_bytes()))
    writer.start()
    result = prepare("--input", str(fifo), "--name", "fifo", *common)
    writer.join()
    assert result.returncode == 0, result.stderr.decode()

    for name, shown in (("subst", "/dev/fd/"), ("stdin", "-"), ("fifo", str(fifo))):
        meta, names, *bins = dataset(tmp_path / "data" / name)
        assert meta == expected_meta and bins == expected_bins, name  # same tokens, same sha256 of the text
        assert names[0].startswith(shown)
        assert sorted(p.name for p in (tmp_path / "data" / name).iterdir() if p.name.startswith(".")) == [".lock"]


def test_an_empty_stream_is_empty_and_a_device_is_refused(tmp_path):
    data = str(tmp_path / "data")
    result = prepare("--input", "-", "--tokenizer", "char", "--name", "x", "--data_dir", data, input=b"")
    assert result.returncode == 2 and result.stderr.decode() == "error: the input is empty: - hold(s) no text\n"
    result = prepare("--input", "/dev/zero", "--tokenizer", "char", "--name", "x", "--data_dir", data)
    assert result.returncode == 2 and "/dev/zero is a device" in result.stderr.decode()
    result = prepare("--input", "-", "-", "--tokenizer", "char", "--name", "x", "--data_dir", data, input=b"ab")
    assert result.returncode == 2 and "twice" in result.stderr.decode()
    assert not (tmp_path / "data").exists()  # nothing left behind


def test_a_stream_that_fails_to_decode_leaves_no_copy_behind(tmp_path):
    result = prepare("--input", "-", "--tokenizer", "char", "--name", "x", "--data_dir", str(tmp_path / "data"),
                     input=b"good text\n" * 100 + b"\xff bad")
    assert result.returncode == 2 and "- is not valid UTF-8 at byte offset 1000" in result.stderr.decode()
    assert not (tmp_path / "data").exists()


def test_gpt2_offline_on_a_large_input_fails_at_once_in_one_line(tmp_path):
    """No tiktoken files and no network (a proxy that refuses): before, the pool restarted
    the failing workers endlessly, a traceback each."""
    big = tmp_path / "big.txt"
    text = sample_text(200_000)  # (Tiny Shakespeare's local copy holds 1.1 MB: repeated)
    big.write_text(text * ((3 << 20) // len(text) + 1))  # over 2 MiB: the worker pool is used
    assert big.stat().st_size > 2 << 20
    empty_cache = tmp_path / "no-tiktoken-files"
    empty_cache.mkdir()
    offline = {"TIKTOKEN_CACHE_DIR": str(empty_cache), "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    result = prepare("--input", str(big), "--tokenizer", "gpt2", "--name", "x", "--data_dir", str(tmp_path / "data"),
                     "--workers", "2", timeout=60, **offline)  # the endless restarts: past the timeout
    err = result.stderr.decode()
    assert result.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: could not load the GPT-2 BPE files") and "TIKTOKEN_CACHE_DIR" in err
    assert not (tmp_path / "data").exists()


def test_a_worker_whose_tokenizer_cannot_load_fails_the_map_with_its_reason():
    """The parent could load it, the workers cannot (here: a broken tokenizer.json handed
    to them): the first result is the worker's one-line reason, and no worker restarts."""
    pool = make_pool(2, ("bpe", None, "uint16", 256, "{not json"))
    try:
        t0 = time.monotonic()
        tasks = [[("train", "some text", False)]] * 8
        with pytest.raises(UserError, match="a tokenizer process could not start: tokenizer.json is not valid JSON"):
            list(ordered_map(pool, encode_task, tasks, 2))
        assert time.monotonic() - t0 < 20
        assert len({p.pid for p in pool._pool}) == 2  # the same two processes: none died, none was replaced
    finally:
        pool.terminate()
        pool.join()


def test_the_stream_is_read_once(tmp_path, monkeypatch):
    """The passes (scan, BPE training, encoding) read the copy, never the stream again."""
    from gptkit.prepare import sources

    opened = []
    real_open = sources.open_source

    def counting(source):
        opened.append(str(source.path))
        return real_open(source)

    monkeypatch.setattr(sources, "open_source", counting)
    r, w = os.pipe()
    os.write(w, sample_text(20_000).encode())
    os.close(w)
    build.prepare_dataset([f"/dev/fd/{r}"], "bpe", "x", tmp_path / "data", vocab_size=300, progress=False)
    os.close(r)
    assert opened.count(f"/dev/fd/{r}") == 1 and len(opened) > 1
    train = np.fromfile(tmp_path / "data" / "x" / "train.bin", dtype=np.uint16)
    assert len(train) > 1000


def test_a_pool_whose_terminate_hangs_is_still_stopped_within_its_limit(monkeypatch):
    """CPython's Pool.terminate() can wait for ever for a thread stuck writing a task into
    the pipe (prepare.py hung on Ctrl-C that way): stop_pool kills the workers after
    POOL_STOP_S seconds, so an interrupted prepare still ends."""
    import multiprocessing.pool
    import threading
    import time

    from gptkit.prepare import encode

    pool = make_pool(2, ("charset",))
    workers = list(pool._pool)
    assert all(w.is_alive() for w in workers)
    monkeypatch.setattr(encode, "POOL_STOP_S", 0.5)
    def hanging_terminate():  # as the real hang: respawning stopped first, then stuck for ever
        pool._worker_handler._state = multiprocessing.pool.TERMINATE
        threading.Event().wait()

    monkeypatch.setattr(pool, "terminate", hanging_terminate)
    start = time.monotonic()
    encode.stop_pool(pool)
    assert time.monotonic() - start < 5
    for w in workers:
        w.join(20)  # SIGKILL is immediate; the wait is for a loaded machine's scheduler
    assert not any(w.is_alive() for w in workers), [(w.pid, w.exitcode, w in pool._pool) for w in workers]
    # A real terminate() that hangs has already taken the pool's exit-time finalizer off the
    # registry (it is what hangs); the stand-in above never ran it, so it must not run at exit.
    pool._terminate.cancel()
