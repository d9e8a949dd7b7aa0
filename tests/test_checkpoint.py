"""checkpoint.py keeps the promises of docs/reliability.md: a checkpoint on disk is always
complete, a damaged one is named, and nothing executes when one is loaded."""

import ast
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from gptkit.ops import checkpoint
from gptkit.ops.checkpoint import load_checkpoint, save_checkpoint
from gptkit.ops.errors import UserError
from repo import REPO



def sample_checkpoint(seed=0, n=256):
    g = torch.Generator().manual_seed(seed)
    return {
        "format_version": checkpoint.FORMAT_VERSION,
        "model": {"wte.weight": torch.randn(n, 8, generator=g), "ln_f.bias": torch.zeros(8)},
        "iter_num": 7 + seed,
        "best_val_loss": 1.25,
        "config": {"n_layer": 2, "out_dir": "out", "dropout": 0.1, "top_k": None},
        "tokenizer": {"type": "char", "chars": list("ab\n")},
        "rng": {"torch": torch.get_rng_state(), "python_seed": 1234},
    }


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same(a[key], b[key])
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def run_python(code, env_extra=None, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("GPT_FAULTS", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=timeout,
    )


def test_round_trip_and_no_temp_file_left(tmp_path):
    obj = sample_checkpoint()
    path = tmp_path / "sub" / "ckpt.pt"
    save_checkpoint(obj, path)
    assert_same(load_checkpoint(path), obj)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.pt"]
    newer = sample_checkpoint(seed=1)
    save_checkpoint(newer, path)
    assert_same(load_checkpoint(path), newer)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt.pt"]


def test_kill_during_write_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "ckpt.pt"
    old = sample_checkpoint(seed=0)
    save_checkpoint(old, path)
    old_bytes = path.read_bytes()
    result = run_python(
        f"""
        import torch
        from gptkit.ops.checkpoint import save_checkpoint
        save_checkpoint({{"model": {{"w": torch.ones(200_000)}}, "iter_num": 99}}, {str(path)!r})
        print("the save returned: the fault did not fire")
        """,
        env_extra={"GPT_FAULTS": "exit_during_save"},
    )
    assert result.returncode == 137, (result.stdout, result.stderr)  # os._exit, as kill -9 leaves it
    assert "did not fire" not in result.stdout
    assert path.read_bytes() == old_bytes
    assert_same(load_checkpoint(path), old)
    # The dead writer's temp file is still there, under a name nothing mistakes for a checkpoint.
    stale = [p for p in tmp_path.iterdir() if p.name != "ckpt.pt"]
    assert len(stale) == 1 and checkpoint.TEMP_MARK in stale[0].name
    assert stale[0].name.startswith(".") and not stale[0].name.endswith(".pt")
    assert list(tmp_path.glob("*.pt")) == [path]
    # A later save still works and what is loaded is the new file, not the stale one.
    newer = sample_checkpoint(seed=2)
    save_checkpoint(newer, path)
    assert_same(load_checkpoint(path), newer)


def test_disk_full_is_a_clear_error_and_the_previous_checkpoint_survives(tmp_path):
    path = tmp_path / "ckpt.pt"
    old = sample_checkpoint()
    save_checkpoint(old, path)
    old_bytes = path.read_bytes()
    result = run_python(
        f"""
        import resource, signal, sys
        import torch
        from gptkit.ops.checkpoint import save_checkpoint
        from gptkit.ops.errors import RunFailed
        big = {{"model": {{"w": torch.ones(1_000_000)}}}}  # 4 MB
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
        try:
            save_checkpoint(big, {str(path)!r})
        except RunFailed as e:
            print("RunFailed:", e)
            sys.exit(3)
        print("saved?!")
        """
    )
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert f"could not write checkpoint {path}" in result.stdout
    assert "previous checkpoint is intact" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]  # temp file removed
    assert path.read_bytes() == old_bytes
    assert_same(load_checkpoint(path), old)


