"""The root commands before their main runs: a missing requirement is one line naming it
(exit 2) and a Ctrl-C while the imports load is "interrupted" (exit 130), never a
traceback (gptkit/ops/errors.py: quiet_start, run_main)."""

import os
import subprocess
import sys

import pytest
from repo import REPO

COMMANDS = ["prepare.py", "train.py", "sample.py", "eval.py", "convert.py", "lab.py", "bench.py", "serve.py"]
NEEDS_TORCH_FOR_HELP = {"train.py", "sample.py", "eval.py", "lab.py", "bench.py", "serve.py"}


def with_fake_torch(tmp_path, body, *args):
    """A command run with a torch.py first on the path whose import runs `body`."""
    (tmp_path / "torch.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_without_torch_is_help_or_one_line_naming_it(tmp_path, command):
    # bench.py --help (and train.py, sample.py, eval.py, lab.py) without torch was a traceback.
    r = with_fake_torch(tmp_path, "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n",
                        command, "--help")
    assert "Traceback" not in r.stderr, r.stderr
    if command in NEEDS_TORCH_FOR_HELP:
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"error: {command} needs torch, which cannot be imported here (No module named")
        assert "pip install -r requirements.txt" in r.stderr
    else:
        assert r.returncode == 0 and "usage" in r.stdout


def test_ctrl_c_while_the_imports_load_is_one_line_exit_130(tmp_path):
    # It printed a 25-line KeyboardInterrupt traceback (sample.py --chat from a pipe, at start-up).
    body = "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n"
    for command in ("sample.py", "train.py", "serve.py"):
        r = with_fake_torch(tmp_path, body, command, "--chat")
        assert (r.returncode, r.stderr) == (130, "interrupted\n"), (command, r.stderr)


@pytest.mark.parametrize("package", ["starlette", "uvicorn"])
def test_serve_without_its_web_packages_is_one_line_naming_them(tmp_path, package):
    # A missing starlette was a traceback from serve.py's main.
    (tmp_path / f"{package}.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{package}'\", name='{package}')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    r = subprocess.run([sys.executable, "serve.py", "--out_dir", str(tmp_path / "none")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: serve.py needs {package}, which cannot be imported here (No module named")
    assert "pip install -r requirements.txt" in r.stderr
