"""Every download outside the corpora -- GPT-2's weights, the eval tasks (GSM8K's splits among them,
rl.py's too), Tiny Shakespeare --
goes through gptkit/prepare/download.py's fetch_whole. Each site, against a stand-in server on
127.0.0.1 that misbehaves on demand (tests/hub_server.py), ends in one line that names the URL and
what the server did, and leaves nothing at its destination."""

import hashlib
import re
from dataclasses import dataclass

import pytest
from hub_server import FakeHub

from gptkit.data import rl_data
from gptkit.evals import tasks
from gptkit.interop import hf_gpt2
from gptkit.ops.errors import UserError
from gptkit.prepare import download
from gptkit.prepare import shakespeare as prepare_shakespeare

BODY = bytes(range(256)) * 20  # 5,120 bytes: each site's first file


@dataclass(frozen=True)
class Site:
    name: str
    what: str  # how its errors name the file
    repo: str  # where the stand-in serves it: /datasets/REPO/resolve/main/PATH
    path: str

    def point_at(self, hub, tmp_path, monkeypatch):
        """Aim the site at `hub`, give it an empty cache, and size its cap for BODY."""
        monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("TINYSHAKESPEARE", raising=False)
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
        served = f"{hub.url}/datasets/{self.repo}/resolve/main/"
        if self.name == "gpt2":
            monkeypatch.setattr(hf_gpt2, "HUB_URL", f"{hub.url}/datasets/openai-community/{{name}}/resolve/main/{{file}}")
        elif self.name == "gsm8k":  # rl.py's GSM8K: eval.py's task file, from the Hub
            monkeypatch.setenv("HF_ENDPOINT", hub.url)
        elif self.name == "shakespeare":
            monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_URL", served + self.path)
            monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_SHA256", hashlib.sha256(BODY).hexdigest())
        self.set_cap(monkeypatch, len(BODY))

    def set_cap(self, monkeypatch, cap):
        if self.name == "gpt2":
            monkeypatch.setitem(hf_gpt2.HUB_FILE_BYTES, "config.json", cap)
        elif self.name in ("tasks", "gsm8k"):
            monkeypatch.setattr(tasks, "TASK_FILE_BYTES", cap)
        else:  # Tiny Shakespeare's cap is its known size
            monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_BYTES", cap)

    def download(self, hub, tmp_path):
        if self.name == "gpt2":
            return hf_gpt2.hub_folder("gpt2", cache_dir=tmp_path / "gpt2_cache") / "config.json"
        if self.name == "tasks":
            return tasks.resolve_file(tasks.TASKS["piqa"], hub_url=hub.url)
        if self.name == "gsm8k":
            return rl_data.gsm8k_path("test")  # what rl.py --task gsm8k calls
        return prepare_shakespeare.shakespeare_input(tmp_path / "data" / "shakespeare_char", None)

    def dest(self, tmp_path):
        return {"gpt2": tmp_path / "gpt2_cache" / "gpt2" / "config.json",
                "tasks": tmp_path / "cache" / "tasks" / "piqa" / self.path,
                "gsm8k": tmp_path / "cache" / "tasks" / "gsm8k" / self.path.rsplit("/", 1)[-1],
                "shakespeare": tmp_path / "data" / "shakespeare_char" / "input.txt"}[self.name]


SITES = [
    Site("gpt2", "gpt2", "openai-community/gpt2", "config.json"),
    Site("tasks", "PIQA", "baber/piqa", "piqa_validation.parquet"),
    Site("gsm8k", "GSM8K", "openai/gsm8k", "main/test-00000-of-00001.parquet"),
    Site("shakespeare", "Tiny Shakespeare", "karpathy/tinyshakespeare", "input.txt"),
]


@pytest.fixture(params=SITES, ids=[s.name for s in SITES])
def site(request, tmp_path, monkeypatch):
    """A site aimed at a fresh stand-in server that serves BODY (and, for GPT-2, its weights)."""
    s = request.param
    hub = FakeHub(tmp_path / "hub")
    for path in (s.path, "model.safetensors") if s.name == "gpt2" else (s.path,):
        f = hub.file(s.repo, "main", path)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(BODY)
    hub.start()
    s.point_at(hub, tmp_path, monkeypatch)
    yield s, hub
    hub.stop()


