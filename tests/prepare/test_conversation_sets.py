"""prepare.py no_robots / smoltalk against a stand-in Hub on 127.0.0.1 (tests/hub_server.py):
the Parquet files' "messages" become a chat dataset through the corpora's downloader (its
listing, resume and checks), conversations too long for --block_size left out and counted."""

import pyarrow as pa
import pytest
from hub_server import FakeHub

import prepare
from gptkit.data.chat import read_messages
from gptkit.data.dataset import load_meta
from gptkit.ops.errors import UserError
from gptkit.prepare import download

pytestmark = pytest.mark.usefixtures("tiktoken_available")

REPO, REV, FOLDER = "HuggingFaceH4/no_robots", "main", "data"
MESSAGES = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))


def no_robots_table(conversations, split):
    """No Robots' columns and types: prompt, prompt_id, messages (a list of {content, role}), category."""
    n = len(conversations)
    return pa.table({
        "prompt": pa.array([c[0]["content"] for c in conversations], pa.string()),
        "prompt_id": pa.array([f"{split}-{i:04d}" for i in range(n)], pa.string()),
        "messages": pa.array(conversations, MESSAGES),
        "category": pa.array(["Chat"] * n, pa.string()),
    })


def conversation(i, words=3):
    return [{"content": "Be brief.", "role": "system"}, {"content": f"question {i}?", "role": "user"},
            {"content": " ".join(["answer"] * words) + f" {i}.", "role": "assistant"}]


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setattr(download, "RETRIES", 0)  # a stopped download ends the run (tests of the next run)
    hub = FakeHub(tmp_path / "hub")
    train = [conversation(i, words=300 if i == 7 else 3) for i in range(40)]  # one too long for block 128
    hub.add(REPO, REV, f"{FOLDER}/train-00000-of-00001.parquet", no_robots_table(train, "train"))
    hub.add(REPO, REV, f"{FOLDER}/test-00000-of-00001.parquet", no_robots_table([conversation(100 + i) for i in range(10)],
                                                                                 "test"))
    hub.start()
    yield hub
    hub.stop()


def run(hub, data, *args):
    return prepare.main(["no_robots", "--data_dir", str(data), "--base_url", hub.url, "--quiet", *args])


def test_a_conversation_set_downloads_by_name_into_a_chat_dataset(hub, tmp_path):
    data = tmp_path / "data"
    assert run(hub, data, "--block_size", "128") == 0
    meta = load_meta(data, "no_robots")
    assert meta["chat"]["conversations"]["train"] + meta["chat"]["conversations"]["val"] == 49
    assert meta["chat"]["skipped"] == 1 and meta["chat"]["block_size"] == 128  # the 300-word reply
    records, _ = read_messages(data / "no_robots" / "conversations.jsonl")
    # both files, in the listing's order (test, then train), every message as published
    assert [m for _, m in records][:2] == [conversation(100), conversation(101)] and len(records) == 50
    assert (data / "no_robots" / "download" / FOLDER / "train-00000-of-00001.parquet").read_bytes() == \
        hub.file(REPO, REV, f"{FOLDER}/train-00000-of-00001.parquet").read_bytes()
    assert run(hub, tmp_path / "one", "--shards", "1") == 0  # the first file only: the test split's 10
    assert load_meta(tmp_path / "one", "no_robots")["chat"]["conversations"] == {"train": 9, "val": 1}


def test_a_cut_download_resumes_and_a_damaged_file_is_refused(hub, tmp_path):
    data = tmp_path / "data"
    path = f"{FOLDER}/train-00000-of-00001.parquet"
    hub.cut_once[path] = 500
    with pytest.raises(UserError):
        run(hub, data)
    hub.requests.clear()
    assert run(hub, data) == 0
    assert [r for p, r in hub.requests if p.endswith(path)] == ["bytes=500-"]  # went on where it stopped
    hub.corrupt.add(f"{FOLDER}/test-00000-of-00001.parquet")
    with pytest.raises(UserError) as e:
        run(hub, tmp_path / "other")
    assert "sha256" in str(e.value) and "\n" not in str(e.value)


def test_settings_that_do_not_go_with_a_conversation_set_are_one_line(hub, tmp_path):
    for args in (["--sample", "10BT"], ["--input", str(tmp_path)], ["--errors", "skip"]):
        with pytest.raises(UserError) as e:
            run(hub, tmp_path / "data", *args)
        assert "downloaded whole" in str(e.value)
    with pytest.raises(UserError, match="--block_size goes with --format chat or a conversation set"):
        prepare.main(["shakespeare_char", "--block_size", "8", "--data_dir", str(tmp_path)])
