"""Chat jsonl as users' files come (gptkit/data/chat.py's reader): a byte order mark, line
separators inside messages, Windows line ends, invalid UTF-8, hostile JSON, lone
surrogates, pipes and standard input, .json files in a folder. Every line either enters
a dataset train.py accepts or is refused in one file:line line."""

import json
import random
import subprocess
import sys

import pytest
from repo import REPO

import prepare
from gptkit.data.chat import parse_line, read_messages
from gptkit.data.dataset import load_meta
from gptkit.ops.errors import UserError
from gptkit.data.tokenizer import check_description, tokenizer_from_dict


def conversation(i, reply="it is"):
    return {"messages": [{"role": "user", "content": f"what is {i}?"}, {"role": "assistant", "content": f"{reply} {i}"}]}


def line(record):
    return json.dumps(record, ensure_ascii=False)


def test_a_bom_line_separators_and_crlf_are_read_as_the_conversations_they_are(tmp_path):
    # A BOM made line 1 "not JSON" (and --errors skip dropped it); U+2028, U+2029 and U+0085
    # inside a message split it into broken lines (str.splitlines); jsonl lines end at \n only.
    odd = "a\u2028b\u2029c\u0085d\x1ce"
    records = [conversation(0), conversation(1, reply=odd), conversation(2)]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(line(r) for r in records).encode() + b"\r\n")
    for errors in ("raise", "skip"):
        got, skipped = read_messages(path, errors)
        assert [m for _, m in got] == [r["messages"] for r in records] and skipped == 0
        assert [where for where, _ in got] == [f"{path}:{n}" for n in (1, 2, 3)]


HOSTILE = [
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "not UTF-8 text (invalid continuation byte at byte 47 of the line"),
    (b"[" * 100_000, "nested too deeply"),
    (b'{"messages": [], "n": ' + b"9" * 5000 + b"}", "a number of over 4,300 digits"),
    (line(conversation(3, reply="\ud800")).encode("utf-8", "surrogatepass"), None),  # raw surrogate bytes: not UTF-8
    (json.dumps(conversation(3, reply="x\ud800")).encode(), "message 2 holds a lone surrogate U+D800 at character 1"),
    (b'{"messages": [{"role": ["user"], "content": "a"}, {"role": "assistant", "content": "b"}]}', "unknown role"),
]


@pytest.mark.parametrize("raw, words", HOSTILE, ids=["utf8", "nested", "digits", "raw-surrogate", "surrogate", "role"])
def test_hostile_lines_are_named_by_file_and_line_and_skippable(tmp_path, raw, words):
    path = tmp_path / "c.jsonl"
    path.write_bytes(line(conversation(0)).encode() + b"\n" + raw + b"\n" + line(conversation(1)).encode() + b"\n")
    with pytest.raises(UserError) as e:
        read_messages(path)
    message = str(e.value)
    assert message.startswith(f"{path}:2: ") and "\n" not in message and len(message) < 400, message
    assert words is None or words in message, message
    got, skipped = read_messages(path, "skip")
    assert len(got) == 2 and skipped == 1


def test_a_thousand_random_mutations_of_a_line_are_each_read_or_refused_in_one_line():
    # 17 of 1,000 such mutations were a traceback (RecursionError, ValueError), one entered
    # a dataset that train.py then refused (a lone surrogate).
    rng = random.Random(43)
    good = line({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2? \u00e9"},
                              {"role": "assistant", "content": "4 \U0001F600"}], "id": 12})
    pieces = ['"', "\\", "\\ud800", "\\udfff", "\\u0000", "[", "{", "]", "}", ",", ":", "1e999", "9" * 5000, "-",
              "null", "true", "\u2028", "\r", "\x00", "\ufeff", "NaN", '"role"', '"content"', '"assistant"', "[" * 3000]
    accepted = refused = 0
    for _ in range(1000):
        raw = bytearray(good.encode())
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(raw) + 1)
            op = rng.random()
            if op < 0.3:
                raw[at:at + rng.randint(1, 8)] = b""
            elif op < 0.5:
                raw[at:at] = bytes([rng.randrange(256)])
            elif op < 0.6 and at < len(raw):
                raw[at] ^= 1 << rng.randrange(8)
            else:
                raw[at:at] = rng.choice(pieces).encode("utf-8", "surrogatepass")
        raw = bytes(raw).replace(b"\n", b"")  # one line
        try:
            messages = parse_line(raw)
        except UserError as e:
            assert "\n" not in str(e) and len(str(e)) < 300, str(e)
            refused += 1
            continue
        accepted += 1
        for m in messages:  # what prepare writes, every tokenizer takes and train.py accepts
            m["content"].encode("utf-8")
        chars = sorted(set("".join(m["content"] for m in messages)))
        if chars:
            check_description({"type": "char", "chars": chars}, "the mutated line")
    assert accepted > 20 and refused > 500, (accepted, refused)


def test_what_the_reader_accepts_makes_a_dataset_train_py_accepts(tmp_path, monkeypatch):
    odd = "nul\x00 tab\t sep\u2028 emoji \U0001F600 bom\ufeff"
    records = [conversation(i, reply=odd if i % 2 else "ok") for i in range(10)]
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(line(r) + "\r\n" for r in records).encode())
    assert prepare.main(["talks", "--input", str(path), "--format", "chat", "--tokenizer", "char",
                         "--data_dir", str(tmp_path / "data"), "--quiet"]) in (0, None)
    meta = load_meta(tmp_path / "data", "talks", block_size=64)
    assert meta["chat"]["conversations"] == {"train": 9, "val": 1} and meta["chat"]["skipped"] == 0
    assert tokenizer_from_dict(meta["tokenizer"]).encode(odd)
    # a lone surrogate was accepted here, and refused by train.py afterwards
    path.write_text(line(conversation(0)) + "\n" + json.dumps(conversation(1, reply="\udc80")) + "\n")
    with pytest.raises(UserError, match=f"{path}:2: message 2 holds a lone surrogate U\\+DC80"):
        prepare.main(["other", "--input", str(path), "--format", "chat", "--tokenizer", "char",
                      "--data_dir", str(tmp_path / "data"), "--quiet"])
    assert not (tmp_path / "data" / "other").exists()


def test_standard_input_a_pipe_and_json_files_in_a_folder_are_read(tmp_path):
    # `--input -` and `<(cat file)` were refused ("not a file or folder") though the help
    # promises pipes; a folder's .json files (Hugging Face's to_json() writes jsonl under
    # that name too) were ignored without a word.
    text = "".join(line(conversation(i)) + "\n" for i in range(6))
    (tmp_path / "c.jsonl").write_text(text)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(text)
    (tmp_path / "in" / "b.json").write_text(text)
    data = tmp_path / "data"
    script = (f"set -e; {sys.executable} prepare.py a --input - --format chat --tokenizer char --data_dir {data} "
              f"--quiet < {tmp_path / 'c.jsonl'}; "
              f"{sys.executable} prepare.py b --input <(cat {tmp_path / 'c.jsonl'}) --format chat --tokenizer char "
              f"--data_dir {data} --quiet")
    r = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("a", "b"):
        assert sum(load_meta(data, name)["chat"]["conversations"].values()) == 6
    got, _ = read_messages(tmp_path / "in")
    assert len(got) == 12 and got[6][0] == f"{tmp_path / 'in' / 'b.json'}:1"
    with pytest.raises(UserError, match="names - \\(standard input\\) twice"):
        read_messages(["-", "-"])