def test_missing_and_empty_files_are_named(tmp_path):
    with pytest.raises(UserError, match=f"checkpoint {tmp_path / 'none.pt'} does not exist"):
        load_checkpoint(tmp_path / "none.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(UserError, match=f"checkpoint {tmp_path / 'empty.pt'} is empty"):
        load_checkpoint(tmp_path / "empty.pt")


@pytest.mark.parametrize(
    "content",
    [
        b"version https://git-lfs.github.com/spec/v1\noid sha256:0123abcd\nsize 497774592\n",
        b"<html><body>404 Not Found</body></html>",
        bytes(100),
        b"PK\x03\x04" + bytes(60),  # starts like a zip, is not one
    ],
)
def test_foreign_files_are_named(tmp_path, content):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(content)
    with pytest.raises(UserError) as e:
        load_checkpoint(path)
    assert str(path) in str(e.value)


def test_a_text_file_is_named_not_a_traceback(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("these are not weights\n")
    with pytest.raises(UserError, match="notes.pt"):
        load_checkpoint(path)


def test_a_folder_is_named(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_checkpoint(tmp_path)


def test_truncated_files_are_named(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(sample_checkpoint(), path)
    data = path.read_bytes()
    for cut in (1, 64, len(data) // 3, len(data) // 2, len(data) - 100, len(data) - 1):
        bad = tmp_path / f"cut{cut}.pt"
        bad.write_bytes(data[:cut])
        with pytest.raises(UserError) as e:
            load_checkpoint(bad)
        assert str(bad) in str(e.value), cut


def test_byte_flips_in_the_archive_structure_are_named(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(sample_checkpoint(), path)
    data = path.read_bytes()
    # the zip signature, and the end-of-central-directory signature 22 bytes from the end
    for pos in (0, 1, 2, len(data) - 22, len(data) - 21):
        bad = tmp_path / f"flip{pos}.pt"
        flipped = bytearray(data)
        flipped[pos] ^= 0xFF
        bad.write_bytes(flipped)
        with pytest.raises(UserError) as e:
            load_checkpoint(bad)
        assert str(bad) in str(e.value), pos


@pytest.fixture(scope="module")
def flip_scan(tmp_path_factory):
    """Flip every 3rd byte of a small checkpoint, one at a time, and sort what load does."""
    folder = tmp_path_factory.mktemp("flips")
    obj = {"model": {"w": torch.arange(64, dtype=torch.float32)}, "iter_num": 5,
           "config": {"n_layer": 2, "name": "x"}}
    save_checkpoint(obj, folder / "ckpt.pt")
    data = (folder / "ckpt.pt").read_bytes()
    outcome = {"same": [], "user_error": [], "different": [], "other": []}
    bad = folder / "bad.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about odd pickle protocols in damaged files
        for pos in range(0, len(data), 3):
            flipped = bytearray(data)
            flipped[pos] ^= 0xFF
            bad.write_bytes(flipped)
            try:
                back = load_checkpoint(bad)
            except UserError:
                outcome["user_error"].append(pos)
            except Exception as e:  # noqa: BLE001 - the point is to catch anything that escapes
                outcome["other"].append((pos, f"{type(e).__name__}: {e}"))
            else:
                ok = (isinstance(back, dict) and back.keys() == obj.keys()
                      and torch.equal(back["model"]["w"], obj["model"]["w"])
                      and back["iter_num"] == 5 and back["config"] == obj["config"])
                outcome["same" if ok else "different"].append(pos)
    assert len(outcome["user_error"]) > 100  # the scan did exercise the error path
    return outcome


def test_no_byte_flip_escapes_as_a_traceback(flip_scan):
    assert flip_scan["other"] == []


def test_no_byte_flip_loads_silently_changed_values(flip_scan):
    assert flip_scan["different"] == []


def test_flipped_tensor_byte_is_detected(tmp_path):
    path = tmp_path / "ckpt.pt"
    obj = {"model": {"w": torch.arange(64, dtype=torch.float32)}}
    save_checkpoint(obj, path)
    data = bytearray(path.read_bytes())
    pos = bytes(data).find(obj["model"]["w"].numpy().tobytes())
    assert pos > 0
    data[pos + 41] ^= 0x01
    path.write_bytes(data)
    with pytest.raises(UserError, match="checksum") as e:
        load_checkpoint(path)
    assert str(path) in str(e.value)


# ---- nothing executes from a checkpoint ---------------------------------------------


class Payload:
    """Unpickling this runs `exec` on a string: the classic malicious pickle."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def test_a_checkpoint_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.ones(2)}, "extra": Payload(marker)}, path)
    # Control: an unrestricted load really would run the payload.
    torch.load(path, weights_only=False)
    assert marker.read_text() == "code ran"
    marker.unlink()
    with pytest.raises(UserError) as e:
        load_checkpoint(path)
    assert f"refusing to load {path}" in str(e.value)
    assert not marker.exists()


# ---- no unrestricted unpickling anywhere in the project -----------------------------


def project_python_files():
    skip = {"tests", "__pycache__", "site-packages", "venv", "node_modules"}
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if any(p in skip or p.startswith(".") for p in parts[:-1]):
            continue
        yield path


def _name(node):
    """'pickle.load' for the expression pickle.load, 'load' for load; '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    return ""


def _is_restricted_unpickler(cls):
    bases = {_name(b) for b in cls.bases}
    methods = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
    return bool(bases & {"pickle.Unpickler", "Unpickler"}) and "find_class" in methods


def unsafe_loads(tree):
    """(line, what) for each unrestricted unpickling call outside a restricted Unpickler."""
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and _is_restricted_unpickler(node):
            allowed |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "_pickle", "dill", "cloudpickle"):
            for alias in node.names:
                if alias.name in ("load", "loads"):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        keywords = {k.arg: k.value for k in node.keywords}
        if name in ("pickle.load", "pickle.loads", "pickle.Unpickler", "dill.load", "dill.loads",
                    "cloudpickle.load", "cloudpickle.loads", "marshal.loads"):
            found.append((node.lineno, name))
        elif name == "torch.load":
            flag = keywords.get("weights_only")
            if not (isinstance(flag, ast.Constant) and flag.value is True):
                found.append((node.lineno, "torch.load without weights_only=True"))
        elif name in ("np.load", "numpy.load"):
            flag = keywords.get("allow_pickle")
            if isinstance(flag, ast.Constant) and flag.value is True:
                found.append((node.lineno, f"{name}(allow_pickle=True)"))
    return found


def test_the_scanner_catches_what_it_should():
    code = textwrap.dedent("""
        import pickle, torch
        from pickle import loads
        a = pickle.load(f)
        b = pickle.loads(data)
        c = torch.load(p)
        d = torch.load(p, weights_only=False)
        e = pickle.Unpickler(f).load()
        ok = torch.load(p, weights_only=True)
        class Safe(pickle.Unpickler):
            def find_class(self, module, name):
                raise pickle.UnpicklingError(name)
            def read(self, f):
                return pickle.loads(f.read())
        fine = Safe(f).load()
    """)
    lines = [line for line, _ in unsafe_loads(ast.parse(code))]
    assert sorted(lines) == [3, 4, 5, 6, 7, 8]


def test_no_unrestricted_unpickling_in_the_project():
    files = list(project_python_files())
    assert REPO / "gptkit" / "ops" / "checkpoint.py" in files
    problems = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        problems += [f"{path.relative_to(REPO)}:{line}: {what}" for line, what in unsafe_loads(tree)]
    assert problems == [], "\n".join(problems)


def test_no_pickle_load_text_outside_restricted_unpicklers():
    """The grep-style check, for what the AST scan cannot see (e.g. code built in strings)."""
    needles = ("pickle.load(", "pickle.loads(")
    problems = []
    for path in project_python_files():
        text = path.read_text(encoding="utf-8")
        if not any(n in text for n in needles):
            continue
        tree = ast.parse(text)
        restricted = [
            (node.lineno, node.end_lineno)
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and _is_restricted_unpickler(node)
        ]
        for number, line in enumerate(text.splitlines(), start=1):
            if any(n in line for n in needles) and not any(a <= number <= b for a, b in restricted):
                problems.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert problems == [], "\n".join(problems)