def test_each_site_downloads_through_fetch_whole(site, tmp_path):
    s, hub = site
    path = s.download(hub, tmp_path)
    assert path == s.dest(tmp_path) and path.read_bytes() == BODY
    expected = {path.name, "model.safetensors"} if s.name == "gpt2" else {path.name}
    assert {p.name for p in path.parent.iterdir()} == expected  # no temporaries left beside it


def slow(hub, path, monkeypatch):
    hub.slow = (64, 0.05)  # 1.3 KB/s
    monkeypatch.setattr(download, "READ_TIME_S", 0.2)


MISBEHAVIOURS = {  # name: (what the server does to the site's file, what the error says it did)
    "redirect to file:": (lambda hub, path, mp: setattr(hub, "redirect_to", ("/datasets/", "file:///etc/passwd")),
                          r"Redirection to url 'file:///etc/passwd' is not allowed"),  # urllib's own check
    "redirect to ftp:": (lambda hub, path, mp: setattr(hub, "redirect_to", ("/datasets/", "ftp://127.0.0.1:9/x")),
                         r"redirect from .* is 'ftp://127\.0\.0\.1:9/x', not an http\(s\) address: refused"),
    "larger than the cap": (lambda hub, path, mp: None,  # the cap is set one byte short below
                            r"it has 5,120 bytes, more than the 5,119 allowed: refused"),
    "endless body": (lambda hub, path, mp: hub.overlong.add(path),
                     r"it sent more than the 5,120 bytes allowed: refused"),
    "truncated body": (lambda hub, path, mp: hub.cut_once.update({path: 1000}),
                       r"the connection closed after 1,000 of its 5,120 bytes"),
    "5xx": (lambda hub, path, mp: hub.status_once.update({path: 503}), r"HTTP 503 Service Unavailable"),
    "redirect loop": (lambda hub, path, mp: setattr(hub, "redirect_to", ("/datasets/", f"{hub.url}/datasets/x")),
                      r"HTTP 302 .*infinite loop"),
    "compressed body": (lambda hub, path, mp: setattr(hub, "encoding", "gzip"),
                        r"Content-Encoding 'gzip', not the file's own bytes: refused"),
    "trickle": (slow, r"bytes in the last 0\.2 s: too slow"),
}


@pytest.mark.parametrize("misbehaviour", MISBEHAVIOURS)
def test_a_misbehaving_server_is_one_line_and_leaves_nothing(site, misbehaviour, tmp_path, monkeypatch):
    s, hub = site
    act, why = MISBEHAVIOURS[misbehaviour]
    act(hub, s.path, monkeypatch)
    if misbehaviour == "larger than the cap":
        s.set_cap(monkeypatch, len(BODY) - 1)
    with pytest.raises(UserError) as info:
        s.download(hub, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"could not download {s.what} from {hub.url}/datasets/{s.repo}/resolve/main/{s.path} (")
    assert re.search(why, message), message
    assert "Offline?" in message or "pass --input PATH" in message  # and what to do instead
    dest = s.dest(tmp_path)
    assert not dest.exists()
    assert not dest.parent.exists() or not any(dest.parent.iterdir())  # no temporary left


@pytest.mark.parametrize("address", ["file:///etc", "ftp://127.0.0.1:9", "data:,x", "http://"])
def test_a_mirror_that_is_not_http_is_refused(address, tmp_path, monkeypatch):
    monkeypatch.setenv("GPTKIT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(UserError, match=r"^could not download PIQA from .*not an http\(s\) address: refused"):
        tasks.resolve_file(tasks.TASKS["piqa"], hub_url=address)
    assert not any((tmp_path / "cache" / "tasks" / "piqa").iterdir())


def test_prepare_py_ends_a_refused_download_with_exit_2(tmp_path, monkeypatch, capsys):
    """What the user sees: prepare.py shakespeare_char, its download redirected to ftp:, exits 2 with
    one line, and leaves no data/ folder behind."""
    import prepare
    from gptkit.ops.errors import run_main

    hub = FakeHub(tmp_path / "hub").start()
    hub.redirect_to = ("/", "ftp://127.0.0.1:9/input.txt")
    monkeypatch.delenv("TINYSHAKESPEARE", raising=False)
    monkeypatch.setattr(prepare_shakespeare, "SHAKESPEARE_URL", f"{hub.url}/input.txt")
    try:
        with pytest.raises(SystemExit) as info:
            run_main(prepare.main, ["shakespeare_char", "--data_dir", str(tmp_path / "data"), "--quiet"])
    finally:
        hub.stop()
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: could not download"), err
    assert not (tmp_path / "data").exists()
