"""Helpers for the serve.py tests: tiny checkpoints (a chat model and a plain one, random
weights: the tests compare replies with sample.py's, never with fixed text) and a
server in a subprocess on a free loopback port."""

import dataclasses
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import torch
from repo import REPO

from gptkit.ops.checkpoint import save_checkpoint
from model import GPT, GPTConfig

CHARS = list(" .abcdefghijklmnopqrstuvwxyz")  # no newline: sample.py --chat's replies stay one line each
READY = re.compile(r"serving (\S+) .* at http://127\.0\.0\.1:(\d+)/")
START_TIMEOUT_S = 60


def write_checkpoint(path, chat=True, block_size=64, seed=0):
    """A random 2-layer char model; chat=True gives it the 4 turn tokens after the vocabulary."""
    torch.manual_seed(seed)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=block_size,
                       vocab_size=len(CHARS) + (4 if chat else 0), dropout=0.0)
    model = GPT(config)
    with torch.no_grad():  # sharper than the 0.02 init: greedy choices far from ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    save_checkpoint({"format_version": 1, "model": model.state_dict(), "model_config": dataclasses.asdict(config),
                     "tokenizer": {"type": "char", "chars": CHARS}}, path)
    return path


class Server:
    """serve.py in a subprocess, on a free port of 127.0.0.1; `url` once it is ready."""

    def __init__(self, *args, env=None, open_files=None, cwd=REPO):
        """`open_files`: the server's file-descriptor limit (ulimit -n), to test floods."""
        environment = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        environment.pop("GPT_FAULTS", None)
        environment.pop("GPTKIT_API_KEY", None)
        environment.update(env or {})
        limit = None if open_files is None else lambda: limit_files(open_files)
        self.proc = subprocess.Popen([sys.executable, str(cwd / "serve.py"), "--port=0", "--device=cpu", *args],
                                     cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=limit)
        self.lines = []
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 1.0)
            if not ready:
                continue
            line = self.proc.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            found = READY.search(line)
            if found:
                self.name, self.port = found.group(1), int(found.group(2))
                self.url = f"http://127.0.0.1:{self.port}"
                return
        self.proc.kill()
        raise AssertionError("serve.py did not start: " + "".join(self.lines) + self.proc.stderr.read())

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Send `sig`; (exit code, the rest of stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, "".join(self.lines) + err


def limit_files(n):
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def post(url, body, headers=None, raw=None, timeout=30):
    """(status, parsed JSON or text) of a POST with plain HTTP (urllib)."""
    import urllib.error
    import urllib.request

    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def get(url, headers=None, timeout=30):
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def sample_chat(ckpt, lines, *args):
    """sample.py --chat's replies, one per line of `lines`, from a pipe."""
    r = subprocess.run([sys.executable, str(REPO / "sample.py"), f"--ckpt={ckpt}", "--chat", "--device=cpu", *args],
                       cwd=REPO, input="".join(line + "\n" for line in lines), capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")[: len(lines)]
