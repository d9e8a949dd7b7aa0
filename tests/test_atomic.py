"""gptkit/ops/atomic.py, the one way files are written: published whole or not at all, a
new name never replacing what appeared there after the claim (with the system's
no-replace rename and with the fallback used where that is missing), nothing left
behind by an error or a SIGTERM; and convert.py's destinations on top of it."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from gptkit.ops import atomic
from gptkit.ops.atomic import Appeared, atomic_write, publish
from gptkit.ops.errors import RunFailed
from repo import REPO
from test_paths import one_line, run, tiny_run


@pytest.fixture(params=["renameat2", "fallback"])
def primitive(request, monkeypatch):
    """Each test once with the system's RENAME_NOREPLACE and once without it (another
    system, or a file system that lacks it): hard link for files, plain rename for folders."""
    if request.param == "renameat2":
        if getattr(atomic._libc(), "renameat2", None) is None:
            pytest.skip("this C library has no renameat2")
    else:
        monkeypatch.setattr(atomic, "_rename_noreplace", lambda src, dst: False)
    return request.param


def names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_file_is_published_whole_and_replaces_only_when_asked(tmp_path, primitive):
    path = tmp_path / "f.txt"
    with atomic_write(path, replace=False) as tmp:
        tmp.write_text("one")
        assert not path.exists() and tmp.parent == tmp_path
    assert path.read_text() == "one"
    with atomic_write(path) as tmp:  # replace=True: a run's own file, rewritten on purpose
        tmp.write_text("two")
    assert path.read_text() == "two" and names(tmp_path) == ["f.txt"]


@pytest.mark.parametrize("folder", [False, True])
def test_what_appears_at_a_new_name_during_the_write_is_left_untouched(tmp_path, primitive, folder):
    dest = tmp_path / "out"
    with pytest.raises(Appeared, match="out appeared while this command was writing it"):
        with atomic_write(dest, replace=False, folder=folder) as tmp:
            (tmp / "model.bin" if folder else tmp).write_text("ours")
            if folder:
                dest.mkdir()
                (dest / "theirs.txt").write_text("theirs")
            else:
                dest.write_text("theirs")
    assert (dest / "theirs.txt" if folder else dest).read_text() == "theirs"
    assert names(tmp_path) == ["out"] and (not folder or names(dest) == ["theirs.txt"])


def test_an_empty_folder_left_by_the_claim_is_taken_but_one_with_files_is_not(tmp_path, primitive):
    dest = tmp_path / "hf"
    dest.mkdir()  # "new or empty": convert.py --to hf accepts an empty folder
    with atomic_write(dest, replace=False, folder=True) as tmp:
        (tmp / "config.json").write_text("{}")
    assert names(dest) == ["config.json"]
    with pytest.raises(Appeared):
        publish_folder_over(dest, tmp_path)
    assert names(dest) == ["config.json"]


def publish_folder_over(dest, tmp_path):
    tmp = tmp_path / "other"
    tmp.mkdir()
    (tmp / "x").write_text("x")
    publish(tmp, dest, replace=False)


def test_an_error_or_ctrl_c_in_the_block_leaves_nothing(tmp_path):
    for error in (ValueError("bad input"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with atomic_write(tmp_path / "f", replace=False) as tmp:
                tmp.write_text("half")
                raise error
    assert names(tmp_path) == []


def test_a_full_disk_is_one_runfailed_and_leaves_nothing(tmp_path):
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from gptkit.ops.atomic import atomic_write
        from gptkit.ops.errors import RunFailed
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        try:
            with atomic_write({str(tmp_path / "f")!r}, replace=False) as tmp:
                tmp.write_bytes(b"x" * 100_000)
        except RunFailed as e:
            print(e)
            sys.exit(3)
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 3 and "could not write" in result.stdout and "nothing was left behind" in result.stdout
    assert names(tmp_path) == []


def test_sigterm_while_writing_removes_the_temporary_and_exits_143(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, time
        from gptkit.ops.atomic import atomic_write
        with atomic_write({str(tmp_path / "f")!r}, replace=False) as tmp:
            tmp.write_text("half")
            print("writing", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "writing\n"
    assert len(names(tmp_path)) == 1  # the temporary
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert names(tmp_path) == []


def test_a_programs_own_sigterm_handler_is_kept(tmp_path):
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with atomic_write(tmp_path / "f") as tmp:
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            tmp.write_text("x")
            os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM] and (tmp_path / "f").read_text() == "x"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_convert_to_hf_never_replaces_a_folder_filled_meanwhile(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    import convert
    from gptkit.interop import export

    tiny_run(tmp_path / "run")
    dest = tmp_path / "hf"
    real = export.write_tokenizer

    def tokenizer_then_someone_else_writes(tokenizer, folder, block_size, turns=None):
        dest.mkdir()
        (dest / "theirs.txt").write_text("theirs")
        return real(tokenizer, folder, block_size, turns)

    monkeypatch.setattr(export, "write_tokenizer", tokenizer_then_someone_else_writes)
    with pytest.raises(Appeared):
        convert.main([str(tmp_path / "run"), str(dest), "--to", "hf"])
    assert names(dest) == ["theirs.txt"] and names(tmp_path) == ["hf", "run"]


def test_convert_to_pt_never_replaces_a_file_that_appeared(tmp_path, monkeypatch):
    from gptkit.ops import checkpoint

    dest = tmp_path / "one.pt"
    real_save = torch.save

    def save_while_another_program_creates_dest(obj, f):
        real_save(obj, f)
        dest.write_bytes(b"theirs")

    monkeypatch.setattr(checkpoint.torch, "save", save_while_another_program_creates_dest)
    with pytest.raises(Appeared):
        checkpoint.save_checkpoint({"w": torch.ones(2)}, dest, replace=False)
    assert dest.read_bytes() == b"theirs" and names(tmp_path) == ["one.pt"]


@pytest.mark.parametrize("to, name", [("hf", "hf"), ("pt", "one.pt"), ("gguf", "m.gguf")])
def test_a_missing_parent_folder_is_a_users_mistake_for_every_destination(tmp_path, to, name):
    tiny_run(tmp_path / "run")
    result = run("convert.py", str(tmp_path / "run"), str(tmp_path / "missing" / "parent" / name), "--to", to)
    err = one_line(result)
    assert "does not exist: create it first" in err
    assert names(tmp_path) == ["run"]


def test_runfailed_is_what_a_write_error_becomes(tmp_path):
    with pytest.raises(RunFailed, match="could not write"):
        with atomic_write(tmp_path / "no-such-folder" / "f") as tmp:
            tmp.write_text("x")
    assert names(tmp_path) == []


def test_a_killed_writers_temporaries_are_removed_by_the_next_write_of_that_name(tmp_path):
    # A --to gguf or --to hf killed with SIGKILL left its hidden temporary (49 MB for a small
    # GGUF), and the next export to that name succeeded and left it there for ever.
    child = textwrap.dedent(f"""
        import os
        from gptkit.ops.atomic import atomic_write
        with atomic_write({str(tmp_path / "out.gguf")!r}, replace=False) as a:
            with atomic_write({str(tmp_path / "hf")!r}, replace=False, folder=True) as b:
                a.write_bytes(b"x" * 1000)
                (b / "model.safetensors").write_bytes(b"y" * 1000)
                os._exit(137)  # as kill -9: no clean-up runs
    """)
    result = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 137, result.stderr
    assert len(names(tmp_path)) == 2 and all(".tmp-" in n for n in names(tmp_path))
    (tmp_path / ".out.gguf.tmp-1").write_text("a live writer's (pid 1 is alive)")
    (tmp_path / ".other.gguf.tmp-999999999").write_text("another name's: its own next write removes it")
    with atomic_write(tmp_path / "out.gguf", replace=False) as tmp:
        tmp.write_text("new")
    with atomic_write(tmp_path / "hf", replace=False, folder=True) as tmp:
        (tmp / "config.json").write_text("{}")
    assert names(tmp_path) == [".other.gguf.tmp-999999999", ".out.gguf.tmp-1", "hf", "out.gguf"]
    assert names(tmp_path / "hf") == ["config.json"]
