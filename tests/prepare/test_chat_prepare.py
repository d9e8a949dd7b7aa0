"""prepare.py --format chat: whole conversations per split, a target mask beside each bin,
meta.json naming the template, and bad lines named by file:line with nothing written."""

import json
import subprocess
import sys

import numpy as np
import pytest
from repo import REPO

from gptkit.data.chat import encode_conversation, turn_ids
from gptkit.data.dataset import load_meta
from gptkit.data.tokenizer import GPT2_VOCAB_SIZE, tokenizer_from_dict


def conversation(i):
    return {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"what is {i}?"},
                         {"role": "assistant", "content": f"it is {i}"}]}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def prepare(*args):
    return subprocess.run([sys.executable, str(REPO / "prepare.py"), *args, "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("tokenizer", ["char", "gpt2", "bpe"])
def test_bins_and_masks_hold_whole_conversations_of_the_template(tmp_path, tokenizer, request):
    if tokenizer == "gpt2":
        request.getfixturevalue("tiktoken_available")
    records = [conversation(i) for i in range(20)]
    path = write_jsonl(tmp_path / "c.jsonl", records)
    extra = ["--vocab_size", "270"] if tokenizer == "bpe" else []
    r = prepare("talks", "--input", str(path), "--format", "chat", "--tokenizer", tokenizer,
                "--data_dir", str(tmp_path / "data"), *extra)
    assert r.returncode == 0, r.stderr
    meta = load_meta(tmp_path / "data", "talks")
    tok = tokenizer_from_dict(meta["tokenizer"])
    base = tok.vocab_size
    assert meta["vocab_size"] == base + 4 and meta["chat"]["turn_ids"] == turn_ids(base)
    if tokenizer == "gpt2":
        assert turn_ids(base)["<|system|>"] == GPT2_VOCAB_SIZE
    assert meta["chat"]["template"] == "gptkit-chat-1" and meta["chat"]["conversations"] == {"train": 18, "val": 2}
    folder = tmp_path / "data" / "talks"
    seen = []
    for split in ("train", "val"):
        ids = np.fromfile(folder / f"{split}.bin", dtype=meta["dtype"]).tolist()
        mask = np.fromfile(folder / f"{split}_mask.bin", dtype=np.uint8).tolist()
        starts = [i for i, m in enumerate(mask) if m == 2] + [len(ids)]
        for a, b in zip(starts, starts[1:]):  # each conversation, whole, as the template encodes it
            i = next(i for i in range(20) if encode_conversation(records[i]["messages"], tok.encode, base)[0] == ids[a:b])
            want_ids, want_mask = encode_conversation(records[i]["messages"], tok.encode, base)
            assert [2, *want_mask[1:]] == mask[a:b]
            seen.append((split, i))
    assert sorted(i for _, i in seen) == list(range(20))  # every conversation once, none cut between splits
    assert [i for s, i in seen if s == "val"] == [5, 15]  # evenly spaced


@pytest.mark.parametrize(
    "line, words",
    [
        ("{oops", "not JSON"),
        ('{"text": "hi"}', 'no "messages"'),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}), "unknown role 'robot'"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}]}), "empty assistant"),
        (json.dumps({"messages": [{"role": "user", "content": "x" * 200}, {"role": "assistant", "content": "y"}]}), "longer than block_size"),
    ],
)
def test_a_bad_line_is_one_line_exit_2_nothing_written_or_skipped_and_counted(tmp_path, line, words):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join([json.dumps(conversation(i)) for i in range(3)] + [line, json.dumps(conversation(9))]) + "\n")
    data = tmp_path / "data"
    r = prepare("talks", "--input", str(path), "--format", "chat", "--tokenizer", "char", "--data_dir", str(data),
                "--block_size", "64")
    assert r.returncode == 2 and r.stderr.startswith(f"error: {path}:4: ") and words in r.stderr
    assert r.stderr.count("\n") == 1 and not data.exists()
    r = prepare("talks", "--input", str(path), "--format", "chat", "--tokenizer", "char", "--data_dir", str(data),
                "--block_size", "64", "--errors", "skip")
    assert r.returncode == 0, r.stderr
    meta = load_meta(data, "talks")
    assert meta["chat"]["skipped"] == 1 and sum(meta["chat"]["conversations"].values()) == 4


def test_a_folder_of_jsonl_files_is_read_in_order(tmp_path):
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "b.jsonl", [conversation(i) for i in range(5, 10)])
    write_jsonl(tmp_path / "in" / "a.jsonl", [conversation(i) for i in range(5)])
    r = prepare("talks", "--input", str(tmp_path / "in"), "--format", "chat", "--tokenizer", "char",
                "--data_dir", str(tmp_path / "data"))
    assert r.returncode == 0, r.stderr
    assert load_meta(tmp_path / "data", "talks")["chat"]["conversations"] == {"train": 9, "val": 1}


def test_arithmetic_chat_holds_out_its_val_sums_from_training(tmp_path):
    from gptkit.prepare.arithmetic import arithmetic_conversations
    from gptkit.prepare.chat import split_conversations
    from gptkit.prepare.named import prepare_named

    conversations = arithmetic_conversations(2000)
    val = split_conversations(2000, 0.1)
    questions = [{m["content"] for m in c["messages"] if m["role"] == "user"} for c in conversations]
    held = set().union(*(questions[i] for i in val))
    seen = set().union(*(q for i, q in enumerate(questions) if i not in val))
    assert held and not held & seen
    for c in conversations:
        for q, a in zip(c["messages"][::2], c["messages"][1::2]):
            x, y = q["content"].removeprefix("What is ").removesuffix("?").split("+")
            assert a["content"] == str(int(x) + int(y))
    prepare_named("arithmetic_chat", tmp_path / "data", progress=False)
    meta = load_meta(tmp_path / "data", "arithmetic_chat")
    assert meta["chat"]["conversations"] == {"train": 18_000, "val": 2_000}


def test_a_damaged_or_missing_mask_is_named(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [conversation(i) for i in range(10)])
    r = prepare("talks", "--input", str(path), "--format", "chat", "--tokenizer", "char", "--data_dir", str(tmp_path / "data"))
    assert r.returncode == 0, r.stderr
    mask = tmp_path / "data" / "talks" / "val_mask.bin"
    data = bytearray(mask.read_bytes())
    data[3] = 7
    mask.write_bytes(bytes(data))
    with pytest.raises(Exception, match="val_mask.bin is not a target mask"):
        load_meta(tmp_path / "data", "talks")
    mask.unlink()
    with pytest.raises(Exception, match="val_mask.bin is missing: run python prepare.py talks --input FILE --format chat"):
        load_meta(tmp_path / "data", "talks")
